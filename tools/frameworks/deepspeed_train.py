"""The DeepSpeed training script the adapter launches under torchrun (gloo on CPUs, NCCL on GPUs):
the trainops Llama model, `deepspeed.initialize` with the run's validated ds_config.json, and
trainops' run-folder contract — metrics.jsonl, heartbeats, logs/rank{R}.log, and checkpoints
written with `engine.save_checkpoint` then committed (COMMIT.json with sha256) so that
`verify_checkpoint`, drills and resume treat them like the embedded trainer's.

    torchrun --nproc-per-node 2 -m trainops.tools.frameworks.deepspeed_train --run-dir RUN
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
import tomllib
from pathlib import Path

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainops.run_folder import RunFiles, open_rank_log
from trainops.trainer.checkpoint import COMMIT_FILE, list_checkpoints, step_dir_name, verify_checkpoint
from trainops.trainer.config import MetricsConfig
from trainops.trainer.data import SyntheticTokens
from trainops.trainer.metrics import MetricsLogger, device_peak_tflops, flops_per_token, format_line, peak_memory_gib
from trainops.trainer.model import Transformer
from trainops.trainer.model_args import preset


def _append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save(engine, run_dir: Path, step: int, keep: int, world_size: int) -> None:
    """DeepSpeed writes `step-N.tmp/` on every rank; rank 0 then checksums, commits and renames it.
    Leftovers of an interrupted save are removed first; a corrupt copy of the same step (the one a
    resume fell back past) is replaced by the new, verified one."""
    root, name = run_dir / "checkpoints", step_dir_name(step)
    started = time.perf_counter()
    if dist.get_rank() == 0:
        for stale in root.glob("step-*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
    dist.barrier()
    engine.save_checkpoint(str(root), tag=f"{name}.tmp", client_state={"step": step}, save_latest=False)
    dist.barrier()
    if dist.get_rank() == 0:
        tmp = root / f"{name}.tmp"
        files = {str(p.relative_to(tmp)): {"size_bytes": p.stat().st_size, "sha256": _sha256(p)}
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        commit = {"step": step, "time": time.time(), "mode": "sync", "world_size": world_size, "files": files,
                  "framework": "deepspeed"}
        (tmp / COMMIT_FILE).write_text(json.dumps(commit, indent=1))
        shutil.rmtree(root / name, ignore_errors=True)
        tmp.rename(root / name)
        committed = [c for c in list_checkpoints(root) if c.committed]
        for old in committed[: max(0, len(committed) - keep)]:
            shutil.rmtree(old.path, ignore_errors=True)
        write_s = time.perf_counter() - started
        _append(RunFiles(run_dir).checkpoint_journal, {
            "event": "save", "step": step, "mode": "sync", "world_size": world_size, "stall_s": write_s,
            "write_s": write_s, "size_bytes": sum(f["size_bytes"] for f in files.values()),
            "path": str(root / name), "time": commit["time"], "framework": "deepspeed"})
    dist.barrier()


def resume(engine, run_dir: Path) -> int:
    """Load the newest checkpoint that verifies (falling back past corrupt ones); 0 when none."""
    chosen = [""]
    if dist.get_rank() == 0:
        for info in reversed([c for c in list_checkpoints(run_dir / "checkpoints") if c.committed]):
            verdict = verify_checkpoint(info.path)
            if verdict.complete:
                chosen[0] = info.path
                break
            _append(RunFiles(run_dir).checkpoint_journal, {"event": "fallback", "step": info.step, "path": info.path,
                                                      "reason": verdict.message, "time": time.time()})
    dist.broadcast_object_list(chosen, src=0)
    if not chosen[0]:
        return 0
    path = Path(chosen[0])
    _, client_state = engine.load_checkpoint(str(path.parent), tag=path.name)
    step = int(client_state["step"])
    if dist.get_rank() == 0:
        _append(RunFiles(run_dir).checkpoint_journal,
                {"event": "load", "step": step, "path": str(path), "time": time.time()})
    return step


def skip_inference_kernel_build() -> None:
    """DeepSpeed's CPU backend compiles its shared-memory all-reduce kernel (deepspeed_shm_comm) when the
    process group starts, though only its inference all-reduce uses it: training's collectives go through
    torch.distributed. That build is ~100 s of g++ the first time on a machine, and a build killed midway
    leaves a lock on which every later DeepSpeed job waits forever. Marked incompatible, the kernel is
    skipped as on a platform without it."""
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True)
    run_dir = Path(parser.parse_args(argv).run_dir)
    settings = tomllib.loads(RunFiles(run_dir).config.read_text(encoding="utf-8"))
    ds_config = json.loads((run_dir / "ds_config.json").read_text(encoding="utf-8"))
    training, ckpt = settings["training"], settings["checkpoint"]

    skip_inference_kernel_build()
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    log = open_rank_log(run_dir, rank)
    args = preset(settings["model"]["preset"], max_seq_len=max(training["seq_len"], 16))
    model = Transformer(args)
    model.init_weights(seed=training["seed"])
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    log.write(f"deepspeed {deepspeed.__version__}: world={world} zero_stage={engine.zero_optimization_stage()} "
              f"micro_batch={micro} grad_accum={accum}\n")
    start = resume(engine, run_dir) if ckpt["enable"] else 0
    precision = "bf16" if ds_config.get("bf16", {}).get("enabled") else "fp32"
    peak, source = device_peak_tflops(engine.device, precision)
    metrics = MetricsLogger(MetricsConfig(), run_dir, rank, run_id=run_dir.name, total_steps=training["steps"],
                            peak_tflops=peak, peak_source=source)
    data = SyntheticTokens(args.vocab_size, training["seq_len"], training["seed"])
    fpt = flops_per_token(args, training["seq_len"])
    for step in range(start + 1, training["steps"] + 1):
        started = time.perf_counter()
        wait_s, losses = 0.0, []
        for micro_step in range(accum):
            fetched = time.perf_counter()
            first = ((step - 1) * accum + micro_step) * micro * world + rank * micro
            batch = torch.stack([data.sample(first + i) for i in range(micro)]).to(engine.device)
            wait_s += time.perf_counter() - fetched
            logits = engine(batch[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
            engine.backward(loss)
            engine.step()
            losses.append(loss.detach())
        loss_value = torch.stack(losses).mean()
        dist.all_reduce(loss_value)
        step_time_s = time.perf_counter() - started
        grad_norm = engine.get_global_grad_norm()
        record = metrics.record(step=step, loss=float(loss_value) / world, step_time_s=step_time_s,
                                grad_norm=float(grad_norm) if grad_norm is not None else 0.0,
                                tokens=micro * accum * training["seq_len"], flops_per_token=fpt,
                                peak_mem_gib=peak_memory_gib(engine.device), data_wait_s=wait_s)
        log.write(format_line(record, training["steps"]) + "\n")
        if ckpt["enable"] and (step % ckpt["interval"] == 0 or step == training["steps"]):
            save(engine, run_dir, step, ckpt["keep"], world)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
