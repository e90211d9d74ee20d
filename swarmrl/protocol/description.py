"""The run's description: everything a stranger's machine needs to join, signed by the orchestrator.

``GET /v1/run`` answers a ``SignedDescription``: the run's contract (``RLContract``: task and params, chat template,
group size, scoring, proof geometry, sampling settings), the packages that generate its tasks, the base model's
identity (the BLAKE3 of its bundle, SHARDCAST version 0: ``swarmrl.models.bundle``), where weights come from and the
key that signs their manifests, the heartbeat pacing and the stake a node must lock. The orchestrator signs it with
its own key (``orchestrator.pem`` in its data dir, made on first start); the join line an operator hands out names
that key (``--run-key``), so a node trusts the URL's answer only when the key matches, and the chain goes on from
there: the description names the weights key, the weights key signs version 0, whose hash the description names.

Pure: pydantic and the signing helpers; the client side (``read_description``) bounds what it reads before
decoding it.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from swarmrl.contract import RLContract
from swarmrl.shardcast.layout import canonical_json
from swarmrl.utils.keys import parse_public_key_bytes, public_key_hex

__all__ = ["BaseModelRef", "DescriptionError", "MAX_DESCRIPTION_BYTES", "PackagePin", "RunDescription",
           "SignedDescription", "sign_description", "verify_description"]

FORMAT = "swarmrl-run/1"
MAX_DESCRIPTION_BYTES = 256 << 10  # an answer longer than this is refused before it is decoded
_DOMAIN = b"swarmrl-run-v1\n"
_HEX64 = r"^[0-9a-f]{64}$"
_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[A-Za-z0-9._~/\-]*)?$")


class DescriptionError(ValueError):
    """An answer that is not a valid run description signed by the expected key (the reason is the message)."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class BaseModelRef(_Wire):
    """The base model: the BLAKE3 and size of its bundle, which is SHARDCAST version 0."""

    blake3: str = Field(..., pattern=_HEX64)
    bytes: int = Field(..., ge=1, le=1 << 42)


class PackagePin(_Wire):
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    version: str = Field("", pattern=r"^[A-Za-z0-9.+!_-]{0,64}$")


class WeightsRef(_Wire):
    servers: list[str] = Field(default_factory=list, max_length=64)
    public_key: str = Field("", pattern=r"^([0-9a-f]{64})?$")

    @field_validator("servers")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        bad = [u[:80] for u in v if len(u) > 300 or not _URL.match(u)]
        if bad:
            raise ValueError(f"not http(s) server URLs: {bad}")
        return v


class RunDescription(_Wire):
    format: Literal["swarmrl-run/1"] = FORMAT
    orchestrator_key: str = Field(..., pattern=_HEX64)  # the key that signs this description
    contract: RLContract
    requires: list[PackagePin] = Field(default_factory=list, max_length=16)
    base: BaseModelRef | None = None  # None until the trainer has published version 0
    weights: WeightsRef = Field(default_factory=WeightsRef)
    heartbeat_interval_s: float = Field(..., gt=0, le=86400)
    heartbeats_per_interval: int = Field(..., ge=1, le=10_000)
    min_stake: float = Field(..., ge=0, le=1e15)
    issued_at: int = Field(..., ge=0)


class SignedDescription(_Wire):
    description: RunDescription
    signature: str = Field(..., pattern=r"^[0-9a-f]{128}$")


def _message(description: dict) -> bytes:
    return _DOMAIN + canonical_json(description)


def sign_description(d: RunDescription, key) -> SignedDescription:  # noqa: ANN001  # an Ed25519PrivateKey
    if public_key_hex(key) != d.orchestrator_key:
        raise ValueError("the description names another key than the one signing it")
    return SignedDescription(description=d, signature=key.sign(_message(d.model_dump(mode="json"))).hex())


def verify_description(raw: bytes, pinned_key: str | None = None) -> RunDescription:
    """The description in ``raw`` (an answer of ``GET /v1/run``), checked: at most ``MAX_DESCRIPTION_BYTES``, JSON,
    its signature valid under the key it names, which must be ``pinned_key`` when one is given, and its schema.
    Raises ``DescriptionError`` with the reason."""
    if len(raw) > MAX_DESCRIPTION_BYTES:
        raise DescriptionError(f"the answer is over {MAX_DESCRIPTION_BYTES:,} bytes")
    try:
        doc = json.loads(raw, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not a number")))
    except (ValueError, UnicodeDecodeError) as e:
        raise DescriptionError(f"the answer is not JSON: {str(e)[:120]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("description"), dict) \
            or not isinstance(doc.get("signature"), str):
        raise DescriptionError("the answer is not a signed run description")
    key_hex = doc["description"].get("orchestrator_key")
    if not isinstance(key_hex, str) or not re.fullmatch(_HEX64, key_hex):
        raise DescriptionError("the description names no orchestrator key")
    if pinned_key is not None and key_hex != pinned_key.strip().lower():
        raise DescriptionError(f"the description is signed by {key_hex[:16]}..., not the run key "
                               f"{pinned_key.strip()[:16]}... you were given")
    try:
        pub = parse_public_key_bytes(bytes.fromhex(key_hex))
        pub.verify(bytes.fromhex(doc["signature"]), _message(doc["description"]))
    except Exception:  # noqa: BLE001  # InvalidSignature, a bad key or signature encoding: one answer for all
        raise DescriptionError("the description's signature does not verify") from None
    try:
        return SignedDescription.model_validate(doc).description
    except ValidationError as e:
        raise DescriptionError(f"the description does not match the schema: {str(e)[:300]}") from None
