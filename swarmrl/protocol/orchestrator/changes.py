"""Change counters behind the long polls of validators (``GET /v1/validator/pending?wait=S``) and the trainer's
adapter (``GET /v1/trainer/accepted?since=G&wait=S``), instead of them listing their work every fraction of a second.

``uploads`` moves when a submission is uploaded (new work for validators), ``verdicts`` when one is accepted,
rejected or challenged (new work for the trainer). A wait answers at once when the counter is no longer the one
read, else when it moves or after its timeout: a counter read before listing means no event after the listing is
missed."""

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
