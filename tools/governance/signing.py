"""Human approvals as SSH signatures (SSHSIG), checked against an allowed-signers file.

The workspace holds no approver key: anything that can use the workspace (an agent with a
shell included) could use a key stored there. An approval is valid only when it is signed by
a human's own key (ed25519, FIDO `sk-`, through their ssh-agent) that an allowed-signers file
lists, in the formats git uses for SSH commit signing. `ssh-keygen -Y` does the cryptography
and honours `valid-after`/`valid-before` and `namespaces=` on allowed-signers lines.

Where the allowed-signers file lives comes only from the user's own trusted config
(`[governance] allowed_signers`) or `$TRAINOPS_ALLOWED_SIGNERS`, never from a project-local
or workspace settings file; a group- or world-writable file (or folder) is refused.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trainops.settings import table, user_config_path

NAMESPACE = "trainops-approval"
ENV_ALLOWED_SIGNERS = "TRAINOPS_ALLOWED_SIGNERS"
ARMOR_BEGIN = "-----BEGIN SSH SIGNATURE-----"
ARMOR_END = "-----END SSH SIGNATURE-----"
SSH_KEYGEN_TIMEOUT_S = 120  # a FIDO key's touch or an `ssh-add -c` confirmation waits for a human


class SigningError(ValueError):
    """A signature could not be made or does not verify; the message names what and the fix."""
class Signer(BaseModel):
    """Who signed: the allowed-signers principal, the key, and the exact file that vouched for them."""
    model_config = ConfigDict(frozen=True)

    principal: str = Field(description="The allowed-signers principal the key is listed under.")
    fingerprint: str = Field(description="The signing key's SHA256 fingerprint.")
    allowed_signers_sha256: str = Field(description="sha256 of the allowed-signers file that vouched for the key.")


def allowed_signers_path() -> Path:
    """The allowed-signers file: `$TRAINOPS_ALLOWED_SIGNERS`, else trusted config's `[governance] allowed_signers`."""
    explicit = os.environ.get(ENV_ALLOWED_SIGNERS)
    if explicit:
        return Path(explicit).expanduser()

    governance, _sources = table("governance", trusted_only=True)
    configured = governance.get("allowed_signers")
    if not configured:
        raise SigningError(
            f"no allowed-signers file is configured: set `[governance] allowed_signers = \"PATH\"` in "
            f"{user_config_path()} (or ${ENV_ALLOWED_SIGNERS}); each line is `PRINCIPAL ssh-ed25519 AAAA...` "
            "as for git's SSH signing (gpg.ssh.allowedSignersFile)")
    if not isinstance(configured, str) or not Path(configured).expanduser().is_absolute():
        raise SigningError(f"[governance] allowed_signers is {configured!r}: give the file's absolute path "
                           "(or ~/...) as a string")
    return Path(configured).expanduser()


def read_allowed_signers(path: Path | None = None) -> tuple[Path, bytes]:
    """The allowed-signers file's path and bytes, refused when others could rewrite who may approve."""
    path = path or allowed_signers_path()
    if not path.is_file():
        raise SigningError(f"allowed-signers file {path} does not exist or is not a file: create it with one "
                           "`PRINCIPAL ssh-ed25519 AAAA...` line per approver")
    real = path.resolve()
    for what, target, fix_mode in (("file", real, "644"), ("folder", real.parent, "755")):
        mode = target.stat().st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise SigningError(f"allowed-signers {what} {target} is group/world-writable (mode "
                               f"{stat.S_IMODE(mode):o}): anyone in the group could add an approver; "
                               f"fix with `chmod go-w {target}` (e.g. chmod {fix_mode})")
    return real, real.read_bytes()


def sign(data: bytes, key: Path | None = None) -> str:
    """Armored SSHSIG of `data` in the trainops-approval namespace, by `key` (a private key, or a
    public key whose private half is in the ssh-agent), else by the first ssh-agent key that the
    allowed-signers file lists."""
    key_file = Path(key).expanduser() if key is not None else None
    if key_file is not None and not key_file.is_file():
        raise SigningError(f"signing key {key_file} is not a file: pass your private key (or its .pub with the "
                           "private key in ssh-agent) as --key PATH")
    with tempfile.TemporaryDirectory(prefix="trainops-sign-") as tmp:
        if key_file is None:
            key_file = Path(tmp) / "agent_key.pub"
            key_file.write_text(_agent_key_listed_as_signer() + "\n")
        # The data goes in a file, so stdin stays the terminal for a key's passphrase prompt.
        message = Path(tmp) / "approval"
        message.write_bytes(data)
        result = _ssh_keygen(["-Y", "sign", "-n", NAMESPACE, "-f", str(key_file), str(message)], None)
        sig_file = message.with_name("approval.sig")
        signature = sig_file.read_text(encoding="utf-8", errors="replace").strip() if sig_file.is_file() else ""
    if result.returncode != 0 or not signature.startswith(ARMOR_BEGIN):
        raise SigningError(f"ssh-keygen could not sign with {key_file}: {_stderr(result)}; check the key file, "
                           "its passphrase, or that its private key is loaded in ssh-agent (`ssh-add -l`)")
    return signature + "\n"


