"""Read-ahead of rollout files for the trainer: files of the steps after the one being trained are parsed and
validated (``read_rollouts``) by a background thread while the trainer trains, so that gathering the next step
finds them parsed instead of reading them on its critical path.

Only steps after the trainer's current one are read ahead (the current step's files the trainer reads itself,
while it waits for them anyway), up to the window's open steps (``AsyncWindow.open_steps``: no other step can have
files yet).
A result is handed out once (``take``) and results of steps the trainer has passed are dropped, so memory holds
at most the files of the window. A file that fails to parse is handed out as its ``RolloutError``, exactly what
reading it inline would have raised. The thread is a daemon: a trainer that exits or crashes loses nothing but
parsing work.
"""

from __future__ import annotations

import threading
from pathlib import Path

from swarmrl.contract import AsyncWindow, Rollout
from swarmrl.rollouts.wire import RolloutError, read_rollouts
from swarmrl.rundir.writer import RunDir

Parsed = list[Rollout] | RolloutError


class ReadAhead:
    def __init__(self, run: RunDir, window: AsyncWindow, poll_s: float = 0.02) -> None:
        self.run = run
        self.window = window
        self.poll_s = poll_s
        self._step = 0  # the trainer's current step: files of the window's open steps after it are read ahead
        self._done: dict[int, dict[str, Parsed]] = {}  # step -> file name -> result
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, step: int) -> ReadAhead:
        self._step = step
        if self.window.k > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rollout-readahead", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def at_step(self, step: int) -> None:
        """The trainer moved to ``step``: forget what was read for the steps before it."""
        with self._lock:
            self._step = step
            for s in [s for s in self._done if s < step]:
                del self._done[s]

    def take(self, step: int, path: Path) -> Parsed | None:
        """What reading ``path`` (a file of ``step``) gave, if it was read ahead (once), else None."""
        with self._lock:
            return self._done.get(step, {}).pop(path.name, None)

    def _loop(self) -> None:
        while not self._stop.is_set():
            read = 0
            with self._lock:
                current = self._step
            for s in self.window.open_steps(current)[1:]:
                for f in self.run.rollout_files(s):
                    with self._lock:
                        if s < self._step + 1 or f.name in self._done.get(s, {}):
                            continue
                    try:
                        got: Parsed = read_rollouts(f)
                    except RolloutError as e:
                        got = e
                    except OSError:  # gone meanwhile (a pruned step): the trainer never asks for it
                        continue
                    with self._lock:
                        if s >= self._step + 1:  # not passed while it was read
                            self._done.setdefault(s, {})[f.name] = got
                    read += 1
                    if self._stop.is_set():
                        return
            if not read:
                self._stop.wait(self.poll_s)
