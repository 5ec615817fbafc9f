"""Framework adapters: the registry, knobs in each framework's own vocabulary, refusals of flag
combinations the framework forbids (before any process starts), and job specs."""
from __future__ import annotations

import json
from importlib.metadata import version

import pytest
from deepspeed.runtime.config import DeepSpeedConfig

from trainops.skills.drill.drill import DRILLS
from trainops.skills.knobs import CATALOGUE, CATEGORY_ORDER, catalogue, parse_arm
from trainops.skills.sop_session import SopSettings
from trainops.tools.calls import call
from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import FrameworkJob, FrameworkRefused, known_frameworks


def test_unknown_framework_is_refused_listing_the_known_ones():
    with pytest.raises(FrameworkRefused,
                       match=r"unknown framework 'jax'; use one of trainops, deepspeed, torchtitan, megatron"):
        get_adapter("jax")


@pytest.mark.parametrize("name", known_frameworks())
def test_every_knob_names_its_framework_flag_and_a_plan_category(name):
    knobs = get_adapter(name).knobs()
    assert knobs and len({k.name for k in knobs}) == len(knobs)
    for knob in knobs:
        assert knob.category in CATEGORY_ORDER and knob.flag and knob.values and knob.expected_effect


def test_the_embedded_trainer_adapter_offers_the_sop_catalogue():
    adapter = {k.name: (k.override, k.values, k.category) for k in get_adapter("trainops").knobs()}
    catalogue = {k.name: (k.overrides[0], k.values, k.category) for k in CATALOGUE.values()}
    assert adapter == catalogue


def test_a_sop_knob_names_the_frameworks_own_flag_where_it_is_not_the_key_the_knob_sets():
    trainer, deepspeed = catalogue("trainops")["micro_batch"], catalogue("deepspeed")["micro_batch"]
    assert trainer.overrides == ("training.micro_batch",) and trainer.expected_effect.startswith("larger micro-batches")
    assert deepspeed.expected_effect.startswith("train_micro_batch_size_per_gpu: ")


def test_versions_are_the_installed_ones_or_say_not_installed():
    assert get_adapter("deepspeed").version() == version("deepspeed")
    assert get_adapter("trainops").version() == version("trainops")
    # its wheel pulls datasets/pyarrow/wandb: not installed here
    assert get_adapter("torchtitan").version() == "not installed"


# --- refusals before launch -------------------------------------------------------------------

@pytest.mark.parametrize(("framework", "knobs", "overrides", "message"), [
    ("deepspeed", {"offload_param": "cpu"}, [],
     r"offload_param.device='cpu' needs ZeRO stage 3 \(got zero_optimization.stage=1\)"),
    ("deepspeed", {"offload_optimizer": "cpu"}, ["deepspeed.zero_optimization.stage=0"],
     r"needs ZeRO stage >= 1 \(got zero_optimization.stage=0\)"),
    ("deepspeed", {"overlap_comm": "true"}, ["deepspeed.zero_optimization.stage=0"], r"overlap_comm=true .* stage 0"),
    ("deepspeed", {"micro_batch": "8"}, [], r"refused by DeepSpeedConfig \(per data-parallel rank of 2\)"),
    ("deepspeed", {}, ["training.global_batch=9"],
     r"training.global_batch=9 is not divisible by the data-parallel world size \(2\)"),
    ("megatron", {"tp_comm_overlap": "true"}, ["megatron.tensor_model_parallel_size=2"],
     r"--tp-comm-overlap: .*only when sequence parallelism is enabled"),
    ("megatron", {"overlap_param_gather": "true"}, ["megatron.overlap_grad_reduce=true"],
     r"--overlap-param-gather only supported with distributed optimizer"),
    ("megatron", {"overlap_param_gather": "true"}, ["megatron.use_distributed_optimizer=true"],
     r"with --overlap-grad-reduce"),
    ("megatron", {"tensor_model_parallel_size": "4"}, [],
     r"world_size \(2\) is not divisible by tensor_model_parallel_size \(4\)"),
    ("torchtitan", {"tp": "4"}, [], r"WORLD_SIZE \(2\) is not divisible"),
    ("torchtitan", {"dp_shard": "4"}, [],
     r"dp_replicate\(1\) \* dp_shard\(4\) \* cp\(1\) \* tp\(1\) \* pp\(1\) != WORLD_SIZE\(2\)"),
    ("torchtitan", {"async_tp": "true"}, ["torchtitan.parallelism.tensor_parallel_degree=2"],
     r"async TP requires torch.compile"),
    ("torchtitan", {"async_tp": "true"}, ["torchtitan.compile.enable=true"], r"needs tensor parallelism"),
    ("torchtitan", {"pp_schedule": "GPipe"}, [], r"no effect with pipeline_parallel_degree=1"),
])
def test_a_flag_combination_the_framework_forbids_is_refused_naming_the_flag(framework, knobs, overrides, message):
    with pytest.raises(FrameworkRefused, match=message):
        get_adapter(framework).validate(knobs, overrides=overrides, world_size=2)


