"""Models: tiny HF-format causal LMs made locally, local tokenizers, and loading any HF model dir."""

from swarmrl.models.io import load_model, load_tokenizer, save_model
from swarmrl.models.tiny import ModelInitConfig, init_model
from swarmrl.models.tokenizer import build_char_tokenizer

__all__ = ["ModelInitConfig", "init_model", "build_char_tokenizer", "load_model", "load_tokenizer", "save_model"]
