"""DiLoCo: low-communication data-parallel training (OpenDiLoCo), with a DDP baseline.

* ``swarmrl.diloco.outer``: pure math (pseudo-gradient, outer Nesterov step, wire compression).
* ``swarmrl.diloco.comm``: averaging backends (torch.distributed fixed group; hivemind DHT, elastic).
* ``swarmrl.diloco.worker``: one worker process; ``swarmrl.diloco.launch``: W workers on loopback.
"""

from swarmrl.diloco.config import DilocoConfig, HivemindConfig
from swarmrl.diloco.outer import OuterNesterov, compress, decompress, pseudo_gradient, warmup_cosine

__all__ = ["DilocoConfig", "HivemindConfig", "OuterNesterov", "pseudo_gradient", "compress", "decompress",
           "warmup_cosine", "run"]


def run(cfg: DilocoConfig, on_progress=None) -> dict:
    """Launch ``cfg.workers`` worker processes on loopback and return the run summary."""
    from swarmrl.diloco.launch import run as _run

    return _run(cfg, on_progress)
