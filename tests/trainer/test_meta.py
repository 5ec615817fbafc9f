"""Big presets plan and split without allocating: the model is built on the meta device, a
pipeline split shares its modules, and values arrive only once a rank's part is sharded
(trainops.trainer.weights). Memory is measured in a fresh process (ru_maxrss), so what this
process has already imported does not count."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from functools import partial

import torch

from trainops.trainer.config import load_config
from trainops.trainer.layout import plan_dry_run, validate_layout
from trainops.trainer.model import Transformer, initial_weight
from trainops.trainer.model_args import PRESETS
from trainops.trainer.parallel.pp import split_model
from trainops.trainer.weights import is_meta, local_slice, materialize

GIB = 2**30


def _measure(code: str) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON line. Adds its peak RSS, wall time and
    CPU time (user + system, imports included; what the limits check, since the wall time of a
    test on a shared 2-core machine mostly measures the neighbours)."""
    wrapped = "\n".join([
        "import json, resource, time",
        "started = time.perf_counter()",
        textwrap.dedent(code).strip(),
        'usage = resource.getrusage(resource.RUSAGE_SELF)',
        'result["seconds"] = time.perf_counter() - started',
        'result["cpu_seconds"] = usage.ru_utime + usage.ru_stime',
        'result["peak_rss_bytes"] = usage.ru_maxrss * 1024',
        "print(json.dumps(result))",
    ])
    done = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_llama3_70b_dry_run_takes_seconds_and_little_memory():
    measured = _measure("""
        from trainops.trainer.config import load_config
        from trainops.trainer.layout import plan_dry_run
        cfg = load_config(None, "llama3-70b", ["parallel.pp=8", "parallel.tp=8", "training.micro_batch=1",
                                                        "training.global_batch=512", "training.seq_len=8192"])
        plan = plan_dry_run(cfg, 512, gpus_per_node=8, backend="nccl")
        result = {"ranks": len(plan.ranks)}
    """)
    assert measured["ranks"] == 512
    assert measured["cpu_seconds"] < 10, measured
    assert measured["peak_rss_bytes"] < 1 * GIB, measured


def test_llama3_70b_pipeline_split_on_meta_takes_seconds_and_little_memory():
    measured = _measure("""
        import torch
        from trainops.trainer.config import load_config
        from trainops.trainer.layout import validate_layout
        from trainops.trainer.model import Transformer
        from trainops.trainer.parallel.pp import split_model
        cfg = load_config(None, "llama3-70b", ["parallel.pp=8", "training.micro_batch=1", "training.global_batch=8"])
        layout = validate_layout(cfg, 8, plan_only=True)
        with torch.device("meta"):
            model = Transformer(cfg.model_args())
        params = [sum(p.numel() for _, part in split_model(model, layout, rank) for p in part.parameters())
                  for rank in range(8)]
        result = {"params": params}
    """)
    assert sum(measured["params"]) == sum(p.numel() for p in _meta("llama3-70b").parameters())
    assert measured["cpu_seconds"] < 10, measured
    assert measured["peak_rss_bytes"] < 1 * GIB, measured


def _meta(name: str) -> Transformer:
    with torch.device("meta"):
        return Transformer(PRESETS[name])


def test_the_meta_split_holds_what_the_dry_run_plans_for_each_rank():
    cfg = load_config(None, "llama3-70b", ["parallel.pp=8", "training.micro_batch=1", "training.global_batch=8"])
    layout = validate_layout(cfg, 8, plan_only=True)
    plan = plan_dry_run(cfg, 8, gpus_per_node=8, backend="nccl")
    model = _meta("llama3-70b")
    for rank in plan.ranks:
        parts = split_model(model, layout, rank.coords["pp"])
        assert sum(p.numel() for _, part in parts for p in part.parameters()) == rank.params
        assert all(is_meta(part) for _, part in parts)


def test_a_split_shares_the_models_modules_instead_of_copying_them():
    cfg = load_config(None, "tiny", ["parallel.pp=2"])
    model = Transformer(cfg.model_args())
    (_, first), = split_model(model, validate_layout(cfg, 2, plan_only=True), 0)
    assert first.layers["0"] is model.layers["0"] and first.tok_embeddings is model.tok_embeddings
    assert list(first.layers) == ["0", "1"] and first.norm is None and first.output is None


def test_materializing_a_meta_model_gives_the_seeded_init_bit_for_bit():
    for tie in (False, True):
        reference = Transformer(PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "tie_embeddings": tie}))
        reference.init_weights(seed=7)
        with torch.device("meta"):
            model = Transformer(reference.args)
        materialize(model, torch.device("cpu"), partial(initial_weight, reference.args, seed=7))
        assert not is_meta(model)
        assert (model.output.weight is model.tok_embeddings.weight) == tie
        for (name, a), b in zip(reference.state_dict().items(), model.state_dict().values(), strict=True):
            assert torch.equal(a, b), name
        assert torch.equal(reference.freqs_cis, model.freqs_cis)


def test_a_parameters_initial_value_does_not_depend_on_which_others_exist():
    args = PRESETS["tiny"]
    shape = torch.Size([args.dim, args.dim])
    alone = initial_weight(args, "layers.2.attention.wq.weight", shape, seed=0)
    assert torch.equal(alone, initial_weight(args, "layers.2.attention.wq.weight", shape, seed=0))
    assert not torch.equal(alone, initial_weight(args, "layers.1.attention.wq.weight", shape, seed=0))


def test_a_plain_tensor_holds_the_whole_value():
    full = torch.arange(12.0).view(3, 4)
    assert local_slice(full, torch.empty(3, 4)) is full
