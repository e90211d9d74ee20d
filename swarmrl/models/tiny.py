"""Tiny HF-architecture models (Qwen2 or Llama) initialised locally from a config."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, Qwen2Config

from swarmrl.models.config import ModelInitConfig
from swarmrl.models.io import save_model
from swarmrl.models.tokenizer import build_char_tokenizer


def init_model(cfg: ModelInitConfig, out_dir: str | Path | None = None) -> tuple[PreTrainedModel, object]:
    """Create a fresh model + char tokenizer; save both to ``out_dir`` when given."""
    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"hidden_size {cfg.hidden_size} must be divisible by num_heads {cfg.num_heads}")
    tokenizer = build_char_tokenizer(model_max_length=cfg.max_position_embeddings)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads or cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
    )
    config = Qwen2Config(**common) if cfg.arch == "qwen2" else LlamaConfig(**common)

    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    if out_dir is not None:
        save_model(model, tokenizer, out_dir)
    return model, tokenizer
