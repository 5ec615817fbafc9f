"""Pack decisions hold against the agent: approving re-runs the evidence validators, the decision
covers every entry of the pack, it is signed by a listed human's SSH key, it is final, and the
chain of decisions cannot be cut or edited to let a rejected pack through."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import make_ssh_key
from trainops.cli import app
from trainops.skills.evidence import pack as evidence_pack
from trainops.skills.evidence.checks import decide
from trainops.skills.evidence.model import (
    AblationRow,
    BaselineSummary,
    EvidenceRow,
    MetricSpread,
    PackEnvironment,
)
from trainops.tools.governance import approvals, audit, verification
from trainops.tools.governance.approvals import PackRefused, verify_pack
from trainops.trainer.config import load_config

runner = CliRunner()
SPREAD = MetricSpread(median=2.0, low=1.95, high=2.05, spread_pct=5.0)


def _run(workspace, name: str, overrides: list[str] = ()) -> str:
    """A run folder as the trainer leaves it: config.toml and per-rank metrics."""
    folder = workspace / "runs" / name
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(load_config(preset="tiny", overrides=list(overrides)).to_toml())
    with open(folder / "metrics.jsonl", "w") as fh:
        for step in (1, 2, 3):
            for rank in (0, 1):
                fh.write(json.dumps({"step": step, "rank": rank, "loss": 5.0 - step, "step_time_s": 0.1,
                                     "tokens_per_s": 1000.0, "mfu_pct": 2.0, "time": 1000.0 + step}) + "\n")
    return str(folder)


def _pack(workspace, pack_id: str = "pack-1", arm_overrides: tuple[str, ...] | None = None) -> str:
    """A pack written by trainops (evidence_pack.write): a baseline, and an ablation arm whose run
    changed `arm_overrides` against the baseline's config."""
    base = _run(workspace, f"{pack_id}-base")
    ablations = []
    if arm_overrides is not None:
        arm = _run(workspace, f"{pack_id}-arm", arm_overrides)
        ablations.append(AblationRow(knob="micro_batch", value="8", baseline_value="4", category="batch",
                                     scale="2 procs", scale_kind="target", mfu_change_pct=12.0, noise_band_pct=5.0,
                                     beyond_noise=True, verdict="gain", source_run=arm,
                                     baseline_run=base))
    env = PackEnvironment(framework="trainops-trainer", framework_version="0.1.0", torch_version="2.13.0",
                                 hardware="cpu:x86_64", device_count=2, backend="gloo", scheduler="local")
    baseline = BaselineSummary(model="tiny", parallel_layout="dp_shard=2", precision="fp32", repeats=3,
                               warmup_steps_excluded=1, step_time_s=SPREAD, tokens_per_s=SPREAD, mfu_pct=SPREAD,
                               peak_source="measured GEMM", data_wait_share_pct=1.0, run_dirs=[base])
    row = EvidenceRow(tool="summarize_run", version="0.1.0", command="trainops baseline",
                      log_path=f"{base}/metrics.jsonl", value="MFU 2.000%", window_start=1000.0, window_end=1003.0)
    pack = evidence_pack.assemble(pack_id, env, baseline, ablations, [], [row])
    return evidence_pack.write(pack).name


def test_a_pack_trainops_wrote_is_approved_signed_by_the_approvers_key_and_verifies(workspace, approvers):
    pack = _pack(workspace, arm_overrides=("training.micro_batch=8",))
    result = runner.invoke(app, ["approve", pack, "--key", str(approvers.alice.key), "--note", "ship", "--json"])
    assert result.exit_code == 0, result.output
    verified = verify_pack(pack)
    assert (verified.ok, verified.decision, verified.by, verified.decisions) == (True, "approved", "alice", 1)
    assert verification.verify().ok


