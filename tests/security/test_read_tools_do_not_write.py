"""Risk classes are checked, not declared (issue 13 item 2): every tool classed `read` runs here
with valid small inputs, and the files under the workspace, the current folder and the temporary
folder are compared before and after. A read tool may write only inside a temporary folder it
removes again; the agent calls read tools without a human, so one that writes is mis-classed.

What the gate itself writes for every call (the audit log) and the workspace's own layout (its
folders, made on first use) are not the tool's doing and are allowed, by name below."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from trainops.agents.agent_tools import agent_registry
from trainops.skills.sdc import SdcCase, write_case
from trainops.tools.base import tool
from trainops.tools.calls import call
from trainops.tools.catalog import build_registry
from trainops.tools.context import CallContext
from trainops.trainer.checkpoint_files import COMMIT_FILE, step_dir_name

RUN = "r1"
OTHER_RUN = "r2"
ALLOWED_IN_WORKSPACE = {
    "audit.jsonl": "the gate's record of the call (R-SEC-5), not the tool's",
    "audit.jsonl.head": "the audit log's head",
    "audit.jsonl.lock": "the audit log's writer lock",
    "cache/peak_flops.json": "the measured CPU GEMM peak, memoised: the same number the trainer's MFU uses",
}


def read_inputs(job_id: str) -> dict[str, dict]:
    """A valid, small input for every read tool. A new read tool without one fails the coverage test."""
    return {
        "ablation_design": {"runs": [RUN, OTHER_RUN]},
        "check_framework_job": {"framework": "deepspeed", "knobs": {}, "world_size": 2},
        "compare_runs": {"baseline": RUN, "candidate": OTHER_RUN},
        "declare_environment": {"ckpt_test_mib": 1},
        "detect_faults": {"run": RUN, "timeout_s": 0.2, "poll_interval_s": 0.05},
        "effective_training_time": {"window_s": 600},
        "find_straggler": {"run": OTHER_RUN},
        "framework_knobs": {"framework": "deepspeed"},
        "grep_log": {"job_id": job_id, "pattern": "step"},
        "job_logs": {"job_id": job_id},
        "job_status": {"job_id": job_id},
        "list_checkpoints": {"run": RUN},
        "list_interruptions": {},
        "list_jobs": {},
        "list_nodes": {},
        "list_pending_approvals": {"include_decided": True},
        "load_skill": {"name": "fault-drill"},
        "measure_checkpoint_io": {"size_mib": 1, "tensors": 1},
        "plan_checkpoint_interval": {"save_s": 60, "restart_s": 120, "mtbf_h": 24},
        "plan_effective_training_time": {"gpus": 64, "days": 2},
        "plan_layout": {"preset": "tiny", "nproc": 2},
        "query_metrics": {"run": RUN, "metric": "loss"},
        "read_log_window": {"job_id": job_id, "line": 1},
        "sdc_case": {"run": RUN},
        "summarize_run": {"run": RUN},
        "verify_checkpoint": {"run": RUN},
        "wait_job": {"job_id": job_id, "timeout_s": 5},
        "watch_job": {"job_id": job_id, "timeout_s": 5},
    }


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every file (size, mtime) and folder under `roots`."""
    seen: dict[str, tuple] = {}
    for root in roots:
        for folder, _subfolders, files in os.walk(root):
            seen[folder] = ("dir",)
            for name in files:
                path = os.path.join(folder, name)
                try:
                    info = os.lstat(path)
                except FileNotFoundError:
                    continue
                seen[path] = (info.st_size, info.st_mtime_ns)
    return seen


def writes(before: dict, after: dict, workspace: Path) -> list[str]:
    """Paths created, changed or removed, less the gate's audit files and new workspace folders."""
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    found = []
    for path in changed:
        inside = Path(path).is_relative_to(workspace)
        relative = str(Path(path).relative_to(workspace)) if inside else path
        if inside and relative in ALLOWED_IN_WORKSPACE:
            continue
        if inside and after.get(path) == ("dir",) and before.get(path) is None:
            continue  # the workspace's own layout, made on first use (a file written into it still counts)
        found.append(relative)
    return found


