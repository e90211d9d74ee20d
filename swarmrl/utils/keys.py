"""Ed25519 helpers shared by every component that signs (protocol requests, SHARDCAST manifests)."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The raw 32-byte public key as 64 lowercase hex chars."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
