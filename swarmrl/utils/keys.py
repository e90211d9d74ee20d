"""Ed25519 helpers shared by every component that signs (protocol requests, SHARDCAST manifests).

One key-file format everywhere: the private key as unencrypted PKCS#8 PEM, mode 0600 (``swarmrl node
keygen``, ``swarmrl shardcast keygen``, the keys ``swarmrl run`` makes); public keys travel as 64 hex chars
(the raw 32 bytes). ``load_private_key`` also reads the raw 64-hex-char seed files older SHARDCAST origins wrote.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
MAX_KEY_FILE_BYTES = 4096


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The raw 32-byte public key as 64 lowercase hex chars."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def save_private_key(key: Ed25519PrivateKey, path: str | Path) -> Path:
    """Write the key as unencrypted PKCS#8 PEM, mode 0600, refusing to overwrite an existing file."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; refusing to overwrite a key")
    path.parent.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return path


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (or a legacy file holding the raw seed as 64 hex chars)."""
    path = Path(path)
    if path.stat().st_size > MAX_KEY_FILE_BYTES:
        raise ValueError(f"{path} is too large to be a key file")
    data = path.read_bytes()
    text = data.decode("ascii", errors="replace").strip()
    if _HEX64.fullmatch(text):
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text))
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path} is not an unencrypted PEM private key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return key
