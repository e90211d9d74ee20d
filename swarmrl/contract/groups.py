"""Groups: ``group_size`` completions of one task. A group whose rewards all tie has zero advantage everywhere
(under every loss's advantage rule; the trainer computes advantages: ``swarmrl.rl.losses.advantages``) and
carries no gradient signal; with ``filter_ties`` it is dropped online and the trainer backfills the step with
more groups. ``GroupRule`` is the one definition of a usable group, shared by the worker (what it
announces), the orchestrator (how much work a step still needs), the adapter (what a file holds) and the
trainer (what it trains on)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from swarmrl.contract.window import AsyncWindow

TIE_TOLERANCE = 1e-9


def is_informative(rewards: Sequence[float], tol: float = TIE_TOLERANCE) -> bool:
    """A group whose rewards all tie has zero advantages everywhere: no gradient signal."""
    return len(rewards) > 1 and (max(rewards) - min(rewards)) > tol


class _Row(Protocol):
    worker_id: str
    group_id: str
    step: int
    policy_version: int
    reward: float


@dataclass(frozen=True)
class GroupRule:
    group_size: int
    filter_ties: bool = True

    def usable(self, rewards: Sequence[float]) -> bool:
        """Complete, and informative unless tied groups are kept."""
        return len(rewards) == self.group_size and (not self.filter_ties or is_informative(rewards))

    @staticmethod
    def group(rows: Iterable[_Row]) -> OrderedDict[str, list]:
        """Rows by group (a group id is unique per worker), in the order groups first appear."""
        groups: OrderedDict[str, list] = OrderedDict()
        for r in rows:
            groups.setdefault(f"{r.worker_id}/{r.group_id}", []).append(r)
        return groups

    def count_usable(self, rows: Iterable[_Row]) -> int:
        """Usable groups among ``rows`` (what a worker announces and the orchestrator counts)."""
        return sum(1 for g in self.group(rows).values() if self.usable([r.reward for r in g]))

    def select(self, rows_by_file: list[tuple[str, list]], step: int, window: AsyncWindow,
               carried: Sequence[list] = ()) -> tuple[list[list], dict]:
        """The trainer's choice for ``step``: rows of that step from versions inside the window, grouped;
        the usable groups in the files' order, and counts of what was dropped and why.

        ``carried``: usable groups an earlier step had beyond its need (``carry_surplus``). Those whose policy
        version the window still serves at ``step`` come first (they are the ones that go stale soonest); the
        others are dropped (``stale_carried``)."""
        fresh = [g for g in carried if all(window.serves(r.policy_version, step) for r in g)]
        stale = wrong_step = 0
        kept = []
        for _name, rows in rows_by_file:
            for r in rows:
                if r.step != step:
                    wrong_step += 1
                elif not window.serves(r.policy_version, step):
                    stale += 1
                else:
                    kept.append(r)
        groups = self.group(kept)
        complete = [g for g in groups.values() if len(g) == self.group_size]
        usable = [g for g in complete if self.usable([r.reward for r in g])]
        tied = sum(1 for g in complete if not is_informative([r.reward for r in g]))
        stats = {"stale_rows": stale, "wrong_step_rows": wrong_step, "incomplete_groups": len(groups) - len(complete),
                 "tied_groups": tied, "usable_groups": len(usable) + len(fresh), "carried_groups": len(fresh),
                 "stale_carried": len(carried) - len(fresh)}
        return list(fresh) + usable, stats
