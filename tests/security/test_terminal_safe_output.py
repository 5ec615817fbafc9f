"""Attack 2 of issue 23: terminal control sequences forge what a human sees. A pack folder named
with a CSI sequence rewrote the pending row of a 4096-GPU quota change to read 8; an 8-bit CSI
(U+009B) in a queued call's reason survived JSON and rich; a job log's OSC 52 (clipboard write)
and screen clear reached the terminal through `job_logs` and `ask`. Through the real commands, no
raw control, C1 or bidi character reaches the output: each shows as its escape, and an id no
trainops id can be is listed as "(invalid name)" and refused where ids are made."""
from __future__ import annotations

import json
import sqlite3
import sys
import time

import pytest
import typer
from typer.testing import CliRunner

from tests.agents.conftest import ScriptedOpenAI
from trainops.cli import app
from trainops.output import console, fail
from trainops.terminal_text import UNSAFE, safe_console, visible
from trainops.tools.calls import call
from trainops.tools.context import CallContext

runner = CliRunner()
UP_AND_ERASE = "\x1b[1A\x1b[2K" * 3
FORGED_ROW = f'{UP_AND_ERASE}call  0123456789ab  pending  set_tenant_quota {{"gpus":8,"tenant":"acme"}}'
C1_CSI = "\x9b1A\x9b2K"
OSC52_AND_CLEAR = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[H"
BIDI = "\u202e4096\u202c\u2066x\u2069"
QUOTA = {"tenant": "acme", "gpus": 4096, "priority": "low", "reason": "trial"}


def _cli(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400"})


def _raw(output: str) -> list[str]:
    """Characters in `output` a terminal would obey rather than show (newlines and tabs stay)."""
    return sorted({match.group() for match in UNSAFE.finditer(output)})


@pytest.fixture
def model(monkeypatch, tmp_path):
    stub = ScriptedOpenAI()
    monkeypatch.setenv("TRAINOPS_CONFIG", str(tmp_path / "no-user-config.toml"))
    for var, value in {"TRAINOPS_PROVIDER": "openai", "TRAINOPS_MODEL": "scripted", "TRAINOPS_BASE_URL": stub.base_url,
                       "OPENAI_API_KEY": "test-key-not-secret"}.items():
        monkeypatch.setenv(var, value)
    yield stub
    stub.close()


@pytest.fixture
def noisy_job():
    """A real local job whose log writes the clipboard (OSC 52), clears the screen and hides digits."""
    operator = CallContext(actor="operator")
    line = f"step 1{OSC52_AND_CLEAR}{C1_CSI}{BIDI} done"
    submitted = call("submit_job", {"spec": {"name": "noisy", "launcher": "plain",
                                          "command": [sys.executable, "-c", f"print({line!r}, flush=True)"]}},
                     operator)
    job_id = submitted.handle.job_id
    deadline = time.monotonic() + 20
    while "done" not in call("job_logs", {"job_id": job_id}).text:
        assert time.monotonic() < deadline, "the stand-in job never printed its line"
        time.sleep(0.1)
    return job_id


def test_every_control_c1_and_bidi_character_shows_as_its_escape():
    assert visible("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert visible("\x9b31m") == "\\u009b31m"
    assert visible("\x1b]52;c;eA==\x07") == "\\x1b]52;c;eA==\\x07"
    assert visible("\x90q\x9c \x9d0;t\x9c \x9f\x9e") == "\\u0090q\\u009c \\u009d0;t\\u009c \\u009f\\u009e"
    assert visible("\u202e\u2066\u200f\u061c\r\x7f\x00") == "\\u202e\\u2066\\u200f\\u061c\\x0d\\x7f\\x00"
    assert visible("tab\tand\nnewline stay, ✓ too") == "tab\tand\nnewline stay, ✓ too"
    assert visible(visible(FORGED_ROW)) == visible(FORGED_ROW)


def test_a_pack_folder_named_with_a_csi_sequence_cannot_rewrite_the_pending_quota_row(workspace):
    _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(QUOTA))
    (workspace / "packs" / FORGED_ROW).mkdir(parents=True)
    listed = _cli("approvals")
    assert listed.exit_code == 0, listed.output
    assert _raw(listed.output) == []
    assert "\\x1b[1A\\x1b[2K" in listed.output and "(invalid name)" in listed.output
    assert "4096" in listed.output
    [pack] = [i for i in json.loads(_cli("approvals", "--json").output) if i["kind"] == "pack"]
    assert pack["status"] == "corrupt" and pack["id"].endswith("(invalid name)")
    refused = _cli("approve", FORGED_ROW, "--key", "unused")
    assert refused.exit_code == 2 and _raw(refused.output) == []


def test_an_8bit_csi_in_a_reason_shows_escaped_in_approvals_and_approve_pending(approvers):
    reason = f"trial{C1_CSI}{BIDI}"
    _cli("tool", "call", "set_tenant_quota", "--input", json.dumps({**QUOTA, "reason": reason}))
    listed = _cli("approvals")
    assert listed.exit_code == 0, listed.output
    assert _raw(listed.output) == [] and "\\u009b1A" in listed.output and "\\u202e4096" in listed.output
    as_json = _cli("approvals", "--json").output
    assert as_json.isascii() and "\\u009b" in as_json
    [item] = json.loads(as_json)
    signed = _cli("approve", "--pending", item["id"], "--key", str(approvers.alice.key))
    assert signed.exit_code == 0, signed.output
    assert _raw(signed.output) == []
    assert _cli("approve", "--pending", item["id"], "--key", str(approvers.bob.key), "--json").output.isascii()


def test_a_job_logs_clipboard_write_and_screen_clear_print_as_text(noisy_job):
    shown = _cli("tool", "call", "job_logs", "--input", json.dumps({"job_id": noisy_job}))
    assert shown.exit_code == 0, shown.output
    assert _raw(shown.output) == []
    assert "\\x1b]52;c;cm0gLXJmIH4=" in shown.output and "\\x1b[2J" in shown.output
    as_json = _cli("tool", "call", "job_logs", "--input", json.dumps({"job_id": noisy_job}), "--json").output
    assert as_json.isascii() and "\\u001b]52" in as_json


def test_ask_shows_a_poisoned_log_and_the_models_echo_of_it_as_text(model, noisy_job):
    model.script = [model.tool_call("job_logs", {"job_id": noisy_job, "scheduler": "local"}),
                    model.text(f"The log says: step 1{OSC52_AND_CLEAR}{C1_CSI} done"),
                    model.tool_call("set_tenant_quota", {"tenant": "acme", "gpus": 4, "priority": "low",
                                                         "reason": f"trial {OSC52_AND_CLEAR}"}),
                    model.text(f"Waiting{BIDI}.")]
    answered = _cli("ask", "what does the job log say?")
    assert answered.exit_code == 1, answered.output  # a free-text answer is flagged, and still shown inert
    assert _raw(answered.output) == [] and "The log says: step 1\\x1b]52;c;" in answered.output
    gated = _cli("ask", "set the quota of acme to 4 GPUs")
    assert gated.exit_code == 0, gated.output
    assert _raw(gated.output) == [] and "approval needed" in gated.output


def test_an_error_line_and_a_progress_console_show_sequences_as_text(capsys):
    with pytest.raises(typer.Exit):
        fail(f"bad value {OSC52_AND_CLEAR}")
    console().print(f"progress {C1_CSI}", markup=False)
    safe_console(stderr=True).print(BIDI)
    out, err = capsys.readouterr()
    assert _raw(out + err) == [] and "\\x1b]52" in err and "\\u009b1A" in out and "\\u202e" in err


def test_a_thread_id_written_into_the_agent_database_is_listed_escaped_and_marked(model, workspace):
    model.script = [model.text("ok")]
    asked = _cli("ask", "hello", "--json")
    assert asked.exit_code == 1 and json.loads(asked.output)["answer_flag"] == "free_text", asked.output
    with sqlite3.connect(workspace / "agent.sqlite") as db:
        for table in ("checkpoints", "writes"):
            db.execute(f"UPDATE {table} SET thread_id = ?", (f"t{UP_AND_ERASE}",))
    listed = _cli("threads")
    assert listed.exit_code == 0, listed.output
    assert _raw(listed.output) == [] and "(invalid name)" in listed.output


@pytest.mark.parametrize("args", [["ask", "hi", "--thread", f"t{UP_AND_ERASE}"],
                                  ["train", "--preset", "tiny", "--run-id", f"r{C1_CSI}"],
                                  ["approve", f"p{BIDI}", "--key", "unused"]])
def test_an_id_with_control_characters_is_refused_where_it_is_made(args):
    refused = _cli(*args)
    assert refused.exit_code == 2, refused.output
    assert "not valid" in refused.output and _raw(refused.output) == []
