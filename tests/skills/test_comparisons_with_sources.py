"""Comparisons with sources (issue 24, item 6): each ablation row carries the matching MegaScale
item with the scale and hardware difference; S7 sets the baseline against shipped MLPerf Training
results of the same hardware generation, source and round named, or says there is none; the
wording follows the hardware the run used. A reference system appears only where the run's
hardware and scale make it comparable (GPUs, within a factor of ten of its accelerator count);
otherwise one line says why not (issue 39, item 3)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainops.skills import sop
from trainops.skills.evidence import references
from trainops.skills.evidence.model import ReliabilitySummary
from trainops.skills.evidence.pack import assemble
from trainops.skills.evidence.render import to_markdown
from trainops.workspace import runs_dir

HOPPER = "NVIDIA H200 (Hopper (NVIDIA H200, sm_90))"


def _gpu(factories, hardware=HOPPER):
    return factories.environment().model_copy(update={"hardware": hardware, "backend": "nccl",
                                                      "accelerator_kind": "gpu"})


def test_each_mlperf_row_names_its_round_and_a_source_url():
    rows = references.published()["mlperf_training"]
    assert rows and all(r["round"].startswith("MLPerf Training v") and r["url"].startswith("http") and r["source"]
                        for r in rows)


def test_an_ablation_row_carries_the_matching_megascale_item_with_the_scale_difference(factories):
    row = factories.ablation().model_copy(update={"category": "communication-overlap", "knob": "comm_overlap",
                                                  "value": "true", "scale": "2048 procs"})
    (annotated,) = references.annotate([row], _gpu(factories), 2048, "llama3-70b")
    assert "3D parallel communication overlap +6.2 MFU points" in annotated.reference
    assert "MegaScale 175B-parameter LLM on 12,288 GPUs, this run llama3-70b on 2048 GPUs" in annotated.reference
    assert "arXiv 2402.15627" in annotated.reference


def test_an_arm_no_published_item_matches_says_so(factories):
    row = factories.ablation().model_copy(update={"category": "memory", "knob": "activation_checkpointing",
                                                  "scale": "2048 procs"})
    (annotated,) = references.annotate([row], _gpu(factories), 2048, "llama3-70b")
    assert annotated.reference.startswith("no item of MegaScale's breakdown matches a memory arm")


def test_a_cpu_arm_gets_one_line_saying_megascale_is_not_comparable(factories):
    row = factories.ablation().model_copy(update={"category": "communication-overlap", "scale": "tiny, 1 procs"})
    (annotated,) = references.annotate([row], factories.environment(), 2, "tiny")
    assert annotated.reference == ("MegaScale: 1 CPU process vs MegaScale's 12,288 GPUs: not comparable "
                                   "(this run has no GPUs)")


def test_a_small_gpu_run_is_not_compared_with_systems_ten_times_its_scale(factories):
    notes = sop.reference_notes(_gpu(factories), 8, "llama3-8b")
    assert notes == [
        "MegaScale: 8 GPUs vs MegaScale's 12,288 GPUs: not comparable (more than 10x this run's scale)",
        "MLPerf Training: 8 GPUs vs the same-generation (Hopper) results' 3,584 to 11,616 accelerators: not "
        "comparable (more than 10x this run's scale)",
        "Llama 3: 8 GPUs vs Llama 3's 16,384 H100 GPUs: not comparable (more than 10x this run's scale)"]
    assert references.mlperf(_gpu(factories), 8).same_generation == []


def test_a_cpu_pack_reports_each_reference_system_in_one_line(factories):
    run = factories.write_run(runs_dir() / "base-1")
    env = factories.environment()
    rows = references.annotate([factories.ablation(), factories.ablation(change=13.0)], env, 2, "tiny")
    pack = assemble("pack-cpu", env, factories.baseline([str(run)]), rows, [], [],
                    references=sop.reference_notes(env, 2, "tiny"), mlperf=references.mlperf(env, 2))
    markdown = to_markdown(pack)
    assert markdown.count("MegaScale's 12,288 GPUs: not comparable") == 1  # the arms share one line
    assert "MFU points" not in markdown and "communication overlap the largest" not in markdown
    assert "reports no MFU" not in markdown and "Llama 3's 16,384 H100 GPUs: not comparable" in markdown


def test_a_gpu_run_is_worded_in_gpus_and_compared_with_same_generation_mlperf(factories):
    notes = sop.reference_notes(_gpu(factories), 4096, "llama3-70b")
    assert not any("CPU process" in n for n in notes)
    assert any("this run llama3-70b on 4096 GPUs" in n for n in notes)
    comparison = references.mlperf(_gpu(factories), 4096)
    assert comparison.generation == "Hopper" and comparison.same_generation
    assert {r.generation for r in comparison.same_generation} == {"Hopper"}
    assert any("MLPerf Training v4.0 (2024-06), GPT-3 175B: NVIDIA (Eos), 11,616 H100, 3.4 min" in n for n in notes)
    assert "not MFU" in comparison.comparable or "no MFU" in comparison.comparable


def test_a_cpu_run_has_no_same_generation_result(factories):
    comparison = references.mlperf(factories.environment(), 2)
    assert comparison.generation is None and comparison.same_generation == []
    assert comparison.verdict.startswith("no same-generation result")
    assert "MLPerf Training: no same-generation result" in "\n".join(sop.reference_notes(factories.environment(), 2,
                                                                                           "tiny"))


def test_a_generation_without_rows_says_there_is_none(factories):
    comparison = references.mlperf(_gpu(factories, "NVIDIA A100-SXM4-80GB (Ampere (NVIDIA A100-SXM4-80GB, sm_80))"),
                                   4096)
    assert comparison.generation == "Ampere" and comparison.verdict.startswith("no same-generation result")


def test_the_report_has_an_s7_section_with_the_mlperf_table_and_the_row_references(factories):
    run = factories.write_run(runs_dir() / "base-1")
    env = _gpu(factories)
    rows = references.annotate([factories.ablation().model_copy(update={"scale": "4096 procs"})], env, 4096, "tiny")
    pack = assemble("pack-s7", env, factories.baseline([str(run)]), rows, [], [],
                    references=sop.reference_notes(env, 4096, "tiny"), mlperf=references.mlperf(env, 4096))
    markdown = to_markdown(pack)
    s7 = markdown[markdown.index("## S7 Comparisons with published results"):]
    assert "MLPerf Training v4.0" in s7 and "blogs.nvidia.com" in s7 and "time to train" in s7
    assert "data pipeline optimisation +1.1 MFU points" in markdown  # the data_kind arm's reference


@pytest.mark.slow
def test_the_quick_sop_pack_compares_with_sources_in_cpu_wording(quick_sop):
    pack = Path(quick_sop["pack_dir"])
    evidence = json.loads((pack / "evidence.json").read_text())
    assert evidence["ablations"] and all(r["reference"] for r in evidence["ablations"])
    assert evidence["mlperf"]["verdict"].startswith("no same-generation result")
    report = (pack / "report.md").read_text()
    assert "## S7 Comparisons with published results" in report and "CPU processes" in report


def test_each_published_figure_names_its_evidence_level():
    data = references.published()
    assert set(data["levels"]) == {"A", "B", "C"}
    entries = [data["megascale"], data["llama3"], *data["mlperf_training"]]
    assert all(entry["level"] in data["levels"] for entry in entries)


def test_a_comparable_gpu_run_sets_its_measured_figures_beside_theirs_with_the_level(factories):
    """K-STEP-7 / K-DOD-1: where a reference is comparable, the run's own measured figure stands beside
    the published one, with the source's evidence level: context, never a target."""
    baseline = factories.baseline(["r1"])
    rel = ReliabilitySummary(as_of=0.0, interruptions=6, unplanned=5, span_h=48.0, interruption_rate_per_day=2.5,
                             mtbf_h=9.6, mtbf_source="measured from 5 recorded interruptions", mtbf_measured=True,
                             mtbf_level="measured", recovery_time_s=40.0, cause_distribution={"hardware": 5},
                             ettr_window_s=3600.0)
    summary = baseline.model_copy(update={"mfu_pct": baseline.mfu_pct.model_copy(update={"median": 38.5}),
                                          "reliability": rel})
    notes = sop.reference_notes(_gpu(factories), 4096, "llama3-70b", summary)
    mega = next(n for n in notes if "reports MFU 55.2%" in n)
    assert "this run's MFU 38.5% (S2 median) on 4096 GPUs" in mega and "evidence level A" in mega
    assert all("evidence level B" in n for n in notes if n.startswith("MLPerf Training v"))
    llama = next(n for n in notes if n.startswith("Llama 3 ("))
    assert "419 unexpected interruptions in 54 days" in llama and "(7.8 a day)" in llama
    assert "this run's interruptions: 2.5 a day in this workspace's record" in llama
    assert "evidence level A" in llama and "arxiv.org/abs/2407.21783" in llama
    unmeasured = sop.reference_notes(_gpu(factories), 4096, "llama3-70b")
    assert any("this run's MFU not measured" in n for n in unmeasured)
