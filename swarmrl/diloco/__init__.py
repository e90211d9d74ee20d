"""DiLoCo: low-communication data-parallel training (OpenDiLoCo), with a DDP baseline.

* ``swarmrl.diloco.outer``: pure math (pseudo-gradient, outer Nesterov step, wire compression).
* ``swarmrl.diloco.overlap``: ``overlap_steps = "auto"``: whether, and by how many inner steps, a round's averaging
  runs behind (pure arithmetic on the times the worker measures).
* ``swarmrl.diloco.comm``: averaging backends (torch.distributed fixed group; hivemind DHT, elastic);
  ``swarmrl.diloco.peers``: hivemind's peers file and the outer state a joining worker downloads, checked.
* ``swarmrl.diloco.corpus``: the default data (the interpreter's standard library source, split by file).
* ``swarmrl.diloco.trust``: ``backend = "swarm"``: signed uploads to a judging aggregator, slashing via the ledger.
* ``swarmrl.diloco.worker``: one worker process; ``swarmrl.diloco.launch``: W workers on loopback.
* ``swarmrl.diloco.wan``: W workers, each in a network namespace of the WAN harness (``swarmrl.wan``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from swarmrl.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from swarmrl.diloco.config import DilocoConfig

# Attributes load on first use: importing the package (e.g. for its config) must not import torch.
_EXPORTS = {
    "DilocoConfig": "swarmrl.diloco.config", "HivemindConfig": "swarmrl.diloco.config",
    "OuterNesterov": "swarmrl.diloco.outer", "pseudo_gradient": "swarmrl.diloco.outer",
    "compress": "swarmrl.diloco.outer", "decompress": "swarmrl.diloco.outer",
}

__all__ = ["DilocoConfig", "HivemindConfig", "OuterNesterov", "pseudo_gradient", "compress", "decompress", "run"]


def run(cfg: DilocoConfig, on_progress=None) -> dict:
    """Launch ``cfg.workers`` worker processes on loopback and return the run summary."""
    from swarmrl.diloco.launch import run as _run  # noqa: PLC0415  # lazy: torch

    return _run(cfg, on_progress)


__getattr__ = lazy_exports(_EXPORTS)