@pytest.mark.rule("R-ABL-1", case="compliant")
def test_an_arm_on_a_lower_rung_is_checked_against_the_baseline_of_that_rung(workspace, approvers):
    """The ladder's first rung runs at half the target's global batch (weak scaling): its arm differs
    from the target baseline in two settings, from its own rung's baseline in one."""
    target, rung = _run(workspace, "base-2p"), _run(workspace, "base-1p", ["training.global_batch=4"])
    arm = _run(workspace, "arm-1p", ["training.global_batch=4", "training.micro_batch=2"])
    row = AblationRow(knob="micro_batch", value="2", baseline_value="4", category="batch", scale="1 process",
                      scale_kind="small", mfu_change_pct=12.0, noise_band_pct=5.0, beyond_noise=True,
                      verdict="gain", source_run=arm, baseline_run=rung)
    env = PackEnvironment(framework="trainops-trainer", framework_version="0.1.0", torch_version="2.13.0",
                          hardware="cpu:x86_64", device_count=2, backend="gloo", scheduler="local")
    baseline = BaselineSummary(model="tiny", parallel_layout="dp_shard=2", precision="fp32", repeats=3,
                               warmup_steps_excluded=1, step_time_s=SPREAD, tokens_per_s=SPREAD, mfu_pct=SPREAD,
                               peak_source="measured GEMM", data_wait_share_pct=1.0, run_dirs=[target])
    pack = evidence_pack.write(evidence_pack.assemble("rungs", env, baseline, [row], [], [])).name
    assert decide(pack, "approved", key=approvers.alice.key).decision == "approved"


def test_a_two_variable_ablation_is_refused_naming_the_rule(workspace, approvers):
    pack = _pack(workspace, arm_overrides=("training.micro_batch=8", "training.lr=0.01"))
    with pytest.raises(PackRefused, match=r"R-ABL-1.*2 settings"):
        decide(pack, "approved", key=approvers.alice.key)
    assert not approvals.decisions_dir(pack).exists()


def test_a_pack_without_evidence_json_is_refused(workspace, approvers):
    pack = _pack(workspace)
    (workspace / "packs" / pack / "evidence.json").unlink()
    with pytest.raises(PackRefused, match=r"no evidence\.json") as refused:
        decide(pack, "approved", key=approvers.alice.key)
    assert "edited after trainops wrote it" in str(refused.value)


def test_a_pack_edited_after_it_was_written_is_refused_naming_the_file(workspace, approvers):
    pack = _pack(workspace)
    report = workspace / "packs" / pack / "report.md"
    report.write_text(report.read_text().replace("Verdict: PARTIAL", "Verdict: PASS"))
    with pytest.raises(PackRefused, match=r"R-APR-1: .*edited after trainops wrote it.*report\.md changed"):
        decide(pack, "approved", key=approvers.alice.key)


def test_a_pack_trainops_never_wrote_is_refused(workspace, approvers):
    folder = workspace / "packs" / "hand-made"
    folder.mkdir(parents=True)
    (folder / "evidence.json").write_text('{"verdict": "pass"}')
    with pytest.raises(PackRefused, match=r"no record of trainops writing pack 'hand-made'"):
        decide("hand-made", "approved", key=approvers.alice.key)


@pytest.mark.parametrize("entry", ["symlink", "nested approval.json", "empty folder"])
def test_every_entry_is_covered_by_the_decision(workspace, approvers, entry):
    pack = _pack(workspace)
    decide(pack, "approved", key=approvers.alice.key)
    folder = workspace / "packs" / pack
    if entry == "symlink":
        os.symlink("/etc/passwd", folder / "plots" / "extra.png")
    elif entry == "nested approval.json":
        (folder / "plots" / "approval.json").write_text("{}")
    else:
        (folder / "notes").mkdir()
    verified = verify_pack(pack)
    assert not verified.ok and verified.changed == {"symlink": ["plots/extra.png"],
                                                    "nested approval.json": ["plots/approval.json"],
                                                    "empty folder": ["notes/"]}[entry]


def test_a_symlink_in_a_pack_is_refused_at_approval(workspace, approvers):
    pack = _pack(workspace)
    folder = workspace / "packs" / pack
    os.symlink("/etc/passwd", folder / "plots" / "mfu.png.link")
    with pytest.raises(PackRefused, match=r"R-APR-1: plots/mfu\.png\.link is a symlink entry"):
        decide(pack, "approved", key=approvers.alice.key)


def test_a_rejected_pack_stays_rejected_when_its_decision_file_is_deleted(workspace, approvers):
    pack = _pack(workspace)
    decide(pack, "rejected", note="recovery not measured", key=approvers.bob.key)
    with pytest.raises(PackRefused, match="a rejection is final"):
        decide(pack, "approved", key=approvers.alice.key)
    (approvals.decisions_dir(pack) / "0001.json").unlink()
    with pytest.raises(PackRefused, match=r"audit log records decision 1 \(rejected by bob.*file is gone"):
        decide(pack, "approved", key=approvers.alice.key)
    assert not verify_pack(pack).ok


