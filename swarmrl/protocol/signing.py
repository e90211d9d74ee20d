"""Request signing with Ed25519: the one scheme shared by node clients and the orchestrator.

Pure module (no server or HTTP-library imports). A signed request carries five headers:

- ``X-Swarm-Key``: the signer's Ed25519 public key, 64 hex chars
- ``X-Swarm-Timestamp``: unix seconds (integer) when signed
- ``X-Swarm-Nonce``: 32 hex chars, random per request
- ``X-Swarm-Content-SHA256``: sha256 of the request body, hex (for uploads: of the file streamed)
- ``X-Swarm-Signature``: Ed25519 signature (hex) over the canonical message

The canonical message is ``swarmrl-req-v1\\n{METHOD}\\n{path?query}\\n{sha256}\\n{timestamp}\\n{nonce}``
encoded as UTF-8. Node ids are the first 16 bytes of blake2b(public key), hex.

A signature authenticates one request and nothing after it: the orchestrator checks it on arrival and does not
keep it (a verdict is recorded with the validator's node id, not with its signature).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from swarmrl.utils.keys import (  # noqa: F401  (re-exported)
    generate_key,
    load_private_key,
    parse_public_key_bytes,
    public_key_hex,
    save_private_key,
)

SCHEME = "swarmrl-req-v1"
H_KEY = "X-Swarm-Key"
H_TS = "X-Swarm-Timestamp"
H_NONCE = "X-Swarm-Nonce"
H_HASH = "X-Swarm-Content-SHA256"
H_SIG = "X-Swarm-Signature"
SIGNED_HEADERS = (H_KEY, H_TS, H_NONCE, H_HASH, H_SIG)

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX128 = re.compile(r"^[0-9a-f]{128}$")
_NONCE = re.compile(r"^[0-9a-f]{16,64}$")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class SignatureError(ValueError):
    """A request's signature headers are missing, malformed or do not verify."""


def node_id_for(public_key: str) -> str:
    """A short stable id for a public key (hex): blake2b-128 of the raw key bytes."""
    return hashlib.blake2b(bytes.fromhex(public_key), digest_size=16).hexdigest()


def parse_public_key(hex_key: str) -> Ed25519PublicKey:
    """An untrusted public key (64 lowercase hex); small-order and non-canonical keys are refused."""
    if not isinstance(hex_key, str) or not _HEX64.match(hex_key):
        raise SignatureError("public key must be 64 lowercase hex characters")
    try:
        return parse_public_key_bytes(bytes.fromhex(hex_key))
    except ValueError as e:
        raise SignatureError(str(e)) from None


def body_sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def canonical_message(method: str, path: str, content_sha256: str, timestamp: int, nonce: str) -> bytes:
    return f"{SCHEME}\n{method.upper()}\n{path}\n{content_sha256}\n{timestamp}\n{nonce}".encode()


def sign_request(key: Ed25519PrivateKey, method: str, path: str, body: bytes = b"", *,
                 content_sha256: str | None = None, timestamp: int | None = None,
                 nonce: str | None = None) -> dict[str, str]:
    """The signature headers for one request. ``path`` includes the query string, if any."""
    digest = content_sha256 if content_sha256 is not None else body_sha256(body)
    ts = int(time.time()) if timestamp is None else int(timestamp)
    nonce = nonce or secrets.token_hex(16)
    sig = key.sign(canonical_message(method, path, digest, ts, nonce))
    return {H_KEY: public_key_hex(key), H_TS: str(ts), H_NONCE: nonce, H_HASH: digest, H_SIG: sig.hex()}


@dataclass(frozen=True)
class SignedHeaders:
    public_key: str
    timestamp: int
    nonce: str
    content_sha256: str
    signature: bytes

    @property
    def node_id(self) -> str:
        return node_id_for(self.public_key)


def parse_headers(headers) -> SignedHeaders:
    """Pull and syntax-check the signature headers (``headers``: any case-insensitive mapping)."""
    missing = [h for h in SIGNED_HEADERS if not headers.get(h)]
    if missing:
        raise SignatureError(f"missing signature headers: {', '.join(missing)}")
    key = headers.get(H_KEY).strip().lower()
    if not _HEX64.match(key):
        raise SignatureError(f"{H_KEY} must be 64 hex characters")
    try:
        ts = int(headers.get(H_TS))
    except ValueError:
        raise SignatureError(f"{H_TS} must be an integer (unix seconds)") from None
    nonce = headers.get(H_NONCE).strip().lower()
    if not _NONCE.match(nonce):
        raise SignatureError(f"{H_NONCE} must be 16-64 hex characters")
    digest = headers.get(H_HASH).strip().lower()
    if not _HEX64.match(digest):
        raise SignatureError(f"{H_HASH} must be a hex sha256")
    sig = headers.get(H_SIG).strip().lower()
    if not _HEX128.match(sig):
        raise SignatureError(f"{H_SIG} must be 128 hex characters")
    return SignedHeaders(key, ts, nonce, digest, bytes.fromhex(sig))


def verify_signature(h: SignedHeaders, method: str, path: str) -> None:
    """Raise ``SignatureError`` unless ``h.signature`` signs this request under ``h.public_key``."""
    try:
        pub = parse_public_key(h.public_key)
    except ValueError as e:
        raise SignatureError(f"bad public key: {e}") from None
    try:
        pub.verify(h.signature, canonical_message(method, path, h.content_sha256, h.timestamp, h.nonce))
    except InvalidSignature:
        raise SignatureError("signature does not verify") from None


def check_timestamp(ts: int, max_skew_s: float, now: float | None = None) -> None:
    now = time.time() if now is None else now
    if abs(now - ts) > max_skew_s:
        raise SignatureError(f"stale timestamp: {ts} is {now - ts:+.0f}s from server time "
                             f"(allowed +-{max_skew_s:.0f}s)")
