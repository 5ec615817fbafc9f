"""The rollout ladder (issue 26 item 3): an arm climbs 1 -> 2 -> ... -> target processes, each rung
judged against its own noise band; where the gain is gone it stops, reverts, verifies and hands the
stop to a human. The slow tests train for real (tiny preset, a few steps, gloo on the CPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.skills.ablation import ablate
from trainops.skills.evidence import plots
from trainops.skills.evidence.model import LadderStop
from trainops.skills.evidence.pack import assemble
from trainops.skills.evidence.render import to_markdown
from trainops.skills.knobs import CATALOGUE
from trainops.skills.request import JobRequest
from trainops.skills.rollout import Rung, ladder, start_note, topology_hint, valid_rungs
from trainops.tools.context import operator_session
from trainops.tools.governance import queue
from trainops.trainer.config import load_config
from trainops.workspace import runs_dir

# tiny model, 32-token sequences, 4 sequences per rank: a step takes tens of milliseconds on one core
SHORT = ["training.seq_len=32", "training.global_batch=8", "training.steps=4", "data.kind=synthetic"]


@pytest.fixture
def operator(monkeypatch):
    """The operator's own session on one thread per rank, as `trainops ablate` runs it."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with operator_session():
        yield


def test_the_ladder_climbs_processes_then_nodes():
    rungs = ladder(JobRequest(nproc=4, nodes=4))
    assert [(r.nproc, r.nodes) for r in rungs] == [(1, 1), (2, 1), (4, 1), (4, 2), (4, 4)]
    assert [r.label for r in rungs][-1] == "4 nodes x 4 processes"
    assert [r.nproc for r in ladder(JobRequest(nproc=3))] == [1, 2, 3]


def test_a_knob_that_needs_two_processes_starts_at_its_smallest_valid_rung_and_says_so():
    knob = CATALOGUE["cpu_collectives"]
    rungs = valid_rungs(knob, JobRequest(nproc=4))
    assert [r.world for r in rungs] == [2, 4]
    note = start_note(knob, rungs)
    assert "cannot run at small scale" in note and "2 processes" in note and "4 processes" in note
    assert start_note(CATALOGUE["micro_batch"], valid_rungs(CATALOGUE["micro_batch"], JobRequest(nproc=4))) == ""


def test_a_knob_with_no_valid_rung_is_refused_on_the_command_path():
    result = CliRunner().invoke(app, ["ablate", "--knob", "tp=2", "--nproc", "1", "--json"])
    assert result.exit_code == 2, result.output
    assert "needs 2 processes" in json.loads(result.stdout)["error"]


def test_topology_hints_name_oversubscription_and_the_inter_node_link():
    cpus = len(os.sched_getaffinity(0))
    crowded = topology_hint(Rung(nproc=cpus + 1), Rung(nproc=cpus), [], "cpu:x86_64")
    assert f"{cpus + 1} processes on a {cpus}-core host: ranks oversubscribe the CPUs" in crowded
    across = topology_hint(Rung(nproc=2, nodes=2), Rung(nproc=2), [], "cuda:H100")
    assert "across nodes: the inter-node link" in across and "oversubscribe" not in across


def _run_folders(home: Path) -> list[Path]:
    return sorted(p.parent for p in home.rglob("metrics.jsonl"))


@pytest.mark.slow
def test_a_gain_that_holds_climbs_to_the_target(operator):
    """micro_batch 1 -> 4 at 4 sequences per rank: one accumulation pass instead of four, a gain at
    every rung; the ladder reaches the target and judges it by weak scaling."""
    req = JobRequest(overrides=[*SHORT, "training.micro_batch=1"], nproc=2, warmup_steps=1)
    rows, _ = ablate(req, ["micro_batch=4"], repeats=2)
    assert [(r.world_size, r.verdict, r.scale_kind) for r in rows] == [(1, "gain", "small"), (2, "gain", "target")]
    assert all(r.stop is None and not r.vanished_at_scale for r in rows)
    assert rows[-1].scaling_basis.startswith("weak scaling: global batch 4 at 1 process -> 8 at 2 processes")


