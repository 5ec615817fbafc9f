"""K-FM-1 and K-STEP-5 through `trainops tool call plan_layout`: a tensor parallel that crosses the
scale-up domain is refused with what it costs now and the layouts that keep it inside, each with
its own cost from the model's shape (and why one does not fit); a pipeline says its bubble."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from trainops.cli import app

runner = CliRunner()
LLAMA_8B = {"preset": "llama3-8b", "nproc": 16, "nodes": 2, "scale_up_domain": 4, "intra_node_gbit_s": 3600,
            "inter_node_gbit_s": 400, "overrides": ["parallel.tp=8", "training.global_batch=64",
                                                    "training.micro_batch=1", "training.seq_len=4096",
                                                    "training.precision=bf16"]}


def _plan(**inp) -> dict:
    result = runner.invoke(app, ["tool", "call", "plan_layout", "--input", json.dumps(inp), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_tp_across_domains_is_refused_with_the_layouts_that_keep_it_inside_and_their_cost():
    out = _plan(**LLAMA_8B)
    assert out["valid"] is False
    options = out["alternatives"]
    assert {(o["tp"], o["moved_to"]) for o in options} == {(t, m) for t in (4, 2, 1) for m in ("pp", "dp")}
    assert all(o["fits"] for o in options)
    first = options[0]
    assert (first["tp"], first["pp"], first["dp"]) == (4, 2, 2)
    assert first["bubble_fraction"] == round(1 / 33, 3)  # 64 sequences / dp 2 = 32 micro-batches
    # each layout that keeps tp inside moves fewer tp bytes than tp=8 does now, at the faster link
    now = 4 * 32 * 32 * 4096 * 4096 * 2 * 2 * 7 / 8
    assert all(o["tp_bytes_per_step"] < now for o in options)
    dp_move = next(o for o in options if (o["tp"], o["moved_to"]) == (4, "dp"))
    assert dp_move["dp"] == 4 and dp_move["extra_dp_bytes_per_step"] > 0 and dp_move["extra_dp_seconds"] > 0
    assert f"now tp moves {now / 1e9:.1f} GB per rank per step across domains" in out["error"]
    assert "instead: tp=4 pp=2 dp=2" in out["error"]


def test_when_no_layout_keeps_tp_inside_each_says_why_it_does_not_fit():
    out = _plan(preset="tiny", nproc=4, nodes=2, scale_up_domain=1,
                overrides=["parallel.tp=2", "training.global_batch=2", "training.micro_batch=1"])
    by_move = {o["moved_to"]: o for o in out["alternatives"]}
    assert set(by_move) == {"pp", "dp"} and not any(o["fits"] for o in by_move.values())
    assert "micro-batches" in by_move["pp"]["why_not"] and "global_batch" in by_move["dp"]["why_not"]
    assert "no smaller tp fits this model and batch" in out["error"]


def test_a_pipeline_says_its_bubble_and_when_it_does_not_pay():
    out = _plan(preset="tiny", nproc=4, overrides=["parallel.pp=4", "training.global_batch=4",
                                                   "training.micro_batch=1"])
    assert out["valid"] is True and out["alternatives"] == []
    pipe = out["pipeline"]
    assert pipe["micro_batches"] == 4 and pipe["bubble_fraction"] == round(3 / 7, 3)
    assert "raise the micro-batches per step to at least 16" in pipe["verdict"]
    assert _plan(preset="tiny", nproc=2)["pipeline"] is None
