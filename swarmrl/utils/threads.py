"""How many CPU threads a role process computes with.

Roles of one run share a host (``swarmrl run`` starts the trainer, workers or nodes, the validator and the
adapter side by side), so each role defaults to ONE thread: N processes each starting a pool of all cores
oversubscribe the CPU, and every pool thread costs memory. ``threads`` in a role's config raises it (0: the
libraries' own default, all cores, for a role alone on its machine). The supervisor also starts every role with
``OMP_NUM_THREADS=1`` unless the environment says otherwise.
"""

from __future__ import annotations

import sys

__all__ = ["set_role_threads"]


def set_role_threads(n: int) -> None:
    """``n`` intra-op threads for torch and ``n`` for pyarrow's CPU pool, for the libraries this process has
    imported (a role that never loads torch, such as the adapter, does not pay for importing it here); n <= 0
    leaves their defaults."""
    if n <= 0:
        return
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.set_cpu_count(n)
