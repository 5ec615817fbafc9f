"""The workspace's ed25519 approval key: what humans sign approvals and tokens with.

The private key lives in `$TRAINOPS_HOME/keys/approver_ed25519.pem` (mode 0600); the public
key next to it can be handed to anyone who wants to verify an approval.
"""
from __future__ import annotations

import base64
import os
from pathlib import Path

PRIVATE_NAME = "approver_ed25519.pem"
PUBLIC_NAME = "approver_ed25519.pub.pem"


def _keys_dir() -> Path:
    from trainops.workspace import keys_dir

    return keys_dir()


def public_key_path() -> Path:
    return _keys_dir() / PUBLIC_NAME


def _private_key():
    """Load the signing key, creating the pair on first use."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = _keys_dir() / PRIVATE_NAME
    if path.exists():
        return serialization.load_pem_private_key(path.read_bytes(), password=None)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Write under a temporary name, then link into place: the link fails if another process
    # won the race, and then its key is the one everybody uses.
    tmp = path.with_name(f".{PRIVATE_NAME}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    try:
        os.link(tmp, path)
    except FileExistsError:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    finally:
        tmp.unlink()
    _write_public(key)
    return key


def _public_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _write_public(key) -> None:
    tmp = public_key_path().with_name(f".{PUBLIC_NAME}.{os.getpid()}")
    tmp.write_bytes(_public_pem(key))
    tmp.replace(public_key_path())


def public_key_pem() -> str:
    """The workspace public key, derived from the private key (the .pub.pem file is a copy to hand out)."""
    return _public_pem(_private_key()).decode()


def sign(message: bytes) -> str:
    return b64(_private_key().sign(message))


def verify(message: bytes, signature_b64: str, public_pem: str | bytes | None = None) -> bool:
    """True when `signature_b64` is a valid signature of `message` under the given (or workspace) key."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    pem = public_pem if public_pem is not None else public_key_pem()
    key = serialization.load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)
    try:
        key.verify(unb64(signature_b64), message)
    except (InvalidSignature, ValueError):
        return False
    return True


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
