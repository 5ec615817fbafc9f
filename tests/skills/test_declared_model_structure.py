"""Declared model structure (issue 42 item 2, A-ENV-3): a run's labels carry its sequence length and
whether the model is dense or a mixture of experts, with the expert count and top-k, read from the
run's own RUN/config.toml, and the report shows them beside the model; a structure that cannot be
is refused naming the setting and the fix."""
from __future__ import annotations

import shutil

import pytest
from pydantic import ValidationError

from trainops.run_records import read_metrics
from trainops.skills import planning
from trainops.skills.baseline import RepeatResult, summarize
from trainops.skills.evidence.model import JobLabels
from trainops.skills.evidence.pack import assemble
from trainops.skills.evidence.render import to_html, to_markdown
from trainops.skills.labels import job_labels
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import FrameworkJob
from trainops.tools.jobs.jobs import summarize_records
from trainops.trainer.config import load_config
from trainops.workspace import runs_dir

MOE = ["megatron.num_experts=8", "megatron.moe_router_topk=2", "training.seq_len=128"]


def _megatron_run(tmp_path, factories, overrides: list[str]) -> str:
    """A Megatron job's run folder as its adapter writes it, with the metrics a run leaves."""
    script = tmp_path / "pretrain_gpt.py"
    script.write_text("")
    job = get_adapter("megatron").build_job(FrameworkJob(name="m", config=str(script), nproc=2, overrides=overrides))
    metrics = factories.write_run(tmp_path / "metrics-only") / "metrics.jsonl"
    shutil.copy(metrics, f"{job.run_dir}/metrics.jsonl")
    return job.run_dir


def _megatron_env(factories):
    return factories.environment().model_copy(update={"framework": "Megatron-LM"})


def _trainer_env(factories):
    return factories.environment().model_copy(update={"framework": "trainops-embedded-trainer"})


def test_a_megatron_moe_run_is_labelled_with_its_experts_top_k_and_seq_len(tmp_path, factories):
    run = _megatron_run(tmp_path, factories, MOE)
    labels = job_labels(run, JobRequest(framework="megatron"), 2, _megatron_env(factories))
    assert (labels.architecture, labels.experts, labels.top_k, labels.seq_len) == ("moe", 8, 2, 128)
    assert "config.toml" in labels.sources["seq_len"] and "megatron.num_experts" in labels.sources["architecture"]


def test_megatron_s_default_top_k_is_labelled_as_its_default(tmp_path, factories):
    run = _megatron_run(tmp_path, factories, ["megatron.num_experts=4"])
    labels = job_labels(run, JobRequest(framework="megatron"), 2, _megatron_env(factories))
    assert (labels.architecture, labels.experts, labels.top_k) == ("moe", 4, 2)
    assert "default" in labels.sources["top_k"]


def test_a_megatron_run_without_experts_is_dense(tmp_path, factories):
    run = _megatron_run(tmp_path, factories, [])
    labels = job_labels(run, JobRequest(framework="megatron"), 2, _megatron_env(factories))
    assert (labels.architecture, labels.experts, labels.top_k, labels.seq_len) == ("dense", None, None, 64)


def test_the_embedded_trainer_s_run_is_dense_with_its_config_s_seq_len(tmp_path, factories):
    run = factories.write_run(tmp_path / "run")
    (run / "config.toml").write_text(load_config(preset="tiny", overrides=["training.seq_len=96"]).to_toml())
    labels = job_labels(str(run), JobRequest(), 2, _trainer_env(factories))
    assert (labels.architecture, labels.experts, labels.top_k, labels.seq_len) == ("dense", None, None, 96)
    assert "dense" in labels.sources["architecture"]


