"""Change counters that the validator and the trainer's adapter long-poll instead of polling their lists.

``uploads`` moves when a submission is uploaded (new work for validators), ``verdicts`` when one is accepted,
rejected or challenged (new work for the trainer). ``GET /v1/changes?kind=K&since=G&wait=S`` answers at once
when the counter is no longer ``G``, else when it moves or after ``S`` seconds: a client that read ``G`` before
listing its work cannot miss an event that came after that read."""

from __future__ import annotations

import threading
from typing import Literal

ChangeKind = Literal["uploads", "verdicts"]


class Changes:
    def __init__(self, max_waiters: int = 32) -> None:
        self._gen = {"uploads": 0, "verdicts": 0}
        self._cond = threading.Condition()
        self._waiters = 0
        self.max_waiters = max_waiters  # threads a long poll may hold at once; more answer at once

    def generation(self, kind: ChangeKind) -> int:
        return self._gen[kind]

    def bump(self, kind: ChangeKind) -> None:
        with self._cond:
            self._gen[kind] += 1
            self._cond.notify_all()

    def wait(self, kind: ChangeKind, since: int, timeout: float) -> int:
        """The counter, once it differs from ``since`` or after ``timeout`` seconds (at once when too many wait)."""
        with self._cond:
            if self._gen[kind] != since or timeout <= 0 or self._waiters >= self.max_waiters:
                return self._gen[kind]
            self._waiters += 1
            try:
                self._cond.wait_for(lambda: self._gen[kind] != since, timeout)
            finally:
                self._waiters -= 1
            return self._gen[kind]
