"""Ed25519 helpers shared by every component that signs (protocol requests, SHARDCAST manifests).

One key-file format everywhere: the private key as unencrypted PKCS#8 PEM, mode 0600 (``swarmrl node
keygen``, ``swarmrl shardcast keygen``, the keys ``swarmrl run`` makes); public keys travel as 64 hex chars
(the raw 32 bytes). ``load_private_key`` also reads the raw 64-hex-char seed files older SHARDCAST origins wrote.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
MAX_KEY_FILE_BYTES = 4096

# Ed25519 public keys that anyone can sign for. The 8 points of small order (the torsion subgroup, canonical
# encodings): with such a key, R = identity and S = 0 verify for EVERY message, so a node or validator
# registered under one could be impersonated by anybody. Their encodings with the sign bit set on x = 0
# (y = 1, y = p - 1) and every encoding with y >= p are not canonical and refused as such.
_P = 2**255 - 19
SMALL_ORDER_KEYS = frozenset(bytes.fromhex(h) for h in (
    "0100000000000000000000000000000000000000000000000000000000000000",  # identity (order 1)
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # (0, -1), order 2
    "0000000000000000000000000000000000000000000000000000000000000000",  # order 4
    "0000000000000000000000000000000000000000000000000000000000000080",  # order 4
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",  # order 8
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",  # order 8
))
_NEG_ZERO_X = frozenset(bytes.fromhex(h) for h in (  # x = 0 with the sign bit set (y = 1, y = p - 1)
    "0100000000000000000000000000000000000000000000000000000000000080",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
))


def public_key_problem(raw: bytes) -> str | None:
    """Why ``raw`` (an untrusted 32-byte Ed25519 public key) must be refused, or None when it is acceptable.

    Refused: a wrong length, a non-canonical encoding (y >= p, or the sign bit set on x = 0) and the 8
    small-order points. Cheap (no curve arithmetic), so it runs on every key parsed from the outside."""
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 32:
        return "an Ed25519 public key is 32 bytes"
    raw = bytes(raw)
    if int.from_bytes(raw, "little") & ((1 << 255) - 1) >= _P:
        return "non-canonical Ed25519 public key encoding (y >= p)"
    if raw in _NEG_ZERO_X:
        return "non-canonical Ed25519 public key encoding (sign bit set on x = 0)"
    if raw in SMALL_ORDER_KEYS:
        return "Ed25519 public key of small order (anyone can forge signatures for it)"
    return None


def parse_public_key_bytes(raw: bytes) -> Ed25519PublicKey:
    """An untrusted raw public key, refused (ValueError with the reason) when ``public_key_problem`` says so."""
    why = public_key_problem(raw)
    if why is not None:
        raise ValueError(why)
    return Ed25519PublicKey.from_public_bytes(bytes(raw))


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The raw 32-byte public key as 64 lowercase hex chars."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes_raw().hex()


def save_private_key(key: Ed25519PrivateKey, path: str | Path) -> Path:
    """Write the key as unencrypted PKCS#8 PEM, mode 0600, refusing to overwrite an existing file."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; refusing to overwrite a key")
    path.parent.mkdir(parents=True, exist_ok=True)
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415  # lazy: a verifying client needs none

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
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415  # lazy: a verifying client needs none

    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path} is not an unencrypted PEM private key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return key


def load_or_make_private_key(path: str | Path) -> Ed25519PrivateKey:
    """The key in ``path``, made there first (mode 0600) when there is none; a key another process made meanwhile
    is read, not overwritten."""
    if not Path(path).exists():
        try:
            save_private_key(generate_key(), path)
        except FileExistsError:
            pass
    return load_private_key(path)
