"""The trainer's side of a launch: the run folder, the command line, the run's summary.

`prepare_run` makes the run folder (`$TRAINOPS_HOME/runs/RUN/` with config.toml) for any
scheduler; `trainer_program` and `torchrun_argv` are the one command line every scheduler runs;
`summarize` writes status.json when a run ends. Launching and following a run is the tools'
(trainops.tools.jobs.follow, through the `submit_job` tool), and so is stopping its processes.
"""
from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from trainops.record_keys import RECORD_KEY_ENV, run_key
from trainops.run_folder import RunFiles, new_run_folder, this_launch
from trainops.run_records import RunResult, read_journal, read_metrics
from trainops.trainer.checkpoint_files import COMMIT_FILE, list_checkpoints, verify_checkpoint
from trainops.trainer.config import ConfigError, JobConfig, ResilienceConfig, load_config
from trainops.trainer.layout import validate_layout
from trainops.workspace import run_folder, runs_dir


def failure_reason(run_dir: str | Path, exit_code: int) -> str | None:
    """The `rank R failed: ...` line a rank logged in this launch, else what the exit code says."""
    if exit_code == 0:
        return None
    for log in sorted((Path(run_dir) / "logs").glob("rank*.log")):
        for line in this_launch(log.read_text(errors="replace")).splitlines():
            if line.startswith("rank ") and " failed: " in line:
                return line.strip()
    if exit_code < 0:
        return (f"torchrun was killed by signal {-exit_code}; its own output is in the job's log "
                "(trainops tool call job_logs)")
    return f"a rank exited with an error (torchrun exit code {exit_code}); see {run_dir}/logs/"


def prepare_run(cfg: JobConfig | str | Path | None = None, preset: str | None = None,
                overrides: list[str] | None = None, *, run_id: str | None = None) -> Path:
    """Create `runs/RUN/` with config.toml (trainops.run_folder.new_run_folder). `cfg` is a JobConfig,
    or a TOML path (or None) that is loaded with `preset` and `overrides`."""
    if not isinstance(cfg, JobConfig):
        cfg = load_config(cfg, preset, overrides)
    return new_run_folder(cfg.to_toml(), run_id=run_id)


WARM_LAUNCHER = "trainops.trainer.warm_launch"
"""torchrun for the embedded trainer with torch imported once per node, its ranks forked from it."""
RANK_NAME = "trainops-r{rank}"
"""The kernel name (comm, at most 15 bytes) a forked rank gives itself: its /proc/PID/environ is the
launcher's and names no RANK."""


def rank_in_name(name: str) -> int | None:
    """The global rank a forked rank's kernel name (RANK_NAME) holds, or None for any other name."""
    prefix = RANK_NAME.format(rank="")
    rest = name.removeprefix(prefix)
    return int(rest) if name.startswith(prefix) and rest.isdigit() else None


def torchrun_argv(python: str, nproc_per_node: int, program: list[str], *, nnodes: int | str = 1,
                  rdzv_endpoint: str | None = None, rdzv_id: str | None = None, runs_here: bool = True) -> list[str]:
    """The one torchrun command line trainops launches, whichever scheduler runs it: standalone on one
    node, c10d rendezvous at `rdzv_endpoint` (host:port of the first node) across nodes. `nnodes`
    may be a shell variable such as "$SLURM_NNODES" for a batch script to expand. A trainer run on
    one node to which `resilience.in_process_restart` applies gets trainops' supervisor in torchrun's
    place (`in_process_argv`); `runs_here`: this host runs it (a pod's manifest is written elsewhere)."""
    if (supervised := in_process_argv(python, nproc_per_node, program, nnodes, runs_here)) is not None:
        return supervised
    launcher = WARM_LAUNCHER if program[:2] == trainer_program("")[:2] else "torch.distributed.run"
    argv = [python, "-m", launcher, "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node)]
    if rdzv_endpoint is None:
        if str(nnodes) != "1":
            raise ValueError(f"nnodes={nnodes} needs rdzv_endpoint (host:port of the first node)")
        argv.append("--standalone")
    else:
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id or "trainops"]
    return argv + list(program)