def committed_checkpoint(run_dir: Path, step: int) -> None:
    folder = run_dir / "checkpoints" / step_dir_name(step)
    folder.mkdir(parents=True)
    (folder / COMMIT_FILE).write_text(json.dumps({"step": step, "time": time.time(), "files": {}}))


@pytest.fixture
def scene(workspace, tmp_path, monkeypatch):
    """A workspace with a finished run (metrics, a committed checkpoint), a second two-rank run of it
    with another micro_batch, a finished job, a private current folder and a private temporary folder."""
    operator = CallContext(actor="operator")
    run_dir = workspace / "runs" / RUN
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text('[model]\npreset = "tiny"\n\n[training]\nmicro_batch = 2\nglobal_batch = 4\n'
                                         'seq_len = 64\n')
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for step in range(1, 7):
            fh.write(json.dumps({"step": step, "rank": 0, "loss": 5.0 - 0.1 * step, "grad_norm": 1.0,
                                 "step_time_s": 0.1,
                                 "tokens_per_s": 1000.0, "flops_per_token": 1e6, "tflops": 0.01, "mfu_pct": 3.0,
                                 "peak_mem_gib": 0.1, "time": time.time(), "peak_source": "measured-gemm"}) + "\n")
    committed_checkpoint(run_dir, 4)
    recorded = Path(__file__).parents[2] / "benchmarks/agent_eval/scenarios/bitflip-which-node/workspace/runs"
    case = SdcCase.model_validate_json(next(recorded.glob("run-*/sdc-case.json")).read_text())  # a real case
    write_case(case.model_copy(update={"run_dir": str(run_dir)}))
    other = workspace / "runs" / OTHER_RUN
    other.mkdir()
    config = (run_dir / "config.toml").read_text()
    (other / "config.toml").write_text(config.replace("micro_batch = 2", "micro_batch = 1"))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (other / "metrics.jsonl").write_text("".join(line + "\n" + line.replace('"rank": 0', '"rank": 1') + "\n"
                                                 for line in lines))  # two ranks, for find_straggler
    done = {"name": "done", "launcher": "plain", "command": [sys.executable, "-c", "print('ok')"]}
    job_id = call("submit_job", {"spec": done}, operator).handle.job_id
    assert call("wait_job", {"job_id": job_id, "timeout_s": 30}, operator).state == "completed"
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return workspace, cwd, tmp, job_id


def test_every_read_tool_has_an_input_here():
    read_tools = {name for name, spec in agent_registry().items() if spec.risk == "read"}
    assert read_tools == set(read_inputs("any"))


@pytest.mark.parametrize("name", sorted(read_inputs("any")))
def test_a_read_tool_writes_nothing_outside_a_temporary_folder_it_removes(name, scene):
    workspace, cwd, tmp, job_id = scene
    before = snapshot(workspace, cwd, tmp)
    call(name, read_inputs(job_id)[name], CallContext(actor="agent"), registry=agent_registry())
    assert writes(before, snapshot(workspace, cwd, tmp), workspace) == []


class Nothing(BaseModel):
    pass


def test_the_check_catches_a_read_tool_that_leaves_files_behind(scene):
    workspace, cwd, tmp, _ = scene

    @tool("leaky_read", risk="read")
    def leaky_read(inp: Nothing) -> Nothing:
        """Claims to read; leaves a file in the current folder and one in a run folder."""
        Path("left-behind.txt").write_text("x")
        (workspace / "runs" / RUN / "note.txt").write_text("x")
        return inp

    before = snapshot(workspace, cwd, tmp)
    call("leaky_read", {}, CallContext(actor="agent"), registry=build_registry(extra=[leaky_read]))
    found = writes(before, snapshot(workspace, cwd, tmp), workspace)
    assert found == [str(cwd / "left-behind.txt"), "runs/r1/note.txt"]
