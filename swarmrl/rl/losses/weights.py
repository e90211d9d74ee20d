"""Per-token normalisation weights, computed over the WHOLE batch (so micro-batching and data-parallel ranks give
the same gradient as one big batch):

- ``sequence``: mean over a sequence's tokens, then mean over sequences;
- ``token``: mean over all tokens of the batch;
- ``constant``: sum over all tokens divided by a constant (num_sequences * max_tokens by default).
"""

from __future__ import annotations

import torch

from swarmrl.rl.losses.objective import Normalization


def token_weights(lengths: list[int], normalization: Normalization, constant: float | None = None,
                  total_sequences: int | None = None, total_tokens: int | None = None,
                  max_tokens: int | None = None) -> list[torch.Tensor]:
    """Per-token weights for sequences of the given lengths.

    ``total_sequences``/``total_tokens`` describe the GLOBAL batch (defaults: these sequences).
    """
    n_seq = total_sequences if total_sequences is not None else len(lengths)
    n_tok = total_tokens if total_tokens is not None else sum(lengths)
    out = []
    for n in lengths:
        if normalization == "sequence":
            w = 1.0 / (n_seq * max(n, 1))
        elif normalization == "token":
            w = 1.0 / max(n_tok, 1)
        elif normalization == "constant":
            c = constant if constant is not None else n_seq * (max_tokens or max(lengths))
            w = 1.0 / c
        else:
            raise ValueError(f"unknown normalization {normalization!r}")
        out.append(torch.full((n,), w, dtype=torch.float32))
    return out
