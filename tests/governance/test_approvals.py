"""Human decisions through the CLI, as a person makes them: packs and queued calls are approved or
rejected with the approver's own SSH key, verified against the allowed-signers file, and listed
(with corrupt files named, and untrusted text printed as text)."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from tests.conftest import make_ssh_key
from tests.skills import conftest as factories
from trainops.cli import app
from trainops.commands import governance, rules
from trainops.skills.evidence import pack as pack_module
from trainops.skills.evidence.checks import decide
from trainops.skills.evidence.pack import assemble, write
from trainops.tools.governance import audit, signing, verification
from trainops.tools.governance.approvals import decisions_dir, verify_pack
from trainops.workspace import runs_dir

runner = CliRunner()
QUOTA = {"tenant": "acme", "gpus": 4, "priority": "low", "reason": "trial"}


@pytest.fixture
def pack(workspace, tmp_path, approvers):
    """A pack trainops wrote itself (validated, audited), awaiting a decision."""
    run = factories.write_run(runs_dir() / "base-1")
    record = tmp_path / "drill.json"
    record.write_text("{}")
    drill = factories.drill().model_copy(update={"drill_record": str(record)})
    return write(assemble("pack-1", factories.environment(), factories.baseline([str(run)]),
                          [], [drill], []))


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.rule("R-APR-1", case="compliant")
def test_a_pack_approved_with_the_approvers_key_verifies_against_the_allowed_signers(pack, approvers):
    result = _cli("approve", "pack-1", "--key", approvers.alice.key, "--note", "ship it", "--json")
    assert result.exit_code == 0, result.output
    assert (json.loads(result.output)["decision"], json.loads(result.output)["principal"]) == ("approved", "alice")
    verified = _cli("approvals", "verify", "pack-1", "--json")
    assert verified.exit_code == 0 and json.loads(verified.output)["by"] == "alice"


@pytest.mark.rule("R-APR-1", case="violation")
def test_a_change_to_an_approved_pack_is_detected(pack, approvers):
    decide("pack-1", "approved", key=approvers.alice.key)
    (pack / "report.md").write_text("Verdict: pass (edited after approval)\n")
    result = _cli("approvals", "verify", "pack-1", "--json")
    assert result.exit_code == 1 and json.loads(result.output)["changed"] == ["report.md"]


def test_a_decision_re_signed_with_a_key_that_is_not_an_approver_is_detected(pack, approvers, tmp_path):
    decide("pack-1", "approved", key=approvers.alice.key)
    [path] = sorted(decisions_dir("pack-1").glob("*.json"))
    record = json.loads(path.read_text())
    record["signature"] = signing.sign(b"anything", make_ssh_key(tmp_path / "eve", "eve"))
    path.write_text(json.dumps(record))
    assert not verify_pack("pack-1").ok


def test_reject_without_a_note_is_refused_naming_the_option(pack, approvers):
    result = _cli("reject", "pack-1", "--key", approvers.bob.key, "--note", " ")
    assert result.exit_code == 2 and "--note" in result.output
    assert not decisions_dir("pack-1").exists() or not any(decisions_dir("pack-1").iterdir())


def test_a_pack_rejection_is_signed_by_the_rejecting_approver_and_anchored(pack, approvers):
    result = _cli("reject", "pack-1", "--key", approvers.bob.key, "--note", "recovery time not measured", "--json")
    assert result.exit_code == 0, result.output
    assert (verify_pack("pack-1").decision, verify_pack("pack-1").by) == ("rejected", "bob")
    last = audit.read()[-1]
    assert (last["kind"], last["decision"], last["principal"]) == ("anchor", "rejected", "bob")
    assert verification.verify().ok


def test_an_approved_pack_cannot_be_approved_again(pack, approvers):
    decide("pack-1", "approved", key=approvers.alice.key)
    result = _cli("approve", "pack-1", "--key", approvers.bob.key)
    assert result.exit_code == 2 and "already approved by alice" in result.output


def test_approve_without_a_key_or_an_agent_says_how_to_sign(pack, approvers):
    result = _cli("approve", "pack-1")
    assert result.exit_code == 2 and "--key PATH" in result.output and "Traceback" not in result.output


def test_unknown_pack_gives_one_clear_line(approvers):
    result = _cli("approve", "nope", "--key", approvers.alice.key)
    assert result.exit_code == 2 and "pack 'nope' not found" in result.output and "Traceback" not in result.output


def test_approvals_lists_pending_and_decided_packs_and_calls(workspace, pack, approvers):
    decide("pack-1", "approved", key=approvers.alice.key)
    refused = _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(QUOTA))
    assert refused.exit_code != 0
    items = json.loads(_cli("approvals", "--json").output)
    assert [(i["kind"], i["status"]) for i in items] == [("call", "pending"), ("pack", "approved")]
    assert items[1]["by"] == "alice"


def test_a_pending_call_approved_by_two_approvers_from_the_cli_runs_with_their_token(slurm_accounting, approvers):
    _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(QUOTA))
    [item] = json.loads(_cli("approvals", "--json").output)
    first = _cli("approve", "--pending", item["id"], "--key", approvers.alice.key)
    assert first.exit_code == 0 and "1 more approver(s) must co-sign" in first.output
    token = json.loads(_cli("approve", "--pending", item["id"], "--key", approvers.bob.key, "--json",
                            "--cosign", first.output.split("--cosign ")[1].split()[0]).output)["token"]
    ran = _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(QUOTA), "--approval-token", token, "--json")
    assert ran.exit_code == 0, ran.output
    [decided] = json.loads(_cli("approvals", "--json").output)
    assert (decided["status"], decided["by"]) == ("approved", "alice, bob")


def test_a_pending_call_rejected_from_the_cli_leaves_the_queue_signed_by_the_rejecting_approver(approvers):
    _cli("tool", "call", "set_tenant_quota", "--input", json.dumps({**QUOTA, "gpus": 4096}))
    [item] = json.loads(_cli("approvals", "--json").output)
    result = _cli("reject", "--pending", item["id"], "--key", approvers.bob.key, "--note", "exceeds the cluster")
    assert result.exit_code == 0, result.output
    [decided] = json.loads(_cli("approvals", "--json").output)
    assert (decided["status"], decided["by"]) == ("rejected", "bob") and "exceeds the cluster" in decided["detail"]
    assert audit.read()[-1]["decision"] == "rejected" and audit.read()[-1]["principal"] == "bob"


def test_a_corrupt_pending_file_is_listed_as_corrupt_not_a_crash(workspace, approvers):
    _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(QUOTA))
    [path] = (workspace / "governance" / "pending").glob("*.json")
    path.write_bytes(b"\xff{not json")
    listed = _cli("approvals")
    assert listed.exit_code == 0, listed.output
    assert "corrupt" in listed.output and "Traceback" not in listed.output
    refused = _cli("approve", "--pending", path.stem, "--key", approvers.alice.key)
    assert refused.exit_code == 2 and "cannot be read as a queued call" in refused.output


def test_markup_in_a_queued_calls_text_is_printed_as_text(approvers):
    reason = "[conceal]rm -rf /[/conceal] [/]"
    _cli("tool", "call", "set_tenant_quota", "--input", json.dumps({**QUOTA, "reason": reason}))
    listed = runner.invoke(app, ["approvals"], env={"COLUMNS": "400"})
    assert listed.exit_code == 0, listed.output
    assert reason in listed.output


def test_governance_commands_are_plain_functions_a_test_can_call(capsys, workspace):
    rules.rules(as_json=True)
    assert "R-SEC-6" in {rule["id"] for rule in json.loads(capsys.readouterr().out)}
    with pytest.raises(typer.Exit) as stopped:
        governance.audit_verify(as_json=True)
    assert stopped.value.exit_code == 1 and "no audit log" in json.loads(capsys.readouterr().out)["reason"]


def test_approving_a_pack_written_before_the_figures_table_says_what_was_not_compared(workspace, tmp_path, approvers,
                                                                                       monkeypatch):
    """Packs an older trainops wrote (no figures table: write() is made to skip it, as that version did)
    are approvable, and `trainops approve` tells the approver, in its text and its JSON, that no table
    was compared; a pack with a table gets no such note."""
    run = factories.write_run(runs_dir() / "base-1")
    record = tmp_path / "drill.json"
    record.write_text("{}")
    drill = factories.drill().model_copy(update={"drill_record": str(record)})

    def a_pack(pack_id):
        return assemble(pack_id, factories.environment(), factories.baseline([str(run)]), [], [drill], [])

    with monkeypatch.context() as old_trainops:
        old_trainops.setattr(pack_module, "with_figures", lambda pack: pack)
        for pack_id in ("old-a", "old-b"):
            write(a_pack(pack_id).model_copy(update={"figures": []}))
    shown = _cli("approve", "old-a", "--key", approvers.alice.key, "--json")
    assert shown.exit_code == 0, shown.output
    assert any("built before the figures table" in n for n in json.loads(shown.output)["notes"])
    text = _cli("approve", "old-b", "--key", approvers.alice.key)
    assert text.exit_code == 0 and "note: evidence.json was built before the figures table" in text.output
    write(a_pack("new"))
    plain = _cli("approve", "new", "--key", approvers.alice.key)
    assert plain.exit_code == 0 and "note:" not in plain.output and "approved new" in plain.output