@pytest.mark.slow
def test_a_gain_that_vanishes_at_a_rung_stops_there_reverts_and_goes_to_a_human(operator, workspace):
    """A straggler on rank 1 ([faults] slow_rank = 1, in baseline and arm alike) only exists from 2
    processes on: there every step of the job waits 15 s for it (the slowest rank sets the job's step
    time), and micro_batch 1 -> 2 saves one accumulation pass (~25 ms), a sixth of the rung's 1% noise
    floor. The ladder stops at 2 processes, reruns the baseline value there, and queues R-ESC-2."""
    two_per_rank = [*SHORT, "training.steps=2", "training.seq_len=16", "training.global_batch=8",
                    "training.micro_batch=1"]
    req = JobRequest(overrides=[*two_per_rank, "faults.slow_rank=1", "faults.slow_ms=15000"], nproc=4,
                     warmup_steps=1)
    said: list[str] = []
    rows, _ = ablate(req, ["micro_batch=2"], repeats=1, progress=said.append)
    assert [r.world_size for r in rows] == [1, 2], "the ladder climbed past the rung where the gain was gone"
    small, stopped = rows
    assert small.verdict == "gain" and small.stop is None
    assert stopped.verdict != "gain" and stopped.vanished_at_scale
    stop = stopped.stop
    assert stop.rung == "2 processes" and stop.reason.startswith("gain gone at 2 processes")
    assert "a straggler: rank 1 runs 15000 ms slower" in stop.topology_hint
    assert stop.reverted_to == "1" and stop.verification_matches
    for run in stop.verification_runs:  # the reverted config: the baseline value, the straggler still there
        config = load_config(str(Path(run) / "config.toml"))
        assert config.training.micro_batch == 1 and config.faults.slow_rank == 1
    pending_id = stop.human_item.rsplit("[pending approval ", 1)[1].rstrip("]")
    pending = queue.get_pending(pending_id)
    assert pending.tool == "acknowledge_escalation" and pending.input["rule_id"] == "R-ESC-2"
    assert "gone at 2 processes" in pending.input["detail"]
    ranks = {json.loads(line)["rank"] for run in _run_folders(workspace)
             for line in (run / "metrics.jsonl").read_text().splitlines()}
    assert ranks == {0, 1}, "a rung above the stop (4 processes) was run"
    assert len(stop.verification_runs) == 1
    assert any("gain gone at 2 processes" in line for line in said), said


@pytest.mark.slow
def test_ablate_json_starts_a_two_process_knob_at_two_processes(workspace):
    """`trainops ablate --json` for cpu_collectives (needs 2 processes) at a 2-process target: one
    rung, its note says why there is no small scale, and no 1-process run was launched."""
    env = {**os.environ, "TRAINOPS_HOME": str(workspace), "OMP_NUM_THREADS": "1"}
    sets = [arg for item in SHORT for arg in ("--set", item)]
    command = [str(Path(sys.executable).parent / "trainops"), "ablate", "--knob", "cpu_collectives=shared_memory",
               "--nproc", "2", "--repeats", "1", *sets, "--json"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout)
    assert [r["world_size"] for r in rows] == [2]
    assert "cannot run at small scale" in rows[0]["ladder_note"] and "the target itself" in rows[0]["ladder_note"]
    assert len(_run_folders(workspace)) == 2, "expected the 2-process baseline and arm only"


def test_the_pack_shows_each_rung_the_stop_and_a_plot_of_gain_per_rung(factories, tmp_path):
    small = factories.ablation(change=30.0, band=4.0).model_copy(update={"scale": "1 process", "world_size": 1})
    stop = LadderStop(rung="2 processes", reason="gain gone at 2 processes: +0.4% is inside its noise band of ±1.0%",
                      topology_hint="a straggler: rank 1 runs 2500 ms slower every step", reverted_to="text",
                      verification_runs=["runs/verify-1"], verification_change_pct=0.2, verification_band_pct=1.0,
                      verification_matches=True, human_item="R-ESC-2 stop_rollout_and_roll_back: gone.")
    gone = factories.ablation(change=0.4, band=1.0, verdict="within-noise").model_copy(
        update={"scale": "2 processes", "world_size": 2, "vanished_at_scale": True, "stop": stop})
    run = factories.write_run(runs_dir() / "base-1")
    pack = assemble("pack-ladder", factories.environment(), factories.baseline([str(run)]), [small, gone], [], [])
    report = to_markdown(pack)
    assert "gain gone: ladder stopped and rolled back" in report
    assert "stopped: gain gone at 2 processes" in report and "a straggler: rank 1" in report
    assert "whose verification run matched the baseline (+0.2% against ±1.0%)" in report
    figure = plots.ladder(pack)
    assert figure is not None and figure.name == "ladder" and figure.png.startswith(b"\x89PNG")
    assert plots.ladder(pack.model_copy(update={"ablations": [small]})) is None  # one rung, no stop: no ladder
