"""The reference the trainer is measured against: a plain, hand-written PyTorch loop of the
same math (model, batch, precision, multi-tensor AdamW, clipping, FSDP2 when run on 2 ranks), with
none of the trainer's machinery. Run directly for one process or under torchrun for FSDP2.

    python benchmarks/plain_loop.py --preset tiny --steps 30 --global-batch 8 --seq-len 128 --out T.json
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from trainops.trainer.model import Transformer
from trainops.trainer.model_args import preset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="sequences per rank and step (default: global batch / world size)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                        help="override a model field of the preset, e.g. --set dim=256")
    parser.add_argument("--no-sync", action="store_true",
                        help="every rank trains its own replica with no communication: the compute floor "
                             "of a multi-process step, not training")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    model_args = preset(args.preset, **{k: int(v) for k, v in (item.split("=", 1) for item in args.set)})
    model = Transformer(model_args)
    model.init_weights(seed=0)
    if distributed and not args.no_sync:  # sharded as the trainer shards on the CPU: the whole model, one unit

        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    batch = args.micro_batch or args.global_batch // world
    generator = torch.Generator().manual_seed(rank)
    step_times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        tokens = torch.randint(0, model_args.vocab_size, (batch, args.seq_len + 1), generator=generator)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if distributed and not args.no_sync:
            dist.all_reduce(loss.detach(), op=dist.ReduceOp.AVG)
        loss.item()
        step_times.append(time.perf_counter() - started)
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"step_time_s": step_times}, fh)
    if distributed:
        dist.barrier()  # no rank tears gloo down while a peer still talks to it
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
