"""Per-model TOPLOC thresholds: the calibration file ``<model dir>/toploc_thresholds.json``.

``swarmrl toploc calibrate --model DIR`` writes it (``swarmrl.toploc.calibrate``); the trainer copies the
base model's file into every policy version it commits, SHARDCAST downloads get it with the base model's other
small files, and the validator (and ``swarmrl toploc verify``) read it from the directory of the policy version
they check. Precedence, field by field: thresholds set explicitly in the verifier's config
(``ValidatorConfig.toploc_thresholds`` / ``sampling_thresholds``, ``toploc verify --set thresholds.*``) >
the calibration file of the model directory > the built-in defaults (``Thresholds()``, ``SamplingThresholds()``).

The file is read as untrusted input: at most ``MAX_CALIBRATION_BYTES``, a regular file, strict JSON (no NaN or
Infinity), a schema with bounded values, calibrated for the same architecture (``config.json`` fields) and proof
parameters (chunk, k) as the checker's. Anything else raises ``CalibrationError`` with the reason.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from swarmrl.config import StrictModel
from swarmrl.contract.params import ProofGeometry
from swarmrl.toploc.sampling_check import SamplingThresholds
from swarmrl.toploc.verify import Thresholds

__all__ = ["CALIBRATION_FILE", "CALIBRATION_FORMAT", "MAX_CALIBRATION_BYTES", "ARCH_KEYS", "Calibration",
           "CalibrationError", "ToplocSettings", "model_identity", "read_calibration", "write_calibration",
           "toploc_settings", "copy_calibration"]

CALIBRATION_FILE = "toploc_thresholds.json"
CALIBRATION_FORMAT = "swarmrl-toploc-calibration/1"
MAX_CALIBRATION_BYTES = 256 << 10
MAX_MANTISSA_ERR = 127.0  # bf16 has 7 mantissa bits: no mean or median error can be larger
# the config.json fields the thresholds depend on (a policy version keeps them; the trainer rewrites the rest)
ARCH_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "vocab_size")


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and the reason."""


class ModelIdentity(StrictModel):
    arch: dict[str, int | str | None]  # ARCH_KEYS of config.json, checked against the model dir read from
    config_sha256: str = Field(max_length=64)  # of config.json when calibrated (informational)
    weights: list[str] = Field(default_factory=list, max_length=256)  # weight file names (informational)
    dtype: str = Field(max_length=32)


class Calibration(StrictModel):
    format: Literal["swarmrl-toploc-calibration/1"]
    model: ModelIdentity
    proof: ProofGeometry  # the proof geometry it was made for (``contract.ProofGeometry``)
    thresholds: Thresholds
    sampling: dict[str, float] = Field(default_factory=dict, max_length=16)  # SamplingThresholds fields
    separable: bool  # the one-token edits it saw all fail with these thresholds, no honest rollout does
    figures: dict[str, Any] = Field(default_factory=dict)  # what the calibration saw (informational)

    @model_validator(mode="after")
    def _bounded(self) -> Calibration:
        t = self.thresholds
        if t.max_exp_mismatches > self.proof.k:
            raise ValueError(f"thresholds.max_exp_mismatches {t.max_exp_mismatches} is over k = {self.proof.k}")
        for name in ("max_mant_err_mean", "max_mant_err_median"):
            v = getattr(t, name)
            if not (math.isfinite(v) and v <= MAX_MANTISSA_ERR):
                raise ValueError(f"thresholds.{name} {v} is not in [0, {MAX_MANTISSA_ERR:g}]")
        for name, v in self.sampling.items():
            if not math.isfinite(v):
                raise ValueError(f"sampling.{name} is not finite")
        SamplingThresholds(**self.sampling)  # unknown names and out-of-range values are errors
        return self


def _config(model_dir: Path) -> tuple[dict, bytes]:
    raw = (model_dir / "config.json").read_bytes()
    return json.loads(raw), raw


def model_identity(model_dir: str | Path, dtype: str) -> ModelIdentity:
    d = Path(model_dir)
    cfg, raw = _config(d)
    weights = sorted(p.name for p in d.iterdir() if p.name.endswith((".safetensors", ".bin")))
    return ModelIdentity(arch={k: cfg.get(k) for k in ARCH_KEYS}, config_sha256=hashlib.sha256(raw).hexdigest(),
                         weights=weights, dtype=dtype)


