"""Communication share from the profiler: the trainer traces `[metrics] profile_steps` to
RUN/profile/rank{R}.json, and the baseline reads collective time against step time from it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainops.skills.baseline import comm_share, profile_run
from trainops.skills.bottleneck import trace_exposed_comm
from trainops.skills.request import JobRequest
from trainops.trainer.config import ConfigError, load_config

pytestmark = pytest.mark.usefixtures("as_operator")


def _trace(path: Path, events: list[tuple[str, float, float]]) -> Path:
    """A Chrome trace as torch.profiler exports it: complete ('X') events in microseconds."""
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": name, "ts": ts, "dur": dur,
                                                 "cat": "user_annotation"}
                                                for name, ts, dur in events]}))
    return path


def test_profile_steps_take_a_start_count_pair_or_consecutive_steps():
    assert load_config(None, "tiny", ["metrics.profile_steps=3,2"]).metrics.profile_steps == [3, 4]
    assert load_config(None, "tiny", []).metrics.profile_steps == []
    with pytest.raises(ConfigError, match=r"metrics.profile_steps = '3' is not valid: give \"start,count\""):
        load_config(None, "tiny", ["metrics.profile_steps=3"])


def test_a_config_with_profile_steps_reads_back_equal(tmp_path):
    cfg = load_config(None, "tiny", ["metrics.profile_steps=3,2"])
    (tmp_path / "job.toml").write_text(cfg.to_toml())
    assert load_config(str(tmp_path / "job.toml"), None, []) == cfg


def test_collective_time_is_the_union_of_ranges_inside_the_steps_over_step_time(tmp_path):
    trace = _trace(tmp_path / "rank0.json", [
        ("train_step#3", 0, 100), ("train_step#4", 200, 100),
        ("gloo:all_gather", 10, 20), ("gloo:all_reduce", 20, 20),  # overlapping threads: 10..40 counts 30
        ("nccl:all_reduce", 290, 30),  # runs past the step's end: 10 inside it
        ("gloo:all_reduce", 150, 20),  # between steps (a checkpoint, the loss print): not step time
        ("aten::mm", 0, 90)])
    reading = trace_exposed_comm(trace)  # what comm_share and exposed communication both read
    assert (reading.comm_us, reading.step_us) == (40.0, 200.0)


def test_a_trace_without_step_ranges_gives_no_reading(tmp_path):
    assert trace_exposed_comm(_trace(tmp_path / "rank0.json", [("gloo:all_reduce", 0, 10)])) is None


@pytest.mark.slow
def test_a_two_process_fsdp2_baseline_profile_measures_a_share_between_0_and_100(workspace):
    req = JobRequest(overrides=["parallel.data_parallel=fsdp", "training.seq_len=64", "training.global_batch=8",
                                "training.micro_batch=4"], nproc=2, timeout_s=300)
    profiled = profile_run(req)
    traces = sorted(p.name for p in Path(profiled.run_dir).glob("profile/*.json"))
    assert traces == ["rank0.json", "rank1.json"]
    share, method = comm_share([profiled])
    assert 0 < share < 100, method
    assert method.startswith("torch.profiler traces") and "2 rank(s)" in method