def in_process_argv(python: str, nproc_per_node: int, program: list[str], nnodes: int | str,
                    runs_here: bool = True) -> list[str] | None:
    """The supervisor's command line (trainops.trainer.supervisor: ranks plus warm spares that
    survive a lost rank) for a launch on one node to which in-process restart applies
    (`supervised_resilience`); None elsewhere (torchrun). Across nodes a batch script runs one
    supervisor per node (`supervisor_argv`, tools/schedulers/slurm.py)."""
    if str(nnodes) != "1":
        return None
    if (resilience := supervised_resilience(program, nproc_per_node, local_gpus() if runs_here else None)) is None:
        return None
    return supervisor_argv(python, nproc_per_node, program, resilience)


def supervised_resilience(program: list[str], ranks: int, gpus_here: int | None) -> ResilienceConfig | None:
    """The run's [resilience] when `program` is the embedded trainer and in-process restart applies
    to a launch of `ranks` ranks (ResilienceConfig.in_process); None otherwise (torchrun runs it)."""
    if program[:3] != ["-m", "trainops.trainer.train", "--run-dir"]:
        return None
    try:
        resilience = load_config(RunFiles(program[3]).config).resilience
    except ConfigError:
        return None
    return resilience if resilience.in_process(ranks, gpus_here)[0] else None


def local_gpus() -> int:
    """This host's NVIDIA GPUs that the job may use, from the device nodes and CUDA_VISIBLE_DEVICES:
    a launch decides without importing torch."""
    devices = len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return devices
    chosen = [v for v in visible.split(",") if v.strip()]
    return min(devices, len(chosen)) if "-1" not in chosen else 0


SUPERVISOR = "trainops.trainer.supervisor"


def record_key_env(argv: list[str]) -> dict[str, str]:
    """The environment that hands the supervisor trainops built `argv` for (`supervisor_argv`) the key
    of the run folder it writes (its --run-dir; trainops/record_keys.py), made here at launch; {} for
    any other command: a job launched without the supervisor holds no key."""
    if argv[1:3] != ["-m", SUPERVISOR] or "--run-dir" not in argv[:argv.index("--") if "--" in argv else None]:
        return {}
    key = run_key(argv[argv.index("--run-dir") + 1], create=True)
    return {RECORD_KEY_ENV: key.hex()} if key else {}


def supervisor_argv(python: str, nproc_per_node: int, program: list[str], resilience: ResilienceConfig, *,
                    nnodes: int = 1, node_index: str = "0", store: str | None = None) -> list[str]:
    """One node's supervisor: node 0 leads (holds the store at `store`, HOST:PORT), every other
    node's is its agent; `node_index` may be a shell variable a batch script expands."""
    run_dir = program[3]
    argv = [python, "-m", SUPERVISOR, "--nproc-per-node", str(nproc_per_node),
            "--warm-spares", str(resilience.warm_spares),
            "--collective-timeout-s", f"{resilience.collective_timeout_s:g}",
            "--restore-timeout-s", f"{resilience.restore_timeout_s:g}"]
    if store is not None:
        argv += ["--nnodes", str(nnodes), "--spare-nodes", str(resilience.spare_nodes), "--node-index", node_index,
                 "--store", store]
    return argv + ["--run-dir", run_dir, "--", "-m", "trainops.trainer.inprocess", "--run-dir", run_dir]


def trainer_program(run_dir: str | Path) -> list[str]:
    """What torchrun runs for the embedded trainer."""
    return ["-m", "trainops.trainer.train", "--run-dir", str(run_dir)]


def summarize(run_dir: str | Path, exit_code: int) -> RunResult:
    """The run's outcome from its metrics; also written to status.json."""
    records = read_metrics(run_dir)
    rank0 = [r for r in records if r.rank == 0]
    last = max(reversed(rank0), key=lambda r: r.step) if rank0 else None  # newest on a tie (resumed)
    mfus = [(r.step, r.mfu_pct) for r in records if r.mfu_pct is not None]
    steady = [mfu for step, mfu in mfus if step > 1] or [mfu for _, mfu in mfus]
    result = RunResult(
        run_dir=str(run_dir), status="ok" if exit_code == 0 else "failed", exit_code=exit_code,
        final_loss=last.loss if last else None,
        mfu_pct=sum(steady) / len(steady) if steady else None,
        steps_completed=last.step if last else 0,
        peak_source=last.peak_source if last else None,
        failure=failure_reason(run_dir, exit_code),
    )
    partial = Path(run_dir) / "status.json.partial"
    partial.write_text(result.model_dump_json(indent=1))
    partial.replace(RunFiles(run_dir).status)  # readers never see half a file
    return result


