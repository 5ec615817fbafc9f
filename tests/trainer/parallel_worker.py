"""Trains the tiny model under named layouts and writes the per-step losses (run by torchrun
from tests/trainer/test_parallel*.py and test_reshard*.py; one launch runs several cases so the
CPU pays the process start-up once).

    torchrun --nproc_per_node N parallel_worker.py OUT.json CASE[:save=DIR@STEP|load=DIR] ...

Same seed, same data, same optimizer in every case: the losses must match the one-process
reference (`reference_losses`) up to floating-point reduction order. The reference builds its
model with real tensors; every layout builds it on the meta device and materializes each
rank's shard after splitting and sharding, so the parity also checks that materialization.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch.distributed as dist

from trainops.trainer.checkpoint import AppState, Checkpointer
from trainops.trainer.config import load_config
from trainops.trainer.layout import validate_layout
from trainops.trainer.model import Transformer
from trainops.trainer.parallel.pp import build_pipeline, merged_view
from trainops.trainer.parallelize import build_mesh, parallelize

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BASE = ["data.kind=synthetic", "training.seq_len=32", "training.global_batch=8", "training.micro_batch=2",
        "training.seed=0"]
STEPS = 4
LR = 0.5  # plain SGD with momentum: unlike Adam, its update scales with the gradient, so a
# layout that mis-scales gradients (micro-batch or data-parallel averaging) changes the loss
MESH_COORDS: dict[str, list[dict[str, int]]] = {}  # case -> each rank's coordinates in the real DeviceMesh
CASES: dict[str, list[str]] = {
    "tp2": ["parallel.tp=2"],
    "tp2_sp": ["parallel.tp=2", "parallel.sequence_parallel=true"],
    "pp2_GPipe": ["parallel.pp=2", "parallel.pp_schedule=GPipe"],
    "pp2_1F1B": ["parallel.pp=2", "parallel.pp_schedule=1F1B"],
    "pp2_Interleaved1F1B": ["parallel.pp=2", "parallel.pp_schedule=Interleaved1F1B", "parallel.virtual_stages=2"],
    "pp2_InterleavedZeroBubble": ["parallel.pp=2", "parallel.pp_schedule=InterleavedZeroBubble",
                                  "parallel.virtual_stages=2"],
    "pp2_ZBVZeroBubble": ["parallel.pp=2", "parallel.pp_schedule=ZBVZeroBubble", "parallel.virtual_stages=2"],
    "fsdp2": ["parallel.dp_shard=-1"],
    "fsdp2_tp2": ["parallel.tp=2", "parallel.sequence_parallel=true"],
    "pp2_fsdp2": ["parallel.pp=2", "parallel.pp_schedule=1F1B"],
    "pp2_tp2": ["parallel.pp=2", "parallel.tp=2", "parallel.pp_schedule=1F1B"],
}


def config(case: str):
    return load_config(None, "tiny", BASE + CASES.get(case, []))


def batches(cfg):
    """The same global batches in every layout; each data-parallel rank takes its slice."""
    generator = torch.Generator().manual_seed(1234)
    vocab = cfg.model_args().vocab_size
    for _ in range(STEPS):
        tokens = torch.randint(0, vocab, (cfg.training.global_batch, cfg.training.seq_len + 1), generator=generator)
        yield tokens[:, :-1], tokens[:, 1:]


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def new_model(cfg):
    model = Transformer(cfg.model_args())
    model.init_weights(seed=cfg.training.seed)
    return model


def reference_losses() -> list[float]:
    """One process, no parallelism: the losses every layout must reproduce."""
    return reference_run(STEPS)[1]


def reference_run(steps: int) -> tuple[torch.nn.Module, list[float]]:
    """The one-process model after `steps` steps, and its losses."""
    cfg = config("reference")
    model = new_model(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for _, (tokens, labels) in zip(range(steps), batches(cfg), strict=False):
        loss = loss_fn(model(tokens), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


def run_case(case: str, save: tuple[str, int] | None, load: str | None) -> list[float | None]:
    """Train `case` on the current process group; losses per step (None for steps skipped by a load)."""
    cfg = config(case)
    layout = validate_layout(cfg, dist.get_world_size())
    info = build_mesh(layout, "cpu")
    mesh_coords: list[dict[str, int]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(mesh_coords, {name: info.mesh.get_local_rank(name) for name in info.mesh.mesh_dim_names})
    MESH_COORDS[case] = mesh_coords

    with torch.device("meta"):  # as the trainer does: values arrive once split and sharded
        model = Transformer(cfg.model_args())
    if layout.pp > 1:
        pipe = build_pipeline(model, layout, info.mesh["pp"], lambda part: parallelize(part, cfg, info),
                              loss_fn, torch.device("cpu"))

        trained, params = merged_view(pipe.model_parts), list(pipe.parameters())
    else:
        pipe, trained = None, parallelize(model, cfg, info)
        params = list(trained.parameters())
    optimizer = torch.optim.SGD(params, lr=LR, momentum=0.9)
    app = AppState(trained, optimizer)
    first_step = 1
    if load:
        loader = Checkpointer(cfg.checkpoint.model_copy(update={"enable": True}), load, dist.get_rank())
        first_step = loader.load_latest(app) + 1
    local = cfg.training.global_batch // layout.dp
    rows = slice(info.dp_rank * local, (info.dp_rank + 1) * local)
    losses: list[float | None] = []
    for step, (tokens, labels) in enumerate(batches(cfg), start=1):
        if step < first_step:
            losses.append(None)
            continue
        if pipe is not None:
            loss = pipe.step(tokens[rows], labels[rows])
        else:
            loss = loss_fn(trained(tokens[rows]), labels[rows])
            loss.backward()
            loss = loss.detach()
        optimizer.step()
        optimizer.zero_grad()
        dist.all_reduce(loss)  # tp and pp ranks hold equal losses, dp ranks their slice's
        losses.append(loss.item() / dist.get_world_size())
        if save and step == save[1]:
            saver = Checkpointer(cfg.checkpoint.model_copy(update={"enable": True}), save[0], dist.get_rank())
            saver.save(step, app)
            saver.close()
    return losses


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(folder: Path, nproc: int, specs: list[str]) -> dict[str, list[float | None]]:
    """Run this file under torchrun with `nproc` ranks; the losses per case spec."""
    out = folder / f"losses-{nproc}-{_free_port()}.json"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={_free_port()}", str(Path(__file__).resolve()), str(out), *specs]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    dist.init_process_group("gloo")
    out, results = Path(sys.argv[1]), {}
    for spec in sys.argv[2:]:
        case, _, option = spec.partition(":")
        save = load = None
        if option.startswith("save="):
            folder, _, step = option.removeprefix("save=").partition("@")
            save = (folder, int(step))
        elif option.startswith("load="):
            load = option.removeprefix("load=")
        results[spec] = run_case(case, save, load)
    results["mesh_coords"] = MESH_COORDS
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
