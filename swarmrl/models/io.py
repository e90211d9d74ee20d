"""Loading and saving HF causal LMs: any local model directory works wherever a model is expected."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import shutil

from transformers.utils import logging as _hf_logging  # noqa: E402

_hf_logging.disable_progress_bar()

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(_DTYPES)}") from None


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p} is not a Hugging Face model directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(p, dtype=resolve_dtype(dtype), local_files_only=True)
    model.to(device)
    model.eval()
    return model


def load_tokenizer(path: str | Path):
    tok = AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def save_model(model: PreTrainedModel, tokenizer, out_dir: str | Path) -> Path:
    """Save as safetensors + tokenizer, written to a temp dir and renamed (a crash leaves no half model)."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if out.exists():
        old = out.with_name(out.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old)
    else:
        tmp.rename(out)
    return out


def save_inference_weights(model: PreTrainedModel, out_dir: str | Path, dtype: str = "float32",
                           master_dir: str | Path | None = None) -> None:
    """``model`` as a policy version's published weights in ``out_dir``: its ``model.safetensors`` holds every
    floating-point tensor cast to ``dtype`` (round to nearest even, as ``Tensor.to`` does), the config beside it.
    Loaders read it at the precision they ask for (``load_model``), so a float32 holder holds exactly these values.
    ``master_dir``: when the cast loses precision, the model at its own precision is saved there too (the trainer
    resumes from it)."""
    want = resolve_dtype(dtype)
    if all(p.dtype == want for p in model.state_dict().values() if p.is_floating_point()):
        model.save_pretrained(out_dir, safe_serialization=True)
        return
    if master_dir is not None:
        model.save_pretrained(master_dir, safe_serialization=True)
    cast: dict[str, torch.Tensor] = {}
    once: dict[tuple[int, torch.dtype, tuple[int, ...]], torch.Tensor] = {}  # a tied tensor stays one tensor
    for k, v in model.state_dict().items():
        if v.is_floating_point():
            v = once.setdefault((v.data_ptr(), v.dtype, tuple(v.shape)), v.detach().to(want))
        cast[k] = v
    model.save_pretrained(out_dir, state_dict=cast, safe_serialization=True)
