"""Layout validation: every impossible layout is rejected before launch, naming numbers and fix."""
from __future__ import annotations

import pytest

from trainops.trainer.config import load_config
from trainops.trainer.layout import LayoutError, plan_dry_run, validate_layout
from trainops.trainer.model import Transformer


def cfg(*overrides: str, preset: str = "tiny"):
    return load_config(None, preset, list(overrides))


def test_dp_shard_minus_one_infers_the_remaining_degree():
    layout = validate_layout(cfg("parallel.tp=2", "training.micro_batch=1"), 8, gpus_per_node=8)
    assert (layout.dp_shard, layout.tp, layout.dp) == (4, 2, 4)


def test_world_size_not_divisible_by_fixed_degrees_names_the_product():
    with pytest.raises(LayoutError,
                       match=r"world size 6 is not divisible by dp_replicate\*cp\*tp\*pp = 1\*1\*2\*2 = 4"):
        validate_layout(cfg("parallel.tp=2", "parallel.pp=2"), 6, gpus_per_node=8)


def test_explicit_degrees_must_multiply_to_the_world_size():
    with pytest.raises(LayoutError, match=r"1\*2\*1\*2\*1 = 4 does not equal world size 8"):
        validate_layout(cfg("parallel.dp_shard=2", "parallel.tp=2"), 8, gpus_per_node=8)


def test_heads_must_divide_by_tp():
    # tiny: 4 query heads, 2 kv heads; tp=4 splits the query heads but not the kv heads
    with pytest.raises(LayoutError, match=r"kv heads 2 are not divisible by tp=4"):
        validate_layout(cfg("parallel.tp=4"), 4, gpus_per_node=8)


def test_query_heads_must_divide_by_tp():
    with pytest.raises(LayoutError, match=r"attention heads 8 are not divisible by tp=3"):
        validate_layout(cfg("model.n_heads=8", "model.n_kv_heads=8", "model.dim=96", "parallel.tp=3"), 3,
                        gpus_per_node=3)


def test_layers_must_divide_by_pp_times_virtual_stages():
    with pytest.raises(LayoutError, match=r"layers 4 are not divisible by pp\*virtual_stages = 2\*3 = 6"):
        validate_layout(cfg("parallel.pp=2", "parallel.virtual_stages=3", "parallel.pp_schedule=Interleaved1F1B"), 2)


def test_one_f_one_b_needs_at_least_as_many_microbatches_as_stages():
    # global 4 / (dp 1 x micro 4) = 1 micro-batch for 2 stages
    with pytest.raises(LayoutError, match=r"1F1B needs micro-batches >= stages, got 1 micro-batches for pp=2"):
        validate_layout(cfg("parallel.pp=2", "training.global_batch=4", "training.micro_batch=4"), 2)


def test_interleaved_schedules_need_virtual_stages():
    with pytest.raises(LayoutError,
                       match=r"Interleaved1F1B interleaves stages and needs virtual_stages >= 2 \(got 1\)"):
        validate_layout(cfg("parallel.pp=2", "parallel.pp_schedule=Interleaved1F1B"), 2)


def test_zbv_needs_exactly_two_stages_per_rank():
    with pytest.raises(LayoutError, match=r"ZBVZeroBubble places exactly 2 stages per rank.*virtual_stages=4"):
        validate_layout(cfg("model.n_layers=8", "parallel.pp=2", "parallel.virtual_stages=4",
                            "parallel.pp_schedule=ZBVZeroBubble", "training.global_batch=16"), 2)


def test_single_stage_schedules_reject_virtual_stages():
    with pytest.raises(LayoutError, match=r"GPipe runs one stage per rank but virtual_stages=2"):
        validate_layout(cfg("parallel.pp=2", "parallel.virtual_stages=2", "parallel.pp_schedule=GPipe"), 2)


def test_interleaved_microbatches_must_fill_whole_rounds():
    # 3 micro-batches... pp=2 -> rounds 1 -> fine; 5 micro-batches, pp=2 -> rounds 2, 5 % 2 != 0
    with pytest.raises(LayoutError,
                       match=r"Interleaved1F1B needs micro-batches \(5\) to be at most pp=2 or a multiple of the "
                             r"rounds \(2\)"):
        validate_layout(cfg("parallel.pp=2", "parallel.virtual_stages=2", "parallel.pp_schedule=Interleaved1F1B",
                            "training.global_batch=5", "training.micro_batch=1"), 2)


def test_pipeline_with_ddp_data_parallel_is_rejected():
    with pytest.raises(LayoutError,
                       match=r"data_parallel=ddp cannot run with pp=2 and dp=2.*set parallel.data_parallel=fsdp"):
        validate_layout(cfg("parallel.pp=2", "parallel.data_parallel=ddp", "training.micro_batch=2"), 4)


def test_virtual_stages_need_pipeline_parallel():
    with pytest.raises(LayoutError, match=r"virtual_stages=2 needs pp > 1"):
        validate_layout(cfg("parallel.virtual_stages=2"), 1)


def test_global_batch_must_be_dp_times_micro_batch_times_accumulation():
    with pytest.raises(LayoutError, match=r"global_batch=8 is not divisible by dp\*micro_batch = 4\*4 = 16"):
        validate_layout(cfg(), 4)