def test_megatron_core_refuses_sequence_parallel_without_tensor_parallel():
    pytest.importorskip("megatron.core", reason="megatron-core is in the test extra")
    with pytest.raises(FrameworkRefused,
                       match="megatron-core TransformerConfig .*sequence parallelism without tensor parallelism"):
        get_adapter("megatron").validate({"sequence_parallel": "true"}, world_size=2)


@pytest.mark.parametrize(("framework", "knobs", "overrides"), [
    ("deepspeed", {"zero_stage": "2"}, []),
    ("deepspeed", {"offload_param": "cpu"}, ["deepspeed.zero_optimization.stage=3"]),
    ("megatron", {"tp_comm_overlap": "true"},
     ["megatron.tensor_model_parallel_size=2", "megatron.sequence_parallel=true"]),
    ("megatron", {"overlap_param_gather": "true"},
     ["megatron.use_distributed_optimizer=true", "megatron.overlap_grad_reduce=true"]),
    ("torchtitan", {"async_tp": "true"},
     ["torchtitan.parallelism.tensor_parallel_degree=2", "torchtitan.compile.enable=true"]),
])
def test_the_same_flags_with_their_prerequisites_are_accepted(framework, knobs, overrides):
    get_adapter(framework).validate(knobs, overrides=overrides, world_size=2)


@pytest.mark.parametrize("framework", known_frameworks())
def test_a_knob_the_framework_lacks_is_refused_with_its_knobs(framework):
    with pytest.raises(FrameworkRefused, match=rf"{framework} has no knob 'warp_speed'; its knobs: "):
        get_adapter(framework).validate({"warp_speed": "9"})


def test_a_value_the_knob_does_not_take_is_refused_with_the_accepted_ones():
    with pytest.raises(FrameworkRefused, match=r"zero_stage='5' .*zero_optimization.stage.*use one of 0, 1, 2, 3"):
        get_adapter("deepspeed").validate({"zero_stage": "5"})


def test_an_unknown_override_key_is_refused_naming_the_keys_that_exist():
    with pytest.raises(FrameworkRefused, match=r"--set training.warp: unknown key; training takes steps, global_batch"):
        get_adapter("deepspeed").validate({}, overrides=["training.warp=1"])


# --- jobs --------------------------------------------------------------------------------------