def verify(data: bytes, signature: str, at: float | None = None) -> Signer:
    """The signer of `signature` over `data`, checked against the allowed-signers file (as it was at
    time `at`, for `valid-before` keys; default now). Raises SigningError naming why not."""
    if not isinstance(signature, str) or ARMOR_BEGIN not in signature or ARMOR_END not in signature:
        raise SigningError("signature is not an armored SSH signature (-----BEGIN SSH SIGNATURE-----): sign with "
                           f"`ssh-keygen -Y sign -n {NAMESPACE} -f KEY`")
    path, allowed = read_allowed_signers()
    verify_time = time.strftime("%Y%m%d%H%M%S", time.gmtime(time.time() if at is None else at)) + "Z"
    with tempfile.TemporaryDirectory(prefix="trainops-verify-") as tmp:
        # Verify against a private copy, so the sha256 recorded is of the very bytes that vouched.
        allowed_copy, sig_file = Path(tmp) / "allowed_signers", Path(tmp) / "approval.sig"
        allowed_copy.write_bytes(allowed)
        sig_file.write_text(signature)
        found = _ssh_keygen(["-Y", "find-principals", "-f", str(allowed_copy), "-s", str(sig_file),
                             "-n", NAMESPACE, "-O", f"verify-time={verify_time}"], b"")
        principals = found.stdout.decode("utf-8", "replace").split()
        if found.returncode != 0 or not principals:
            raise SigningError(f"the signing key is not an approver in {path} (or not valid at that time): "
                               f"{_stderr(found)}; only keys listed in the allowed-signers file can approve")
        principal = principals[0]
        checked = _ssh_keygen(["-Y", "verify", "-f", str(allowed_copy), "-I", principal, "-n", NAMESPACE,
                               "-s", str(sig_file), "-O", f"verify-time={verify_time}"], data)
    if checked.returncode != 0:
        raise SigningError(f"signature by {principal}'s key does not verify over this data in namespace "
                           f"{NAMESPACE}: {_stderr(checked)}; the data was altered or the signature was "
                           "made for something else")
    out = checked.stdout.decode("utf-8", "replace")
    fingerprint = next((word for word in out.split() if word.startswith("SHA256:")), "")
    return Signer(principal=principal, fingerprint=fingerprint,
                  allowed_signers_sha256=hashlib.sha256(allowed).hexdigest())


def _agent_key_listed_as_signer() -> str:
    """The first ssh-agent key that the allowed-signers file lists (a public key line)."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        raise SigningError("no --key given and no ssh-agent running (SSH_AUTH_SOCK unset): pass --key PATH "
                           "to your approver key, or `ssh-add` it to your agent")
    listed = _run_openssh(["ssh-add", "-L"], b"")
    agent_keys = [line.strip() for line in listed.stdout.decode("utf-8", "replace").splitlines()
                  if line.strip().count(" ") >= 1 and not line.startswith("The agent has no")]
    if listed.returncode != 0 or not agent_keys:
        raise SigningError("ssh-agent holds no keys: `ssh-add ~/.ssh/YOUR_KEY`, or pass --key PATH")
    path, allowed = read_allowed_signers()
    allowed_blobs = set(allowed.decode("utf-8", "replace").split())
    for line in agent_keys:
        if line.split()[1] in allowed_blobs:
            return line
    raise SigningError(f"none of the {len(agent_keys)} ssh-agent key(s) is listed in {path}: add your public "
                       "key there (`PRINCIPAL ssh-ed25519 AAAA...`) or pass --key PATH")


def _ssh_keygen(args: list[str], stdin: bytes | None) -> subprocess.CompletedProcess:
    return _run_openssh(["ssh-keygen", *args], stdin)


def _run_openssh(argv: list[str], stdin: bytes | None) -> subprocess.CompletedProcess:
    """Run an OpenSSH tool (ssh-keygen, ssh-add) with `stdin` as its input, or the caller's own stdin (a
    terminal) when None; a SigningError when it is missing or waits too long."""
    if shutil.which(argv[0]) is None:
        raise SigningError(f"{argv[0]} is not installed: approvals need OpenSSH 8.2 or newer "
                           "(e.g. `apt-get install openssh-client`)")
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, timeout=SSH_KEYGEN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SigningError(f"{argv[0]} {argv[1]} waited more than {SSH_KEYGEN_TIMEOUT_S} s (a key touch or "
                           "an agent confirmation nobody gave?): try again") from None


def _stderr(result: subprocess.CompletedProcess) -> str:
    text = " ".join(result.stderr.decode("utf-8", "replace").split())
    return text or f"exit code {result.returncode}"
