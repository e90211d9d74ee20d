"""Hostile DiLoCo workers, for benchmarks and tests of the judging aggregator (``swarmrl.diloco.trust``).

A hostile worker is a member like any other: registered with its key and stake, it signs its uploads correctly and
binds them to the round and the anchor; only what it uploads is not its honest pseudo-gradient. It is selected by
``TrustConfig.adversary`` for the ranks in ``adversary_ranks``: the loopback launcher (``swarmrl.diloco.trust.
launch``) starts those ranks as ``python -m swarmrl.attacks.diloco`` (the worker's arguments; its caller names this
module, ``HOSTILE_ENTRY``: ``swarmrl diloco``, the attack benchmark, the tests), which runs the honest worker
(``swarmrl.diloco.worker.run_worker``) with this module's hook. No honest role imports this module.

=========  ================================================================================================
kind       what it uploads in round r
=========  ================================================================================================
sign_flip  minus its honest pseudo-gradient
scale      its honest pseudo-gradient times ``adversary_scale`` (x100 by default)
random     Gaussian noise with the norm of its honest pseudo-gradient
stale      its honest pseudo-gradient of round r - 2, re-sent for round r (honest in rounds 0 and 1)
replay     the bytes of round r - 1's published update, re-sent as its own (honest in round 0)
=========  ================================================================================================

``upload(r, pg)`` answers what to send instead: a float vector the client quantizes and signs like an honest one
(``sign_flip``, ``scale``, ``random``, ``stale``), int8 bytes it re-sends as they were (``replay``), or None (send
the honest pseudo-gradient). The client tells it what it sent (``sent``) and what was published (``published``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from swarmrl.diloco.config import DilocoConfig

DILOCO_ADVERSARIES: tuple[str, ...] = ("sign_flip", "scale", "random", "stale", "replay")
HOSTILE_ENTRY = "swarmrl.attacks.diloco"  # what the launcher runs the hostile ranks as (``run(..., hostile_entry)``)

Int8Upload = tuple[torch.Tensor, torch.Tensor]  # (codes int8, scales fp32) as they travel (trust.wire)


class DilocoAdversary:
    """What one hostile worker uploads in place of its pseudo-gradient (see the module's table)."""

    def __init__(self, kind: str, scale: float = 100.0, seed: int = 0) -> None:
        if kind not in DILOCO_ADVERSARIES:
            raise ValueError(f"unknown DiLoCo adversary {kind!r}; choose from {', '.join(DILOCO_ADVERSARIES)}")
        self.kind, self.scale, self.seed = kind, float(scale), int(seed)
        self._honest: dict[int, torch.Tensor] = {}  # round -> its honest pseudo-gradient (stale: kept 2 rounds)
        self._sent: dict[int, Int8Upload] = {}  # round -> what this worker uploaded (kept 2 rounds)
        self._published: dict[int, Int8Upload] = {}  # round -> the published update (kept 1 round)

    def upload(self, rnd: int, pg: torch.Tensor) -> torch.Tensor | Int8Upload | None:
        """Round ``rnd``'s upload given the honest pseudo-gradient ``pg``; None: the honest one."""
        kind = self.kind
        if kind == "sign_flip":
            return -pg.float()
        if kind == "scale":
            return pg.float() * self.scale
        if kind == "random":
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + rnd)
            noise = torch.randn(pg.numel(), generator=gen)
            norm = float(pg.float().norm())
            return noise * (norm / max(float(noise.norm()), 1e-30))
        if kind == "stale":
            self._honest[rnd] = pg.detach().float().clone()
            for old in [r for r in self._honest if r < rnd - 2]:
                del self._honest[old]
            return self._honest.get(rnd - 2)
        return self._published.get(rnd - 1)  # replay

    def sent(self, rnd: int, up: Int8Upload) -> None:
        """The client uploaded ``up`` for round ``rnd``."""
        self._sent[rnd] = up
        for old in [r for r in self._sent if r < rnd - 2]:
            del self._sent[old]

    def published(self, rnd: int, up: Int8Upload) -> None:
        """Round ``rnd``'s published update was ``up``."""
        self._published = {rnd: up}


def make_diloco_adversary(kind: str, rank: int, scale: float = 100.0, seed: int = 0) -> DilocoAdversary:
    """The adversary of worker ``rank`` (its noise seeded apart from every other worker's)."""
    return DilocoAdversary(kind, scale=scale, seed=seed * 1009 + rank)


def main(argv: list[str] | None = None) -> None:
    """``python -m swarmrl.attacks.diloco --config CFG.json --rank R --world W``: the worker, hostile as
    ``cfg.trust.adversary`` says (exits with ``EJECTED_EXIT`` once the orchestrator ejects it)."""
    from swarmrl.diloco.worker import run_worker  # noqa: PLC0415  # heavy: only when run as a worker

    ap = argparse.ArgumentParser(description="a hostile swarmrl DiLoCo worker (benchmarks and tests)")
    ap.add_argument("--config", required=True, help="JSON file with a DilocoConfig (backend swarm)")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    args = ap.parse_args(argv)
    cfg = DilocoConfig.model_validate_json(Path(args.config).read_text())
    tr = cfg.trust
    if cfg.backend != "swarm" or tr.adversary == "none":
        ap.error("a hostile worker needs backend 'swarm' and trust.adversary set")
    run_worker(cfg, args.rank, args.world,
               tamper=make_diloco_adversary(tr.adversary, args.rank, scale=tr.adversary_scale, seed=cfg.seed))


if __name__ == "__main__":
    from swarmrl.utils.procs import adopt_parent_death

    adopt_parent_death()  # started by the launcher with child_env: die with it
    main()