# What a resumed run must keep: the checkpoint holds this model and this data position.
# Layout changes (parallel.*, the process count) are allowed: DCP reshards on load.
RESUME_FIXED = ("model.", "data.", "training.seed", "training.seq_len", "training.global_batch",
                "checkpoint.enable", "checkpoint.folder")


class ResumePlan(BaseModel):
    run_dir: str = Field(description="the run folder being continued")
    checkpoint: str = Field(description="its newest verified checkpoint, which the relaunch loads")
    step: int = Field(description="the step that checkpoint was saved after")
    saved_world_size: int = Field(description="ranks that saved it (DCP reshards to another count)")
    nproc: int = Field(description="ranks the relaunch uses")
    changed: dict[str, Any] = Field(default_factory=dict, description="config values the overrides changed")


def resolve_run(run: str | Path, field: str = "run") -> Path:
    """A trainer run's folder: a run id under `$TRAINOPS_HOME/runs` or a run folder path, confined
    to the workspace (trainops.workspace.run_folder), that holds config.toml."""
    run_dir = run_folder(str(run), field)
    if not RunFiles(run_dir).config.is_file():
        raise ValueError(f"{field}: run {str(run)!r} has no config.toml in {run_dir}, so it is not a trainer run; "
                         f"give a run id from {runs_dir()} or the folder `trainops train` printed")
    return run_dir


def newest_verified_checkpoint(run_dir: Path, cfg: JobConfig):
    """(path, step, world size) of the newest checkpoint whose files match COMMIT.json, as the
    trainer chooses on relaunch; None when there is none."""
    for info in reversed(list_checkpoints(run_dir / cfg.checkpoint.folder)):
        if info.committed and verify_checkpoint(info.path).complete:
            commit = json.loads((Path(info.path) / COMMIT_FILE).read_text())
            return Path(info.path), info.step, int(commit["world_size"])
    return None


def prepare_resume(run: str | Path, overrides: list[str], nproc: int | None, *, write: bool = True) -> ResumePlan:
    """Check that `run` can continue with `overrides` on `nproc` ranks (default: as many as saved
    its checkpoint) and, when `write`, record the changed config. Overrides that would change the
    model, the data or its position are refused by name."""
    run_dir = resolve_run(run)
    for override in overrides:
        key = override.partition("=")[0].strip()
        if key.startswith(RESUME_FIXED):
            raise ConfigError(f"--set {override} would change {key} of run {run_dir.name}, which its checkpoints "
                              f"were trained with; a resume keeps {', '.join(RESUME_FIXED)}: drop it, or start a "
                              "new run (export this one with `trainops export` and pass --init-from)")
    before = load_config(RunFiles(run_dir).config)
    cfg = load_config(RunFiles(run_dir).config, None, overrides)
    if not cfg.checkpoint.enable:
        raise ConfigError(f"run {run_dir.name} has checkpoint.enable=false: it saved nothing to resume from; "
                          "start a new run with --set checkpoint.enable=true")
    newest = newest_verified_checkpoint(run_dir, cfg)
    if newest is None:
        raise ConfigError(f"run {run_dir.name} has no verified checkpoint in {run_dir / cfg.checkpoint.folder}: "
                          "nothing to resume from; start a new run")
    path, step, saved_world_size = newest
    nproc = nproc or saved_world_size
    validate_layout(cfg, nproc)
    old, new = before.model_dump(), cfg.model_dump()
    changed = {f"{section}.{key}": value for section, values in new.items() for key, value in values.items()
               if old[section][key] != value}
    if write and changed:
        RunFiles(run_dir).config.write_text(cfg.to_toml())
    return ResumePlan(run_dir=str(run_dir), checkpoint=str(path), step=step, saved_world_size=saved_world_size,
                      nproc=nproc, changed=changed)


def loaded_checkpoint(run_dir: str | Path, since: float) -> str | None:
    """The checkpoint the trainer logged loading at or after `since` (unix s), from checkpoints.jsonl."""
    return next((load.path for load in reversed(read_journal(run_dir).loads) if load.time >= since), None)

