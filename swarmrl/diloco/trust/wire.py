"""The aggregator's wire formats (safetensors bytes) and their validation (no server imports).

* upload (``POST /v1/diloco/rounds/{r}/contributions``): ``codes`` int8 ``[numel]`` and ``scales`` fp32
  ``[ceil(numel / int8_chunk)]``; metadata ``{"run_id", "round", "anchor_digest"}``;
* result (``GET /v1/diloco/rounds/{r}/result``): the published outer update in the same two tensors; metadata
  ``{"round", "anchor_digest", "anchor_digest_after", "accepted", "rejected", "score_seed"}`` (lists as JSON);
* state (``GET /v1/diloco/state``): ``anchor`` fp32 ``[numel]``, ``momentum`` fp32 ``[numel]`` or ``[0]``;
  metadata ``{"round", "outer_steps", "anchor_digest"}``.

``scales`` are the chunk scales themselves (chunk absmax / 127, ``quantize``): the vector is ``codes * scales``
chunk-wise (``dequantize``), the one function every party uses, so the aggregator and the workers apply
bit-identical updates. Codes are int8 (finite by type); scales must be finite and so must the dequantized vector.

``check_upload`` validates before anything else is done with an upload: the safetensors header is parsed by hand
and bounded (its length, names, dtypes, shapes, offsets, metadata schema) before the tensors are decoded, and the
decoded sizes are checked against the run's exact sizes. ``WireError`` carries the HTTP status to answer.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from swarmrl.diloco.outer import Int8Chunked, params_digest

__all__ = ["WireError", "UploadMeta", "Upload", "Result", "State", "MAX_HEADER_BYTES", "LEVELS",
           "n_chunks", "max_upload_bytes", "quantize", "dequantize", "anchor_digest", "encode_upload",
           "check_upload", "encode_result", "decode_result", "encode_state", "decode_state"]

LEVELS = 127  # one uploader per vector: the full int8 range per side
MAX_HEADER_BYTES = 4096  # the safetensors JSON header of an upload (two tensors, three short strings)
_DTYPES = {"I8": torch.int8, "F32": torch.float32}


class WireError(ValueError):
    """A refused payload: ``status`` (413, 422, 409) and the reason."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def n_chunks(numel: int, chunk: int) -> int:
    return -(-numel // chunk)


def max_upload_bytes(numel: int, chunk: int) -> int:
    """The exact size of the tensors plus the header's bound: anything larger is refused (413)."""
    return 8 + MAX_HEADER_BYTES + numel + 4 * n_chunks(numel, chunk)


def anchor_digest(anchor: torch.Tensor) -> str:
    return params_digest(anchor)


def quantize(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8, scales fp32): ``x`` rounded to 127 steps per side of each chunk's absmax."""
    q = Int8Chunked(chunk)
    absmax = q.absmax(x.float())
    return q.quantize(x.float(), absmax, LEVELS), q.scales(absmax, LEVELS).float().contiguous()


def dequantize(codes: torch.Tensor, scales: torch.Tensor, chunk: int) -> torch.Tensor:
    """``codes * scales`` chunk-wise, fp32 (the one dequantization every party applies)."""
    n = codes.numel()
    pad = len(scales) * chunk - n
    c = codes.reshape(-1).float()
    if pad:
        c = torch.cat([c, c.new_zeros(pad)])
    return (c.view(-1, chunk) * scales.float()[:, None]).reshape(-1)[:n]


class _Meta(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class UploadMeta(_Meta):
    run_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    round: str = Field(pattern=r"^(0|[1-9][0-9]{0,11})$")
    anchor_digest: str = Field(pattern=r"^[0-9a-f]{16}$")


@dataclass
class Upload:
    meta: UploadMeta
    codes: torch.Tensor
    scales: torch.Tensor
    vector: torch.Tensor  # dequantized, fp32

    @property
    def round(self) -> int:
        return int(self.meta.round)


def encode_upload(codes: torch.Tensor, scales: torch.Tensor, run_id: str, round_no: int, digest: str) -> bytes:
    meta = {"run_id": run_id, "round": str(int(round_no)), "anchor_digest": digest}
    return st_save({"codes": codes.reshape(-1).to(torch.int8).contiguous(),
                    "scales": scales.reshape(-1).float().contiguous()}, metadata=meta)


def _header(body: bytes, max_header: int) -> dict:
    """The safetensors header of ``body`` as a dict, bounded and structurally checked (422 otherwise)."""
    if len(body) < 8:
        raise WireError(422, "not safetensors: shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", body[:8])
    if n > max_header or 8 + n > len(body):
        raise WireError(422, f"not safetensors: header of {n} bytes (at most {max_header}, within the body)")
    try:
        head = json.loads(body[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WireError(422, "not safetensors: the header is not JSON") from None
    if not isinstance(head, dict):
        raise WireError(422, "not safetensors: the header is not a JSON object")
    return head


def _check_tensors(head: dict, want: dict[str, tuple[str, list[int]]], data_bytes: int) -> None:
    """Exactly the ``want`` tensors (name -> dtype, shape), packed back to back over ``data_bytes`` (422)."""
    names = sorted(k for k in head if k != "__metadata__")
    if names != sorted(want):
        raise WireError(422, f"tensors must be exactly {sorted(want)}, got {[n[:40] for n in names[:8]]}")
    spans = []
    for name, (dtype, shape) in want.items():
        spec = head[name]
        if not isinstance(spec, dict) or spec.get("dtype") != dtype:
            got = spec.get("dtype") if isinstance(spec, dict) else spec
            raise WireError(422, f"{name}: dtype must be {dtype}, got {str(got)[:40]}")
        if spec.get("shape") != shape:
            raise WireError(422, f"{name}: shape must be {shape}, got {str(spec.get('shape'))[:60]}")
        off = spec.get("data_offsets")
        if not (isinstance(off, list) and len(off) == 2 and all(type(o) is int for o in off)):
            raise WireError(422, f"{name}: data_offsets must be two integers, got {str(off)[:60]}")
        if off[1] - off[0] != math.prod(shape) * _DTYPES[dtype].itemsize:
            raise WireError(422, f"{name}: data offsets {off} do not fit its shape")
        spans.append(off)
    end = 0
    for start, stop in sorted(spans):
        if start != end:
            raise WireError(422, "tensor data overlaps or leaves gaps")
        end = stop
    if end != data_bytes:
        raise WireError(422, f"{data_bytes} bytes of tensor data where {end} were expected")


def _metadata(head: dict) -> dict:
    meta = head.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise WireError(422, "metadata must map names to strings")
    return meta


def _tensors(body: bytes) -> dict[str, torch.Tensor]:
    try:
        return st_load(body)
    except Exception as e:  # safetensors raises its own error types
        raise WireError(422, f"not safetensors: {str(e)[:200]}") from None


def check_upload(body: bytes, numel: int, chunk: int, *, run_id: str, round_no: int, digest: str) -> Upload:
    """Validate an upload for the open round ``round_no`` of ``run_id`` whose anchor is ``digest``: 413 over the
    size bound, 422 malformed (names, dtypes, shapes, metadata, NaN or infinite scales or values), 409 for another
    run, round or anchor. Nothing is decoded before the header passed."""
    if len(body) > max_upload_bytes(numel, chunk):
        raise WireError(413, f"upload of {len(body)} bytes is over the {max_upload_bytes(numel, chunk)}-byte limit")
    head = _header(body, MAX_HEADER_BYTES)
    k = n_chunks(numel, chunk)
    _check_tensors(head, {"codes": ("I8", [numel]), "scales": ("F32", [k])},
                   len(body) - 8 - struct.unpack("<Q", body[:8])[0])
    try:
        meta = UploadMeta.model_validate(_metadata(head))
    except ValidationError as e:
        raise WireError(422, f"bad metadata: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
    if meta.run_id != run_id:
        raise WireError(409, f"upload for run {meta.run_id!r}, this is run {run_id!r}")
    if int(meta.round) != round_no:
        raise WireError(409, f"upload for round {meta.round}, the open round is {round_no}")
    if meta.anchor_digest != digest:
        raise WireError(409, f"upload computed from anchor {meta.anchor_digest}, round {round_no}'s is {digest}")
    t = _tensors(body)
    codes, scales = t["codes"], t["scales"]
    if codes.dtype != torch.int8 or codes.shape != (numel,) or scales.dtype != torch.float32 or scales.shape != (k,):
        raise WireError(422, "decoded tensors do not have the announced dtype and shape")
    if not torch.isfinite(scales).all():
        raise WireError(422, "scales hold NaN or infinite values")
    vector = dequantize(codes, scales, chunk)
    if not torch.isfinite(vector).all():
        raise WireError(422, "the dequantized vector overflows (scales too large)")
    return Upload(meta, codes, scales, vector)


@dataclass
class Result:
    round: int
    anchor_digest: str
    anchor_digest_after: str
    accepted: list[str]
    rejected: list[dict]
    score_seed: int
    codes: torch.Tensor
    scales: torch.Tensor

    def vector(self, chunk: int) -> torch.Tensor:
        return dequantize(self.codes, self.scales, chunk)


def encode_result(r: Result) -> bytes:
    meta = {"round": str(r.round), "anchor_digest": r.anchor_digest, "anchor_digest_after": r.anchor_digest_after,
            "accepted": json.dumps(r.accepted), "rejected": json.dumps(r.rejected), "score_seed": str(r.score_seed)}
    return st_save({"codes": r.codes.contiguous(), "scales": r.scales.contiguous()}, metadata=meta)


def decode_result(body: bytes, numel: int, chunk: int) -> Result:
    """A published result, checked (a worker trusts the aggregator's signature-free reply only this far)."""
    head = _header(body, 1 << 20)
    k = n_chunks(numel, chunk)
    _check_tensors(head, {"codes": ("I8", [numel]), "scales": ("F32", [k])},
                   len(body) - 8 - struct.unpack("<Q", body[:8])[0])
    meta = _metadata(head)
    try:
        r = Result(int(meta["round"]), meta["anchor_digest"], meta["anchor_digest_after"],
                   json.loads(meta["accepted"]), json.loads(meta["rejected"]), int(meta.get("score_seed", "0")),
                   torch.empty(0), torch.empty(0))
    except (KeyError, ValueError) as e:
        raise WireError(422, f"bad result metadata: {e}") from None
    t = _tensors(body)
    r.codes, r.scales = t["codes"], t["scales"]
    if not torch.isfinite(r.scales).all():
        raise WireError(422, "result scales hold NaN or infinite values")
    return r


@dataclass
class State:
    round: int
    outer_steps: int
    anchor_digest: str
    anchor: torch.Tensor
    momentum: torch.Tensor | None


def encode_state(s: State) -> bytes:
    mom = s.momentum if s.momentum is not None else torch.zeros(0)
    meta = {"round": str(s.round), "outer_steps": str(s.outer_steps), "anchor_digest": s.anchor_digest}
    return st_save({"anchor": s.anchor.float().contiguous(), "momentum": mom.float().contiguous()}, metadata=meta)


def decode_state(body: bytes, numel: int) -> State:
    head = _header(body, 1 << 20)
    meta = _metadata(head)
    t = _tensors(body)
    anchor, mom = t.get("anchor"), t.get("momentum")
    if anchor is None or mom is None or anchor.shape != (numel,) or mom.numel() not in (0, numel):
        raise WireError(422, "state tensors do not match this model")
    if not torch.isfinite(anchor).all() or not torch.isfinite(mom).all():
        raise WireError(422, "state holds non-finite values")
    try:
        return State(int(meta["round"]), int(meta["outer_steps"]), meta["anchor_digest"], anchor.float(),
                     mom.float() if mom.numel() else None)
    except (KeyError, ValueError) as e:
        raise WireError(422, f"bad state metadata: {e}") from None