def test_tied_embeddings_cannot_be_split_by_tp_or_pp():
    with pytest.raises(LayoutError, match=r"model.tie_embeddings=true cannot run with tp=1, pp=2"):
        validate_layout(cfg("model.tie_embeddings=true", "parallel.pp=2"), 2)


def test_tp_must_stay_inside_one_nodes_accelerator_domain():
    with pytest.raises(LayoutError, match=r"tp=2 does not fit one node's accelerator domain of 1"):
        validate_layout(cfg("parallel.tp=2"), 2, gpus_per_node=1)


def test_sequence_parallel_needs_tp():
    with pytest.raises(LayoutError, match=r"sequence_parallel=true needs tp > 1 \(tp=1\)"):
        validate_layout(cfg("parallel.sequence_parallel=true"), 1)


def test_comm_overlap_needs_sequence_parallel():
    with pytest.raises(LayoutError, match=r"comm_overlap=true needs sequence_parallel=true"):
        validate_layout(cfg("parallel.tp=2", "parallel.comm_overlap=true", "training.global_batch=4"), 2,
                        gpus_per_node=2)


def test_comm_overlap_needs_compile():
    with pytest.raises(LayoutError, match=r"comm_overlap=true needs training.compile=true"):
        validate_layout(cfg("parallel.tp=2", "parallel.sequence_parallel=true", "parallel.comm_overlap=true",
                            "training.global_batch=4"), 2, gpus_per_node=2, backend="nccl")


def test_comm_overlap_on_gloo_is_a_clear_error():
    with pytest.raises(LayoutError, match=r"comm_overlap=true needs NCCL on CUDA.*uses gloo"):
        validate_layout(cfg("parallel.tp=2", "parallel.sequence_parallel=true", "parallel.comm_overlap=true",
                            "training.compile=true", "training.global_batch=4"), 2, gpus_per_node=2, backend="gloo")


def test_context_parallel_on_gloo_is_a_clear_error():
    with pytest.raises(LayoutError,
                       match=r"context parallel \(cp=2\) needs NCCL on CUDA.*gloo backend on CPU.*set parallel.cp=1"):
        validate_layout(cfg("parallel.cp=2", "training.global_batch=4"), 2, backend="gloo")


def test_context_parallel_on_nccl_is_planned_but_not_trained_yet():
    config = cfg("parallel.cp=2", "training.global_batch=4")
    assert plan_dry_run(config, 2, gpus_per_node=8, backend="nccl").layout.cp == 2
    with pytest.raises(LayoutError,
                       match=r"context parallel \(cp=2\) is planned but not yet run by trainops.trainer.train"):
        validate_layout(config, 2, gpus_per_node=8, backend="nccl")


def test_dry_run_places_stages_and_layers_per_rank():
    plan = plan_dry_run(cfg("parallel.pp=2", "parallel.tp=2", "training.global_batch=8", "training.micro_batch=2"), 4,
                        gpus_per_node=4)
    assert [(r.coords["pp"], r.coords["tp"], r.layers) for r in plan.ranks] == [
        (0, 0, [0, 1]), (0, 1, [0, 1]), (1, 0, [2, 3]), (1, 1, [2, 3])]
    assert plan.ranks[0].holds_embedding and plan.ranks[3].holds_output


def test_dry_run_zbv_places_stages_in_a_v():
    plan = plan_dry_run(cfg("model.n_layers=8", "parallel.pp=2", "parallel.virtual_stages=2",
                            "parallel.pp_schedule=ZBVZeroBubble", "training.global_batch=8", "training.micro_batch=2"),
                        2)
    assert [r.stages for r in plan.ranks] == [[0, 3], [1, 2]]
    assert plan.ranks[0].holds_embedding and plan.ranks[0].holds_output


def test_dry_run_memory_shrinks_with_fsdp_sharding():
    one = plan_dry_run(cfg("training.global_batch=4"), 1).ranks[0]
    two = plan_dry_run(cfg("training.global_batch=8"), 2).ranks[0]
    assert two.param_bytes == pytest.approx(one.param_bytes / 2, rel=1e-3)
    assert one.optimizer_bytes == 2 * one.param_bytes


def test_dry_run_parameter_count_matches_the_model_on_one_rank():
    config = cfg("training.global_batch=4")
    model = Transformer(config.model_args())
    assert plan_dry_run(config, 1).ranks[0].params == sum(p.numel() for p in model.parameters())


def test_dry_run_activation_estimate_follows_the_stated_formula():
    # tiny, one rank, fp32, no AC: 4 layers x s*b*h*34 bytes at 16-bit x 2 for fp32
    rank = plan_dry_run(cfg("training.global_batch=4", "training.micro_batch=4", "training.seq_len=64"), 1).ranks[0]
    assert rank.activation_bytes == 4 * 64 * 4 * 128 * 34 * 2


def test_dry_run_activation_estimate_falls_with_checkpointing_bf16_and_sequence_parallel():
    def act(*overrides, nproc=2):
        return plan_dry_run(cfg("parallel.tp=2", "training.global_batch=4", *overrides), nproc,
                            gpus_per_node=2).ranks[0].activation_bytes

    assert act() > act("training.activation_checkpointing=selective") > act("training.activation_checkpointing=full")
    assert act("training.precision=bf16") == act() // 2
    assert act("parallel.sequence_parallel=true") < act()
