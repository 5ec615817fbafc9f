"""Resume with one reader per replica group against every rank reading (issue 27 item 2): storage
bytes read (counted by the checkpoint reader's file system, summed over ranks, from the journal's
load entry) and load time, DDP on 2 and 4 ranks (every rank a replica), the two resumes of each pair
run back to back from copies of one checkpointed run folder."""
from __future__ import annotations

import json
import shutil
import statistics
from functools import partial
from pathlib import Path

from trainops.benchmarks.harness import Figure, Suite, interleaved, ratios
from trainops.tools.jobs.follow import launch_run, run_local
from trainops.trainer.config import load_config

SHAPE = ["training.seq_len=64", "training.global_batch=8", "data.kind=synthetic", "training.steps=2",
         "parallel.data_parallel=ddp", "checkpoint.enable=true", "checkpoint.interval=2"]


def _checkpointed(nproc: int) -> Path:
    result = run_local(load_config(None, "tiny", [*SHAPE, f"training.micro_batch={8 // nproc}"]), nproc)
    if result.status != "ok":
        raise RuntimeError(f"benchmark checkpoint run failed: read {result.run_dir}/logs")
    return Path(result.run_dir)


def _resume(source: Path, nproc: int, readers: str, copies: list[int]) -> tuple[float, float]:
    """Resume a fresh copy of `source` for one step; (bytes read from storage, all ranks; load s)."""
    copies[0] += 1
    run_dir = source.with_name(f"{source.name}-{readers}-{copies[0]}")
    shutil.copytree(source, run_dir)
    cfg = load_config(run_dir / "config.toml", None, ["training.steps=3", f"checkpoint.load_readers={readers}"])
    (run_dir / "config.toml").write_text(cfg.to_toml())
    result = launch_run(run_dir, nproc)
    if result.status != "ok":
        raise RuntimeError(f"benchmark resume failed: read {run_dir}/logs")
    lines = (run_dir / "checkpoints.jsonl").read_text().splitlines()
    record = [entry for entry in map(json.loads, lines) if entry["event"] == "load"][-1]
    if record["step"] != 2:
        raise RuntimeError(f"benchmark resume loaded step {record['step']}, not 2: read {run_dir}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return float(sum(record["bytes_read"])), float(record["load_s"])


def bench_replica_load(suite: Suite, repeats: int) -> None:
    for nproc in (2, 4):
        source, copies = _checkpointed(nproc), [0]
        one, every = interleaved(partial(_resume, source, nproc, "one_per_replica_group", copies),
                                 partial(_resume, source, nproc, "every_rank", copies), repeats)
        target = 1 / nproc + 0.05
        fig = suite.add(Figure(f"resume storage bytes read, one reader per replica group / every rank reads, "
                               f"DDP {nproc} ranks", ratios([b for b, _ in one], [b for b, _ in every]), "x",
                               target=f"<= {target:.2f}"))
        fig.passed = fig.median <= target
        fig.note = (f"{statistics.median(b for b, _ in one) / 1e6:.2f} MB vs "
                    f"{statistics.median(b for b, _ in every) / 1e6:.2f} MB per resume, all ranks (every rank "
                    "reading includes rank 0's sha256 pass over the checkpoint, which the one reader folds into "
                    "its single read); tiny preset, page-cached local disk")
        times = suite.add(Figure(f"resume load time, one reader per replica group / every rank reads, DDP {nproc} "
                                 "ranks", ratios([s for _, s in one], [s for _, s in every]), "x",
                                 target=""))
        times.note = (f"load {statistics.median(s for _, s in one) * 1000:.0f} ms vs "
                      f"{statistics.median(s for _, s in every) * 1000:.0f} ms (choice, read, verify, broadcast, "
                      "set state; slowest rank)")
