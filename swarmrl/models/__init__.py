"""Models: tiny HF-format causal LMs made locally, local tokenizers, and loading any HF model dir.

Attributes are imported lazily so that importing the package (e.g. for its config) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ModelInitConfig": "swarmrl.models.config",
    "init_model": "swarmrl.models.tiny",
    "build_char_tokenizer": "swarmrl.models.tokenizer",
    "load_model": "swarmrl.models.io",
    "load_tokenizer": "swarmrl.models.io",
    "save_model": "swarmrl.models.io",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