def write_calibration(path: str | Path, cal: Calibration) -> Path:
    """Write ``cal`` atomically (temp name + rename); refuses what it would refuse to read."""
    p = Path(path)
    text = json.dumps(cal.model_dump(mode="json"), indent=1, allow_nan=False) + "\n"
    if len(text.encode()) > MAX_CALIBRATION_BYTES:
        raise CalibrationError(f"calibration for {p} is {len(text)} bytes, over {MAX_CALIBRATION_BYTES}")
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, p)
    return p


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def read_calibration(model_dir: str | Path, chunk: int | None = None, k: int | None = None,
                     path: str | Path | None = None) -> Calibration | None:
    """The calibration file of ``model_dir`` (or ``path``), checked; None when there is none.

    Raises ``CalibrationError`` when it exists but cannot be used: not a regular file, too big, not strict JSON,
    not the schema, values out of range, made for another architecture than ``model_dir``'s ``config.json``, or
    for other proof parameters than ``chunk`` / ``k`` (when given)."""
    d = Path(model_dir)
    p = Path(path) if path is not None else d / CALIBRATION_FILE
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CalibrationError(f"{p}: cannot stat: {e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CalibrationError(f"{p} is not a regular file")
    if st.st_size > MAX_CALIBRATION_BYTES:
        raise CalibrationError(f"{p} is {st.st_size} bytes, over the {MAX_CALIBRATION_BYTES}-byte limit")
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_CALIBRATION_BYTES + 1)
        if len(raw) > MAX_CALIBRATION_BYTES:
            raise CalibrationError(f"{p} is over the {MAX_CALIBRATION_BYTES}-byte limit")
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
    except CalibrationError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CalibrationError(f"{p} is not readable JSON: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise CalibrationError(f"{p}: expected a JSON object, got {type(data).__name__}")
    try:
        cal = Calibration.model_validate(data)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(x) for x in er['loc']) or '<root>'}: {er['msg']}" for er in e.errors()[:5])
        raise CalibrationError(f"{p} is not a calibration file ({CALIBRATION_FORMAT}): {errs}"[:1000]) from None
    try:
        arch = {k: v for k, v in _config(d)[0].items() if k in ARCH_KEYS}
    except (OSError, ValueError, AttributeError):
        arch = None  # no readable config.json next to it: the model loader will complain, not us
    if arch is not None:
        diff = sorted(key for key in ARCH_KEYS if cal.model.arch.get(key) != arch.get(key))
        if diff:
            raise CalibrationError(f"{p} was calibrated for another model: {', '.join(diff)} differ from "
                                   f"{d / 'config.json'}")
    for name, want in (("chunk", chunk), ("k", k)):
        if want is not None and getattr(cal.proof, name) != want:
            raise CalibrationError(f"{p} was calibrated for {name} = {getattr(cal.proof, name)}; proofs here "
                                   f"use {name} = {want}")
    return cal


def copy_calibration(base_model_dir: str | Path, dest_dir: str | Path) -> bool:
    """Copy the base model's calibration file into a model dir being written (the trainer's staged versions)."""
    src = Path(base_model_dir) / CALIBRATION_FILE
    if not src.is_file():
        return False
    shutil.copyfile(src, Path(dest_dir) / CALIBRATION_FILE)  # checked by whoever reads it
    return True


@dataclass
class ToplocSettings:
    """The thresholds a checker uses for one model dir (None: nothing set anywhere, the checker's defaults)."""

    thresholds: Thresholds | None
    sampling: SamplingThresholds | None
    source: str  # where they came from, for logs


def toploc_settings(model_dir: str | Path | None, thresholds: dict[str, Any] | None = None,
                    sampling: dict[str, Any] | None = None, use_file: bool = True, chunk: int | None = None,
                    k: int | None = None) -> ToplocSettings:
    """Thresholds for checking proofs of ``model_dir``'s model: explicit ``thresholds`` / ``sampling`` fields >
    the dir's calibration file (``use_file``) > defaults. Raises ``CalibrationError`` for an unusable file."""
    cal = read_calibration(model_dir, chunk, k) if use_file and model_dir else None
    th = {**(cal.thresholds.model_dump() if cal else {}), **(thresholds or {})}
    sm = {**(cal.sampling if cal else {}), **(sampling or {})}
    parts = [*(["config"] if thresholds or sampling else []),
             *([f"calibration file {Path(model_dir) / CALIBRATION_FILE}"] if cal else [])]
    return ToplocSettings(Thresholds(**th) if th else None, SamplingThresholds(**sm) if sm else None,
                          " > ".join(parts) or "defaults")
