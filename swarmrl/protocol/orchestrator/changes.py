"""Change counters behind the long polls of validators (``GET /v1/validator/pending?wait=S``), the trainer's
adapter (``GET /v1/trainer/accepted?since=G&wait=S``) and idle nodes (``POST /v1/nodes/heartbeat?wait=S``),
instead of them asking every fraction of a second.

``uploads`` moves when a submission is uploaded (new work for validators), ``verdicts`` when one is accepted,
rejected or challenged (new work for the trainer), ``work`` when work may have opened for a node that had none
(the trainer moved to a new step or policy, weight servers were announced, a submission was rejected, an assignment
was released or put back up). A wait answers at once when the counter is no longer the one read, else when it
moves or after its timeout: a counter read before looking means no event after the look is missed. Each kind has
its own cap on waiting threads (more answer at once), so idle nodes never take the validators' places."""

from __future__ import annotations

import threading
from typing import Literal

ChangeKind = Literal["uploads", "verdicts", "work"]

MAX_WAITERS = {"uploads": 32, "verdicts": 32, "work": 16}  # server threads a long poll of each kind may hold


class Changes:
    def __init__(self, max_waiters: dict[str, int] | None = None) -> None:
        self._gen = {k: 0 for k in MAX_WAITERS}
        self._cond = threading.Condition()
        self._waiters = {k: 0 for k in MAX_WAITERS}
        self.max_waiters = {**MAX_WAITERS, **(max_waiters or {})}  # per kind; more answer at once
        self.closed = False

    def generation(self, kind: ChangeKind) -> int:
        return self._gen[kind]

    def bump(self, kind: ChangeKind) -> None:
        with self._cond:
            self._gen[kind] += 1
            self._cond.notify_all()

    def close(self) -> None:
        """The server is stopping: every held wait answers now, and later ones at once (its shutdown waits for
        the requests in flight, and a held long poll would keep it up for the rest of its timeout)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def wait(self, kind: ChangeKind, since: int, timeout: float) -> int:
        """The counter, once it differs from ``since`` or after ``timeout`` seconds (at once when too many wait)."""
        return self.wait_waited(kind, since, timeout)[0]

    def wait_waited(self, kind: ChangeKind, since: int, timeout: float) -> tuple[int, bool]:
        """``wait``, and whether it held the caller (False: answered at once, the counter had moved or the kind's
        waiting places were all taken)."""
        with self._cond:
            if (self.closed or self._gen[kind] != since or timeout <= 0
                    or self._waiters[kind] >= self.max_waiters[kind]):
                return self._gen[kind], False
            self._waiters[kind] += 1
            try:
                self._cond.wait_for(lambda: self._gen[kind] != since or self.closed, timeout)
            finally:
                self._waiters[kind] -= 1
            return self._gen[kind], True