def test_deepspeed_job_writes_a_config_deepspeed_itself_accepts(workspace):
    spec = get_adapter("deepspeed").build_job(FrameworkJob(name="ds", nproc=2,
                                                           overrides=["deepspeed.zero_optimization.stage=2"]))
    assert spec.launcher == "torchrun" and spec.procs_per_node == 2
    assert spec.command[:2] == ["-m", "trainops.tools.frameworks.deepspeed_train"]
    ds = json.loads((workspace / "runs" / spec.run_dir.rsplit("/", 1)[-1] / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 2 and ds["train_batch_size"] == 8

    # DeepSpeedConfig sees one rank without a process group
    per_rank = {**ds, "train_batch_size": ds["train_batch_size"] // 2}
    assert DeepSpeedConfig(per_rank).gradient_accumulation_steps == 2


def test_a_refused_deepspeed_job_leaves_no_run_folder(workspace):
    with pytest.raises(FrameworkRefused, match="DeepSpeedConfig"):
        get_adapter("deepspeed").build_job(FrameworkJob(nproc=2, overrides=["training.micro_batch=3"]))
    assert not list((workspace / "runs").glob("run-*"))


def test_megatron_job_runs_pretrain_gpt_with_the_knob_flags(tmp_path):
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("")
    spec = get_adapter("megatron").build_job(FrameworkJob(config=str(script), nproc=2, overrides=[
        "megatron.tensor_model_parallel_size=2", "megatron.sequence_parallel=true", "megatron.tp_comm_overlap=true",
        "checkpoint.enable=true"]))
    command = spec.command
    assert command[0] == str(script)
    assert command[command.index("--tensor-model-parallel-size") + 1] == "2"
    assert ("--sequence-parallel" in command and "--tp-comm-overlap" in command
            and "--overlap-grad-reduce" not in command)
    assert command[command.index("--load") + 1] == get_adapter("megatron").checkpoint_dir(spec.run_dir)


def test_torchtitan_job_passes_knobs_as_its_command_line_overrides(tmp_path):
    config = tmp_path / "debug_model.toml"
    config.write_text("[job]\ndump_folder = './outputs'\n")
    spec = get_adapter("torchtitan").build_job(FrameworkJob(config=str(config), nproc=2, overrides=[
        "torchtitan.activation_checkpoint.mode=full"]))
    assert spec.command[:4] == ["-m", "torchtitan.train", "--job.config_file", str(config)]
    assert spec.command[spec.command.index("--activation_checkpoint.mode") + 1] == "full"
    assert spec.command[spec.command.index("--job.dump_folder") + 1] == spec.run_dir


def test_declared_environment_names_an_adapters_framework_and_installed_version():
    out = call("declare_environment", {"framework": "deepspeed", "ckpt_test_mib": 1, "measure_gemm": False})
    assert (out.framework.name, out.framework.version) == ("DeepSpeed", version("deepspeed"))


@pytest.mark.parametrize(("framework", "overrides", "world", "layout"), [
    ("trainops", ["parallel.tp=2"], 4, "world=4 tp=2"),
    ("deepspeed", ["deepspeed.zero_optimization.stage=3", "deepspeed.zero_optimization.offload_param.device=cpu"], 2,
     "world=2 deepspeed data-parallel ZeRO-3 offload_param=cpu"),
    ("megatron", ["megatron.tensor_model_parallel_size=2", "megatron.sequence_parallel=true"], 8,
     "world=8 megatron tp=2 pp=1 cp=1 dp=4 sequence_parallel"),
    ("torchtitan", ["torchtitan.parallelism.tensor_parallel_degree=2"], 8,
     "world=8 torchtitan dp_replicate=1 dp_shard=-1 cp=1 tp=2 pp=1"),
])
def test_the_layout_an_mfu_claim_names_is_stated_in_the_frameworks_terms(framework, overrides, world, layout):
    assert get_adapter(framework).describe_layout(overrides, world) == layout


def test_the_agent_can_check_a_megatron_job_before_launch():
    out = call("check_framework_job", {"framework": "megatron", "knobs": {"tp_comm_overlap": "true"},
                                       "overrides": ["megatron.tensor_model_parallel_size=2"], "world_size": 8})
    assert not out.accepted and out.refusal.startswith("--tp-comm-overlap: ")
    out = call("check_framework_job", {"framework": "megatron", "knobs": {"tp_comm_overlap": "true"}, "world_size": 8,
                                       "overrides": ["megatron.tensor_model_parallel_size=2",
                                                     "megatron.sequence_parallel=true"]})
    assert out.accepted and out.layout == "world=8 megatron tp=2 pp=1 cp=1 dp=4 sequence_parallel"


def test_the_agent_reads_a_frameworks_knobs_and_version():
    out = call("framework_knobs", {"framework": "deepspeed"})
    assert out.version == version("deepspeed")
    assert {k.name: k.flag for k in out.knobs}["zero_stage"] == "zero_optimization.stage"


@pytest.mark.parametrize("name", known_frameworks())
def test_each_framework_sop_plan_is_runnable_in_its_own_vocabulary(name):
    """The defaults `trainops sop --framework NAME` runs: arms its knobs accept (and its flag rules
    allow at 2 ranks), drills that exist, and checkpoint overrides its settings take."""
    adapter = get_adapter(name)
    plan = adapter.sop_plan
    assert plan.arms and plan.faults
    assert all(fault in DRILLS for fault in plan.faults)
    overrides = [f"{plan.steps_key}=12", *plan.job, *plan.drill]
    for arm in plan.arms:
        knob, value = parse_arm([arm], name)
        adapter.validate({knob.name: value}, overrides=overrides, world_size=2)


def test_sop_settings_take_the_frameworks_plan_and_its_drill_checkpoints():
    quick = SopSettings(framework="deepspeed", quick=True)
    assert (quick.candidates(), quick.drills()) == (["overlap_comm=true", "zero_stage=2"], ["crash"])
    assert "checkpoint.mode=async" not in quick.drill_overrides()  # DeepSpeed saves synchronously here
    assert quick.request().framework == "deepspeed" and "training.steps=10" in quick.request().overrides
    full = SopSettings()
    assert (full.candidates(), full.drills()) == (["data_parallel=ddp", "data_kind=synthetic"],
                                                  ["crash", "hang", "bitflip"])
    assert "checkpoint.mode=async" in full.drill_overrides()
    with pytest.raises(ValueError, match="framework"):
        SopSettings(framework="jax")
