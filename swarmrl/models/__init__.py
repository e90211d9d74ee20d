"""Models: tiny HF-format causal LMs made locally, local tokenizers, and loading any HF model dir.

Attributes are imported lazily so that importing the package (e.g. for its config) stays light.
"""

from __future__ import annotations

from swarmrl.utils.lazy import lazy_exports

_EXPORTS = {
    "ModelInitConfig": "swarmrl.models.config",
    "init_model": "swarmrl.models.tiny",
    "build_char_tokenizer": "swarmrl.models.tokenizer",
    "load_model": "swarmrl.models.io",
    "load_tokenizer": "swarmrl.models.io",
    "save_model": "swarmrl.models.io",
}
__all__ = list(_EXPORTS)

__getattr__ = lazy_exports(_EXPORTS)