def test_a_torchtitan_run_takes_seq_len_from_its_job_toml_and_says_why_its_structure_is_unknown(tmp_path, factories):
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "debugmodel"\n\n[training]\nseq_len = 2048\n')
    job = get_adapter("torchtitan").build_job(FrameworkJob(name="t", config=str(toml), nproc=2))
    env = factories.environment().model_copy(update={"framework": "torchtitan"})
    labels = job_labels(job.run_dir, JobRequest(framework="torchtitan"), 2, env)
    assert (labels.seq_len, labels.architecture) == (2048, None) and "job.toml" in labels.sources["seq_len"]
    assert "model registry" in labels.sources["architecture"]
    assert labels.structure() == "dense or MoE not in the run folder, seq_len 2048"


def test_the_pack_and_both_reports_show_the_declared_structure(tmp_path, factories):
    run = _megatron_run(tmp_path, factories, MOE)
    result = RepeatResult(job_id="j", run_dir=run, summary=summarize_records(run, read_metrics(run), 2), started=0,
                          ended=1, world_size=2)
    baseline = summarize(JobRequest(framework="megatron"), [result], env=_megatron_env(factories))
    assert (baseline.labels.architecture, baseline.labels.experts, baseline.labels.top_k) == ("moe", 8, 2)
    pack = assemble("pack-moe", _megatron_env(factories), baseline, [], [], [])
    for report in (to_markdown(pack), to_html(pack)):
        assert "MoE, 8 experts, top-2, seq_len 128" in report


def test_a_dense_run_s_report_says_dense_and_its_seq_len(factories):
    run = factories.write_run(runs_dir() / "base-1")
    result = RepeatResult(job_id="j", run_dir=str(run), summary=summarize_records(str(run), read_metrics(run), 2),
                          started=0, ended=1, world_size=2)
    baseline = summarize(JobRequest(), [result], env=_trainer_env(factories))
    assert "dense, seq_len 64" in to_markdown(assemble("pack-dense", _trainer_env(factories), baseline, [], [], []))


def test_a_top_k_above_the_expert_count_is_refused_naming_the_setting(tmp_path, factories):
    run = _megatron_run(tmp_path, factories, ["megatron.num_experts=4", "megatron.moe_router_topk=6"])
    with pytest.raises(ToolError, match=r"megatron.moe_router_topk=6 exceeds megatron.num_experts=4.*at most 4"):
        job_labels(run, JobRequest(framework="megatron"), 2, _megatron_env(factories))


def test_a_single_expert_is_refused_naming_the_setting(tmp_path, factories):
    run = _megatron_run(tmp_path, factories, ["megatron.num_experts=1"])
    with pytest.raises(ToolError, match=r"megatron.num_experts=1.*omit it for a dense model"):
        job_labels(run, JobRequest(framework="megatron"), 2, _megatron_env(factories))


def test_labels_that_call_a_model_moe_without_its_experts_are_refused():
    base = {"model": "m", "precision": "bf16", "parallel_layout": "world=2", "world_size": 2, "framework": "f",
            "framework_version": "1", "hardware": "cpu"}
    with pytest.raises(ValidationError, match="architecture='moe' needs experts and top_k"):
        JobLabels(**base, architecture="moe", experts=8)
    with pytest.raises(ValidationError, match="architecture='dense' has no experts"):
        JobLabels(**base, architecture="dense", experts=8, top_k=2)


def test_the_sop_plan_budgets_ep_from_the_declared_shape_and_the_report_says_how(factories):
    """sop_declare's MoE shape without a hand-typed ep: the plan derives it and says the rule."""
    env = factories.environment().model_copy(update={"scale_up_domain": 4, "accelerator_kind": "gpu"})
    plan = planning.layout_plan(JobRequest(preset="tiny", nproc=4, nodes=2, overrides=["training.micro_batch=1"]), env,
                                 {"experts": 8, "top_k": 2})
    assert plan.topology.expert_parallel.ep == 4
    run = factories.write_run(runs_dir() / "base-1")
    pack = assemble("pack-ep", factories.environment(), factories.baseline([str(run)]), [], [], [], layout_plan=plan)
    markdown = to_markdown(pack)
    assert "8 experts, top-2, ep=4 (derived:" in markdown
