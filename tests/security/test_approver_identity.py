"""An approval is a human's SSH signature, checked against the allowed-signers file; nothing the
workspace (or an agent using it) holds can produce one."""
from __future__ import annotations

import hashlib
import os
import pty
import subprocess
import sys
import time

import pytest

from tests.conftest import make_ssh_key
from trainops.tools.governance import signing
from trainops.tools.governance.signing import SigningError

DATA = b'{"call":"set_tenant_quota","input_sha256":"ab"}'


def test_a_listed_approver_key_verifies_and_names_its_principal(approvers):
    signer = signing.verify(DATA, signing.sign(DATA, approvers.alice.key))
    fingerprint = subprocess.run(["ssh-keygen", "-l", "-f", str(approvers.alice.key)], capture_output=True,
                                 text=True, check=True).stdout.split()[1]
    assert signer.principal == "alice" and signer.fingerprint == fingerprint

    assert signer.allowed_signers_sha256 == hashlib.sha256(approvers.allowed_signers.read_bytes()).hexdigest()


def test_a_key_not_in_allowed_signers_is_refused(approvers, tmp_path):
    outsider = make_ssh_key(tmp_path / "eve", "eve")
    with pytest.raises(SigningError, match="not an approver"):
        signing.verify(DATA, signing.sign(DATA, outsider))


def test_a_signature_over_other_data_is_refused(approvers):
    signature = signing.sign(DATA, approvers.alice.key)
    with pytest.raises(SigningError, match="does not verify"):
        signing.verify(DATA.replace(b"ab", b"cd"), signature)


def test_a_signature_in_another_namespace_is_refused(approvers):
    """A signature made for git (or anything else) with the same key is not an approval."""
    other = subprocess.run(["ssh-keygen", "-Y", "sign", "-n", "git", "-f", str(approvers.alice.key)],
                           input=DATA, capture_output=True, check=True).stdout.decode()
    with pytest.raises(SigningError, match="does not verify"):
        signing.verify(DATA, other)


def test_text_that_is_not_an_ssh_signature_is_refused_with_the_fix(approvers):
    with pytest.raises(SigningError, match="ssh-keygen -Y sign -n trainops-approval"):
        signing.verify(DATA, "c2lnbmF0dXJl")


def test_an_expired_approver_line_no_longer_approves_but_still_verifies_what_it_signed_before(approvers):
    signature = signing.sign(DATA, approvers.bob.key)
    lines = approvers.allowed_signers.read_text().splitlines()
    approvers.allowed_signers.write_text("\n".join(
        line.replace("bob ", 'bob valid-before="20200101" ') for line in lines) + "\n")
    with pytest.raises(SigningError, match="not an approver"):
        signing.verify(DATA, signature)
    assert signing.verify(DATA, signature, at=1_500_000_000).principal == "bob"  # 2017: inside the window


def test_a_group_writable_allowed_signers_file_is_refused_naming_the_chmod_fix(approvers):
    signature = signing.sign(DATA, approvers.alice.key)
    approvers.allowed_signers.chmod(0o664)
    with pytest.raises(SigningError, match=f"{approvers.allowed_signers}.*group/world-writable.*chmod go-w"):
        signing.verify(DATA, signature)


def test_a_world_writable_allowed_signers_folder_is_refused(approvers):
    signature = signing.sign(DATA, approvers.alice.key)
    approvers.allowed_signers.parent.chmod(0o777)
    with pytest.raises(SigningError, match="folder .* group/world-writable"):
        signing.verify(DATA, signature)


def test_without_a_configured_allowed_signers_file_nothing_verifies(approvers, monkeypatch, tmp_path):
    signature = signing.sign(DATA, approvers.alice.key)
    monkeypatch.setenv("TRAINOPS_CONFIG", str(tmp_path / "absent.toml"))
    with pytest.raises(SigningError, match=r"\[governance\] allowed_signers"):
        signing.verify(DATA, signature)


def test_a_project_local_trainops_toml_cannot_name_the_allowed_signers(approvers, monkeypatch, tmp_path):
    """A cloned repository (or an agent) writes its own allowed-signers file and points at it."""
    eve = make_ssh_key(tmp_path / "eve", "eve")
    rogue = tmp_path / "repo" / "allowed_signers"
    rogue.parent.mkdir()
    rogue.write_text(f"eve {' '.join(eve.with_suffix('.pub').read_text().split()[:2])}\n")
    (rogue.parent / "trainops.toml").write_text(f'[governance]\nallowed_signers = "{rogue}"\n')
    monkeypatch.setenv("TRAINOPS_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.chdir(rogue.parent)
    with pytest.raises(SigningError, match="no allowed-signers file is configured"):
        signing.verify(DATA, signing.sign(DATA, eve))


def test_the_environment_variable_names_the_allowed_signers_file(approvers, monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINOPS_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("TRAINOPS_ALLOWED_SIGNERS", str(approvers.allowed_signers))
    assert signing.verify(DATA, signing.sign(DATA, approvers.bob.key)).principal == "bob"


def test_signing_without_a_key_uses_the_ssh_agent_key_that_is_listed(approvers, tmp_path, monkeypatch):
    agent = subprocess.run(["ssh-agent", "-s", "-a", str(tmp_path / "agent.sock")], capture_output=True,
                           text=True, check=True).stdout
    pid = int(agent.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
        subprocess.run(["ssh-add", "-q", str(make_ssh_key(tmp_path / "other", "unlisted"))], check=True)
        subprocess.run(["ssh-add", "-q", str(approvers.bob.key)], check=True)
        assert signing.verify(DATA, signing.sign(DATA, None)).principal == "bob"
    finally:
        os.kill(pid, 15)


def test_signing_without_a_key_or_an_agent_says_how_to_sign(approvers):
    with pytest.raises(SigningError, match="--key PATH"):
        signing.sign(DATA, None)


def test_signing_with_a_missing_key_file_names_it(approvers, tmp_path):
    with pytest.raises(SigningError, match=f"{tmp_path / 'nope'} is not a file"):
        signing.sign(DATA, tmp_path / "nope")


def test_a_passphrase_protected_key_signs_once_the_human_types_the_passphrase(approvers, tmp_path):
    """ssh-keygen asks on the terminal, so the data to sign must not be fed through stdin."""
    key = tmp_path / "carol"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "correct horse", "-f", str(key)], check=True)
    with open(approvers.allowed_signers, "a") as fh:
        fh.write(f"carol {' '.join(key.with_suffix('.pub').read_text().split()[:2])}\n")
    script = (f"from pathlib import Path\nfrom trainops.tools.governance import signing\n"
              f"print('SIGNER', signing.verify(b'x', signing.sign(b'x', Path({str(key)!r}))).principal)")
    pid, terminal = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-c", script])
    seen, typed, deadline = b"", False, time.time() + 60
    while time.time() < deadline and b"SIGNER carol" not in seen:
        try:
            seen += os.read(terminal, 1024)
        except OSError:
            break
        if b"passphrase" in seen and not typed:
            os.write(terminal, b"correct horse\n")
            typed = True
    os.waitpid(pid, 0)
    assert typed and b"SIGNER carol" in seen, seen


def test_a_relative_allowed_signers_path_in_the_config_is_refused(approvers):
    approvers.config.write_text('[governance]\nallowed_signers = "allowed_signers"\n')
    with pytest.raises(SigningError, match="absolute path"):
        signing.verify(DATA, signing.sign(DATA, approvers.alice.key))
