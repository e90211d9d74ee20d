"""Where the trainer's rollouts come from: a ``RolloutSource``.

The trainer asks its source for the rollout files of the step it gathers (``poll``: each file once, parsed and
validated), tells it how many announced groups turned out unusable (``report_shortfall``, so workers make
more), and asks whether the run was ended from outside (``is_done``). Which files are usable, and which groups
of them, is the trainer's business (``contract.GroupRule``), not the source's.

``RunDirRolloutSource``: files under ``run_dir/rollouts/step_N/``, written there by trusted local workers
(``rl.worker``) or, in swarm mode, by the adapter with the submissions the validator accepted
(``swarm.adapter``); files of the next steps are parsed ahead in a background thread (``ReadAhead``).

``NoRollouts``: the source of the trainer's ranks other than 0, which read no rollouts (rank 0 collects each
step's batch and broadcasts it: ``training.parallel``); it hands out nothing and says the run is over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from swarmrl.contract import AsyncWindow, Rollout
from swarmrl.rl.readahead import ReadAhead
from swarmrl.rollouts.wire import RolloutError, read_rollouts
from swarmrl.rundir.writer import RunDir, announced_groups

Rejected = Callable[[str, str], None]  # (file name, reason)


class RolloutSource(Protocol):
    def start(self, step: int) -> None:
        """The trainer starts (or resumes) at ``step``."""

    def poll(self, step: int) -> list[tuple[str, list[Rollout]]]:
        """Files of ``step`` not handed out before, each as (name, rows); a file that fails validation is
        reported to the source's ``on_reject`` and never handed out."""

    def announced(self, step: int) -> tuple[int, bool]:
        """Usable groups the files of ``step`` announce, and whether every one of those files was handed out
        (or rejected) already."""

    def report_shortfall(self, step: int, missing: int) -> None:
        """``missing`` announced groups of ``step`` were not usable: the producers should make more."""

    def is_done(self) -> bool:
        """The run was ended from outside: stop waiting for rollouts."""

    def stop(self) -> None: ...


class RunDirRolloutSource:
    def __init__(self, run: RunDir, window: AsyncWindow, *, read_ahead: bool = True, poll_s: float = 0.02,
                 on_reject: Rejected | None = None) -> None:
        self.run = run
        self.readahead = ReadAhead(run, window, poll_s) if read_ahead else None
        self.on_reject = on_reject or (lambda name, why: None)
        self._seen: dict[int, set[str]] = {}  # step -> files handed out or rejected

    def start(self, step: int) -> None:
        if self.readahead is not None:
            self.readahead.start(step)

    def poll(self, step: int) -> list[tuple[str, list[Rollout]]]:
        if self.readahead is not None:
            self.readahead.at_step(step)
        for s in [s for s in self._seen if s < step]:
            del self._seen[s]
        seen = self._seen.setdefault(step, set())
        out = []
        for f in self.run.rollout_files(step):
            if f.name in seen:
                continue
            seen.add(f.name)
            got = self.readahead.take(step, f) if self.readahead is not None else None
            try:
                if isinstance(got, RolloutError):
                    raise got
                out.append((f.name, got if got is not None else read_rollouts(f)))
            except RolloutError as e:
                self.on_reject(f.name, str(e))
        return out

    def announced(self, step: int) -> tuple[int, bool]:
        files = self.run.rollout_files(step)
        seen = self._seen.get(step, set())
        return sum(announced_groups(f) for f in files), all(f.name in seen for f in files)

    def report_shortfall(self, step: int, missing: int) -> None:
        if self.run.deficit(step) != missing:
            self.run.set_deficit(step, missing)

    def is_done(self) -> bool:
        return self.run.is_done()

    def stop(self) -> None:
        if self.readahead is not None:
            self.readahead.stop()


class NoRollouts:
    """A source with nothing in it: the ranks other than 0 get their batch by broadcast."""

    def start(self, step: int) -> None:
        pass

    def poll(self, step: int) -> list[tuple[str, list[Rollout]]]:
        return []

    def announced(self, step: int) -> tuple[int, bool]:
        return 0, True

    def report_shortfall(self, step: int, missing: int) -> None:
        pass

    def is_done(self) -> bool:
        return True  # nothing will ever come: a trainer asking this source waits for nothing

    def stop(self) -> None:
        pass
