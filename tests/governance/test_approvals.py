"""Signed human decisions on evidence packs: approve, reject with a reason, immutability, verification
with the public key alone, and the approvals listing — through the CLI, as a person uses them."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainops.tools.governance import audit, signing
from trainops.tools.governance.approvals import Decision, decide, verify_pack
from trainops.cli import app

runner = CliRunner()


@pytest.fixture
def pack(workspace):
    folder = workspace / "packs" / "pack-1"
    (folder / "plots").mkdir(parents=True)
    (folder / "evidence.json").write_text('{"verdict": "pass"}')
    (folder / "report.md").write_text("Verdict: pass\n")
    (folder / "plots" / "mfu.png").write_bytes(b"\x89PNG fake")
    return folder


def _cli(*args):
    return runner.invoke(app, list(args))


@pytest.mark.rule("R-APR-1", case="compliant")
def test_approved_pack_verifies_with_the_public_key_alone(pack, tmp_path):
    result = _cli("approve", "pack-1", "--by", "alice", "--note", "ship it", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["decision"] == "approved"
    public = tmp_path / "approver.pub.pem"
    public.write_text(signing.public_key_path().read_text())
    verified = _cli("approvals", "verify", "pack-1", "--public-key", str(public), "--json")
    assert verified.exit_code == 0 and json.loads(verified.output)["ok"] is True


@pytest.mark.rule("R-APR-1", case="violation")
@pytest.mark.parametrize("tamper", ["edit", "add", "delete"])
def test_any_change_to_an_approved_pack_is_detected(pack, tamper):
    decide("pack-1", "approved", "alice")
    if tamper == "edit":
        (pack / "report.md").write_text("Verdict: pass (edited after approval)\n")
    elif tamper == "add":
        (pack / "extra.csv").write_text("a,b\n")
    else:
        (pack / "plots" / "mfu.png").unlink()
    result = _cli("approvals", "verify", "pack-1", "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)["changed"] == {"edit": ["report.md"], "add": ["extra.csv"],
                                                    "delete": ["plots/mfu.png"]}[tamper]


def test_approval_signed_by_another_key_is_detected(pack):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    decide("pack-1", "approved", "alice")
    path = pack / "approval.json"
    record = Decision.model_validate_json(path.read_text())
    record.by = "mallory"
    record.signature = signing.b64(Ed25519PrivateKey.generate().sign(record.signed_bytes()))
    path.write_text(record.model_dump_json())
    result = verify_pack("pack-1")
    assert not result.ok and "signature does not verify" in result.reason


def test_reject_without_a_note_is_refused_naming_the_option(pack):
    result = _cli("reject", "pack-1", "--by", "bob", "--note", " ")
    assert result.exit_code == 2 and "--note" in result.output
    assert not (pack / "approval.json").exists()


def test_rejection_with_a_note_is_signed_and_audited(pack):
    result = _cli("reject", "pack-1", "--by", "bob", "--note", "recovery time not measured", "--json")
    assert result.exit_code == 0, result.output
    assert verify_pack("pack-1").decision == "rejected"
    assert audit.read()[-1]["decision"] == "rejected" and audit.verify().ok


def test_a_decided_pack_cannot_be_decided_again(pack):
    decide("pack-1", "approved", "alice")
    result = _cli("reject", "pack-1", "--by", "bob", "--note", "changed my mind")
    assert result.exit_code == 2 and "already approved by alice" in result.output


def test_unknown_pack_gives_one_clear_line():
    result = _cli("approve", "nope", "--by", "alice")
    assert result.exit_code == 2 and "pack 'nope' not found" in result.output and "Traceback" not in result.output


def test_approvals_lists_pending_and_decided_packs_and_calls(workspace, pack):
    (workspace / "packs" / "pack-2").mkdir()
    (workspace / "packs" / "pack-2" / "report.md").write_text("Verdict: pass\n")
    decide("pack-1", "approved", "alice")
    refused = _cli("tool", "call", "set_tenant_quota", "--input",
                   json.dumps({"tenant": "acme", "gpus": 4, "priority": "low", "reason": "trial"}))
    assert refused.exit_code != 0
    items = json.loads(_cli("approvals", "--json").output)
    assert [(i["kind"], i["id"], i["status"]) for i in items][:2] == [("call", items[0]["id"], "pending"),
                                                                      ("pack", "pack-2", "pending")]
    assert ("pack", "pack-1", "approved") in [(i["kind"], i["id"], i["status"]) for i in items]


def test_pending_call_approved_from_the_cli_runs_with_the_minted_token(workspace):
    inp = {"tenant": "acme", "gpus": 4, "priority": "low", "reason": "trial"}
    _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(inp))
    [item] = json.loads(_cli("approvals", "--json").output)
    minted = _cli("approve", "--pending", item["id"], "--by", "alice", "--json")
    assert minted.exit_code == 0, minted.output
    token = json.loads(minted.output)["token"]
    ran = _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(inp), "--approval-token", token, "--json")
    assert ran.exit_code == 0, ran.output
    assert json.loads(_cli("approvals", "--json").output)[0]["status"] == "approved"


def test_pending_call_rejected_from_the_cli_leaves_the_queue_with_its_reason(workspace):
    _cli("tool", "call", "set_tenant_quota", "--input",
         json.dumps({"tenant": "acme", "gpus": 4096, "priority": "high", "reason": "all of it"}))
    [item] = json.loads(_cli("approvals", "--json").output)
    result = _cli("reject", "--pending", item["id"], "--by", "bob", "--note", "exceeds the cluster")
    assert result.exit_code == 0, result.output
    [decided] = json.loads(_cli("approvals", "--json").output)
    assert (decided["status"], decided["by"]) == ("rejected", "bob") and "exceeds the cluster" in decided["detail"]
    assert audit.read()[-1]["decision"] == "rejected"


_SIGNER = """
import json
from trainops.tools.governance import signing
print(json.dumps({"pem": signing.public_key_pem(), "sig": signing.sign(b"same message")}))
"""


@pytest.mark.slow
def test_processes_racing_to_create_the_key_all_end_up_signing_with_one_key(workspace):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRAINOPS_HOME": str(workspace), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    procs = [subprocess.Popen([sys.executable, "-c", _SIGNER], env=env, cwd=root, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert {o["pem"] for o in outs} == {signing.public_key_path().read_text()}
    assert all(signing.verify(b"same message", o["sig"]) for o in outs)