def test_revoking_an_approval_is_a_second_decision_linked_to_the_first(workspace, approvers):
    pack = _pack(workspace)
    decide(pack, "approved", key=approvers.alice.key)
    with pytest.raises(PackRefused, match="already approved by alice"):
        decide(pack, "approved", key=approvers.bob.key)
    decide(pack, "rejected", note="the baseline was on a noisy host", key=approvers.bob.key)
    first, second = sorted(approvals.decisions_dir(pack).iterdir())
    assert json.loads(second.read_text())["previous_sha256"] == audit.sha256_hex(first.read_bytes())
    verified = verify_pack(pack)
    assert (verified.ok, verified.decision, verified.by, verified.decisions) == (True, "rejected", "bob", 2)


def test_an_edited_decision_breaks_the_chain(workspace, approvers):
    pack = _pack(workspace)
    decide(pack, "rejected", note="numbers look wrong", key=approvers.bob.key)
    path = approvals.decisions_dir(pack) / "0001.json"
    record = json.loads(path.read_text())
    record["decision"] = "approved"
    path.write_text(json.dumps(record))
    assert "does not verify" in verify_pack(pack).reason
    items = {i.id: i for i in approvals.list_items()}
    assert items[pack].status == "corrupt"


def test_a_decision_signed_by_a_key_not_in_allowed_signers_is_refused(workspace, approvers, tmp_path):
    pack = _pack(workspace)
    with pytest.raises(ValueError, match="not an approver"):
        decide(pack, "approved", key=make_ssh_key(tmp_path / "eve", "eve"))
    assert not approvals.decisions_dir(pack).exists()


def test_a_pack_outside_the_workspace_is_refused(workspace, approvers, tmp_path):
    pack = _pack(workspace)
    outside = tmp_path / "elsewhere"
    (workspace / "packs" / pack).rename(outside)
    (workspace / "packs" / "linked").symlink_to(outside)
    for name in (str(outside), "linked"):
        with pytest.raises(PackRefused, match="outside the workspace|not a folder inside the workspace"):
            decide(name, "approved", key=approvers.alice.key)


@pytest.mark.parametrize("name", ["pack-1\n", "pack-1/../pack-1", "../packs/pack-1"])
def test_a_pack_id_is_matched_in_full(workspace, approvers, name):
    _pack(workspace)
    with pytest.raises(ValueError):
        decide(name, "approved", key=approvers.alice.key)


def test_a_log_replaced_without_the_packs_decisions_fails_audit_verify(workspace, approvers):
    pack = _pack(workspace)
    decide(pack, "rejected", note="numbers look wrong", key=approvers.bob.key)
    (workspace / "audit.jsonl").unlink()
    (workspace / "audit.jsonl.head").unlink()
    audit.append("tool_call", tool="a fresh start", ok=True)
    report = verification.verify()
    assert not report.ok and f"{pack}/0001.json are not in the log" in report.reason


def test_a_torn_audit_log_refuses_a_decision_and_lists_the_pack_as_corrupt(workspace, approvers):
    pack = _pack(workspace)
    with open(workspace / "audit.jsonl", "a") as fh:
        fh.write('{"seq": 99, "kind": "anch')
    result = runner.invoke(app, ["approve", pack, "--key", str(approvers.alice.key)])
    assert result.exit_code == 2 and "cannot be checked against the audit log" in result.output
    assert not approvals.decisions_dir(pack).exists()
    listed = runner.invoke(app, ["approvals", "--json"])
    assert listed.exit_code == 0 and json.loads(listed.output)[0]["status"] == "corrupt"


@pytest.mark.slow
def test_a_pack_built_from_real_trainer_runs_is_approved_end_to_end(workspace, approvers):
    """The whole path for real: `trainops train` twice (torchrun, gloo), `evidence build`, a signed
    approval with the approver's own key, then `approvals verify` and `audit verify`."""
    trainops = str(Path(sys.executable).parent / "trainops")
    env = {**os.environ, "TRAINOPS_HOME": str(workspace), "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> str:
        done = subprocess.run([trainops, *args], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    runs = [json.loads(run("train", "--preset", "tiny", "--set", "training.steps=4", "--json"))["run_dir"]
            for _ in range(2)]
    pack = Path(json.loads(run("evidence", "build", *runs, "--json"))["pack_dir"]).name
    run("approve", pack, "--key", str(approvers.alice.key), "--note", "end to end")
    assert json.loads(run("approvals", "verify", pack, "--json"))["by"] == "alice"
    assert json.loads(run("audit", "verify", "--json"))["ok"] is True
