"""`trainops ask`, `chat` and `threads`: JSON output, clean one-line errors, and a thread
paused for approval in one process and decided in another (two processes, one SQLite db)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def trainops(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINOPS_APPROVER": "carol"}
    return subprocess.run([sys.executable, "-c", "from trainops.cli import app; app()", *args], input=stdin,
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


def test_ask_json_gives_thread_answer_and_tool_calls():
    result = runner.invoke(app, ["ask", "plan the checkpoint interval for a 5-minute save and an MTBF of 3 hours",
                                 "--json", "--thread", "cli1"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["thread_id"] == "cli1" and out["provider"] == "offline"
    assert out["tool_calls"] == [{"tool": "plan_checkpoint_interval", "status": "success"}]
    assert out["answer"].startswith("Checkpoint every 39.2 min") and out["pending_approvals"] == []
    timing = out["timing"]
    assert 0 < timing["tool_s"] < timing["wall_s"]
    assert timing["agent_overhead_s"] == pytest.approx(timing["wall_s"] - timing["tool_s"])


def test_ask_turns_a_gated_action_into_a_pending_approval():
    out = json.loads(runner.invoke(app, ["ask", "drill a straggler on run r1", "--json", "--thread", "g1"]).stdout)
    assert out["answer"] is None and out["resume"] == "trainops chat --thread g1"
    assert out["pending_approvals"][0]["tool"] == "inject_fault"


def test_threads_json_lists_threads():
    runner.invoke(app, ["ask", "show pending approvals", "--thread", "t-list"])
    result = runner.invoke(app, ["threads", "--json"])
    assert result.exit_code == 0
    threads = json.loads(result.stdout)
    assert [t["thread_id"] for t in threads] == ["t-list"]
    assert Path(threads[0]["transcript"]).is_file()


def test_a_bad_thread_id_is_one_line_naming_the_option():
    result = runner.invoke(app, ["ask", "hi", "--thread", "../escape", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"].startswith("--thread: thread id '../escape' is not valid")


def test_a_missing_api_key_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = runner.invoke(app, ["ask", "hi", "--provider", "openai", "--json"])
    assert result.exit_code == 2
    assert "environment variable OPENAI_API_KEY is not set" in json.loads(result.stdout)["error"]


@pytest.mark.slow
def test_interrupt_in_one_process_is_approved_in_another(alice_ssh_agent):
    """The approver signs with the key in their ssh-agent, as at a terminal."""
    first = trainops("ask", "drill a straggler on run r1", "--thread", "restart", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["pending_approvals"][0]["args"] == {"kind": "straggler", "run": "r1"}
    second = trainops("chat", "--thread", "restart", stdin="approve\n/exit\n")
    assert second.returncode == 0, second.stderr
    assert "straggler is a launch-time fault" in second.stdout
    assert "faults.slow_rank=0" in second.stdout
    home = Path(os.environ["TRAINOPS_HOME"])
    decisions = [json.loads(line) for line in (home / "transcripts" / "restart.jsonl").read_text().splitlines()]
    approved = next(d for d in decisions if d.get("decision") == "approved")
    assert {"decision": "approved", "approver": "carol"}.items() <= approved.items()


def test_an_unreachable_endpoint_is_one_line_naming_base_url(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    result = runner.invoke(app, ["ask", "hi", "--provider", "openai", "--base-url", "http://127.0.0.1:1/v1", "--json"])
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error.startswith("cannot reach the openai endpoint at base_url=http://127.0.0.1:1/v1 (from --base-url)")


def test_asking_a_thread_that_waits_for_a_decision_says_how_to_decide():
    runner.invoke(app, ["ask", "drill a straggler on run r1", "--thread", "busy"])
    result = runner.invoke(app, ["ask", "show pending approvals", "--thread", "busy", "--json"])
    assert result.exit_code == 2
    assert "decide it first (trainops chat --thread busy)" in json.loads(result.stdout)["error"]


def test_chat_streams_from_an_openai_compatible_server_and_asks_for_approval_inline(scripted_openai, alice_ssh_agent):
    scripted_openai.script = [scripted_openai.tool_call("inject_fault", {"kind": "straggler", "run": "r1"}),
                              scripted_openai.text("Launch with faults.slow_rank=0.")]
    result = runner.invoke(app,
                           ["chat", "--thread", "c1", "--provider", "openai", "--base-url", scripted_openai.base_url,
                                 "--approver", "dana"], input="slow down rank 0\napprove\n/exit\n")
    assert result.exit_code == 0, result.output
    assert "approval needed inject_fault (risk mutate)" in result.output
    assert "✓ inject_fault" in result.output and "Launch with faults.slow_rank=0." in result.output
    assert all(request["stream"] for request in scripted_openai.requests)


def test_leaving_chat_at_an_approval_prompt_keeps_the_approval_pending():
    runner.invoke(app, ["ask", "drill a straggler on run r1", "--thread", "left"])
    result = runner.invoke(app, ["chat", "--thread", "left"], input="")
    assert result.exit_code == 0, result.output
    threads = json.loads(runner.invoke(app, ["threads", "--json"]).stdout)
    assert threads[0]["pending_approvals"] == 1
