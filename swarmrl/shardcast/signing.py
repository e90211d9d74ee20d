"""Ed25519 keys for the origin and the signed manifest envelope.

Key files: the private key is PKCS#8 PEM like every swarmrl key (``swarmrl.utils.keys``), the public
key file holds 64 hex chars (raw 32 bytes). ``load_public_key`` also accepts the hex string itself, so
``--origin-pubkey`` can be either a file or the key.

Envelope (``v<N>/manifest.json``)::

    {"manifest": {...}, "signature": "<128 hex: Ed25519 over canonical_json(manifest)>"}
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from swarmrl.shardcast.layout import MAX_MANIFEST_BYTES, LayoutError, Manifest, canonical_json
from swarmrl.utils.keys import (  # noqa: F401  (re-exported)
    generate_key,
    load_private_key,
    parse_public_key_bytes,
    public_key_hex,
    public_key_problem,
    save_private_key,
)

__all__ = ["SignatureError", "generate_key", "save_private_key", "load_private_key", "public_key_hex",
           "load_public_key", "sign_manifest", "verify_manifest", "keygen"]

_HEX = re.compile(r"[0-9a-fA-F]+")


class SignatureError(LayoutError):
    """A manifest whose signature does not verify under the origin key (forged or altered)."""


def load_public_key(spec: str | Path | Ed25519PublicKey) -> Ed25519PublicKey:
    """A public key from a hex string, or from a file holding the hex string. Small-order and non-canonical
    keys are refused (ValueError): a manifest "signed" under one proves nothing."""
    if isinstance(spec, Ed25519PublicKey):
        why = public_key_problem(spec.public_bytes_raw())
        if why is not None:
            raise ValueError(f"origin public key {spec.public_bytes_raw().hex()}: {why}")
        return spec
    s = str(spec).strip()
    if not (len(s) == 64 and _HEX.fullmatch(s)):
        p = Path(s)
        if not p.is_file():
            raise ValueError(f"origin public key {s[:80]!r} is neither 64 hex chars nor a readable file")
        s = p.read_text().strip()
        if not (len(s) == 64 and _HEX.fullmatch(s)):
            raise ValueError(f"{p}: expected a 64-hex-char Ed25519 public key")
    try:
        return parse_public_key_bytes(bytes.fromhex(s))
    except ValueError as e:
        raise ValueError(f"origin public key {s}: {e}") from None


def keygen(private_path: str | Path, public_path: str | Path | None = None) -> str:
    """Create a key pair on disk; returns the public key hex."""
    key = generate_key()
    save_private_key(key, private_path)
    pub = public_key_hex(key)
    public_path = Path(public_path) if public_path else Path(str(private_path) + ".pub")
    public_path.write_text(pub + "\n")
    return pub


def sign_manifest(manifest: Manifest, key: Ed25519PrivateKey) -> bytes:
    """The envelope bytes to store as v<N>/manifest.json."""
    body = manifest.to_dict()
    sig = key.sign(canonical_json(body)).hex()
    return json.dumps({"manifest": body, "signature": sig}, sort_keys=True, indent=1).encode()


def verify_manifest(data: bytes, pub: Ed25519PublicKey | str | Path, expect_version: int | None = None) -> Manifest:
    """Parse + verify an untrusted envelope; raises LayoutError/SignatureError with a clear reason."""
    try:
        pub = load_public_key(pub)
    except ValueError as e:  # a small-order origin key "verifies" forged manifests: nothing signed under it counts
        raise SignatureError(f"origin public key refused: {e}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise LayoutError(f"manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        env = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise LayoutError(f"manifest is not JSON: {type(e).__name__}") from None
    if not isinstance(env, dict) or set(env) != {"manifest", "signature"}:
        raise LayoutError("manifest envelope must be {manifest, signature}")
    sig = env["signature"]
    if not isinstance(sig, str) or len(sig) != 128 or not _HEX.fullmatch(sig):
        raise SignatureError("manifest signature must be 128 hex chars")
    try:
        pub.verify(bytes.fromhex(sig), canonical_json(env["manifest"]))
    except InvalidSignature:
        raise SignatureError("manifest signature does not verify under the origin public key") from None
    except (TypeError, ValueError) as e:  # non-serialisable body
        raise LayoutError(f"manifest body cannot be canonicalised: {e}") from None
    m = Manifest.from_dict(env["manifest"])
    if expect_version is not None and m.version != expect_version:
        raise SignatureError(f"manifest is signed for v{m.version}, served as v{expect_version}")
    return m
