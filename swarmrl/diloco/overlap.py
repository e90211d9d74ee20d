"""``overlap_steps = "auto"``: whether, and by how many inner steps, a worker runs each outer round's averaging in
the background (``swarmrl.diloco.worker``; the overlapped step itself is ``outer.apply_delayed``).

What one averaging costs is known at the first outer sync over torch.distributed (an all-reduce of the same size
timed at set-up: ``TorchDistributedAverager.probe``); over hivemind a round costs at least its matchmaking time,
and if that bound alone calls for overlap the worker overlaps by H from the first round, else it times its first
(blocking) round and decides after it. Overlap is on when the cost exceeds ``overlap_auto_share`` of a round's
inner-step time (H x the mean inner step so far); tau is then the inner steps that cover it x ``MARGIN``. Over
hivemind tau is at most H. Over torch.distributed, if tau exceeds H the rounds lengthen to tau steps
(``round_steps``): on a link where one averaging outlasts a round of H steps (wan20lossy at H = 32: 3.5 s against
2 s of inner steps), the workers go on computing instead of waiting, and send fewer bytes. Free of processes and
networks: the worker passes the times, and the group's agreement as a function.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from swarmrl.diloco.config import DilocoConfig

__all__ = ["MARGIN", "AutoOverlap", "choose_tau"]

MARGIN = 1.25  # tau covers the measured averaging time this many times over (rounds on a lossy link vary)


def choose_tau(comm_s: float, step_s: float, inner_steps: int, share: float, floor: int = 0,
               stretch: bool = False) -> int:
    """0 if one averaging (``comm_s``) takes at most ``share`` of a round's inner steps (``inner_steps`` x
    ``step_s``), else the inner steps that cover it x ``MARGIN``, at least ``floor``, at most ``inner_steps`` unless
    ``stretch`` (the rounds may lengthen to it)."""
    if comm_s <= share * inner_steps * step_s:
        return 0
    tau = max(floor, math.ceil(MARGIN * comm_s / max(step_s, 1e-9)))
    return tau if stretch else min(inner_steps, tau)


class AutoOverlap:
    """One worker's "auto" decision: the averaging's cost (``comm_s``: probed, bounded or timed) and, once taken,
    the decision (``decision``: tau, this worker's own choice, the times behind it)."""

    def __init__(self, cfg: DilocoConfig) -> None:
        self.cfg = cfg
        self.comm_s: float | None = None
        self.floor = 0
        self.decision: dict | None = None
        self.round_steps = cfg.inner_steps  # inner steps a round, once decided: max(H, tau) over torch.distributed

    @property
    def decided(self) -> bool:
        return self.decision is not None

    def known_before_round_one(self, step_s: float) -> bool:
        """At the first outer sync: is the averaging's cost known enough to decide before the first round? (a probe
        at set-up; over hivemind, the matchmaking time if it alone calls for overlap, then tau = H)"""
        cfg = self.cfg
        if self.comm_s is not None:
            return True
        if cfg.backend == "hivemind" and cfg.hivemind.matchmaking_time > cfg.overlap_auto_share * cfg.inner_steps * step_s:
            self.comm_s, self.floor = cfg.hivemind.matchmaking_time, cfg.inner_steps
            return True
        return False

    def decide(self, step_s: float, agree: Callable[[int], int] | None = None) -> int:
        """tau from the cost known and the mean inner step ``step_s``; ``agree`` (torch.distributed): the group's
        largest, so every worker takes the same, and the same ``round_steps``."""
        cfg = self.cfg
        comm_s = self.comm_s or 0.0
        stretch = cfg.backend == "torch"
        mine = choose_tau(comm_s, step_s, cfg.inner_steps, cfg.overlap_auto_share, self.floor, stretch)
        tau = agree(mine) if agree is not None else mine
        self.round_steps = max(cfg.inner_steps, tau) if stretch else cfg.inner_steps
        self.decision = {"overlap_steps": tau, "own_choice": mine, "round_steps": self.round_steps,
                         "comm_s": round(comm_s, 4),
                         "inner_step_s": round(step_s, 5), "share": round(comm_s / max(1e-9, cfg.inner_steps * step_s), 4)}
        return tau
