"""``PrefetchingSource``: a policy source that downloads the next version in the background while its holder
samples with a version it already has.

A swarm node is told a new policy version in every heartbeat reply once the trainer commits it. Over a slow link
the download of that version takes longer than the trainer's step (``benchmarks/wan/RESULTS.md``: 3.3 s for the
main job's 4.34 MB on 20 Mbit/s + 150 ms against a 0.6 s step), and a node that waits for it before sampling
leaves the trainer idle. The async window allows better: a row sampled by version ``v`` may train steps
``v .. v + async_level``. So the node starts the download as soon as a version is announced (``prefetch``) and,
answering an assignment, samples with the newest version it *holds* that the window lets serve the assignment's
step (``newest_held``) when the assigned one has not arrived within a short grace.

One download runs at a time (in one daemon thread: a process exit never waits for it), always of the newest
version asked for; versions asked for meanwhile are skipped, not queued. ``held`` counts only versions whose
download finished (the inner source writes a version's weights under their final name only once verified) and
only the newest ``keep`` of them that the inner source still has on disk (``local``: it evicts older ones), plus
version 0, the base every holder starts from.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from swarmrl.policy.sources import PolicySource, PolicyUnavailable

log = logging.getLogger("swarmrl.policy.prefetch")

MAX_REPORTS = 64


class PrefetchingSource:
    def __init__(self, inner: PolicySource, keep: int = 3, timeout_s: float = 120.0) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, not {keep}")
        self.inner = inner
        self.keep = keep
        self.timeout_s = timeout_s
        self._cv = threading.Condition()
        self._held: list[int] = []  # downloaded versions, oldest first (at most keep)
        self._flight: int | None = None  # the version being downloaded in the background
        self._wanted: int | None = None  # the newest version asked for while one was in flight
        self._reports: list[dict] = []  # the newest MAX_REPORTS downloads' figures not handed out yet
        self._fetching = threading.Lock()  # one download at a time, foreground or background

    # ---- what is held --------------------------------------------------------------------------
    def held(self) -> list[int]:
        """Versions that load without a download: 0 and the newest ``keep`` downloaded still on disk, ascending."""
        with self._cv:
            mine = list(self._held)
        return sorted({0, *(v for v in mine if self.inner.local(v) is not None)})

    def has(self, version: int) -> bool:
        return version == 0 or version in self.held()

    def newest_held(self, upto: int, serves: Callable[[int], bool]) -> int | None:
        """The newest held version ``<= upto`` for which ``serves(version)`` holds, or None."""
        ok = [v for v in self.held() if v <= upto and serves(v)]
        return ok[-1] if ok else None

    def in_flight(self) -> int | None:
        with self._cv:
            return self._flight

    def wait_for(self, version: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` while ``version`` downloads in the background; True once it is held."""
        with self._cv:
            self._cv.wait_for(lambda: version in self._held or self._flight != version, timeout=timeout_s)
            return version in self._held

    # ---- downloads -----------------------------------------------------------------------------
    def prefetch(self, version: int) -> None:
        """Start downloading ``version`` in the background unless it is held, in flight or older than what is."""
        with self._cv:
            if version <= 0 or version in self._held or (self._held and version < self._held[-1]):
                return
            if self._flight is not None:
                if version > self._flight:
                    self._wanted = max(version, self._wanted or 0)
                return
            self._flight = version
        threading.Thread(target=self._background, args=(version,), name=f"prefetch-v{version}", daemon=True).start()

    def _background(self, version: int) -> None:
        while True:
            try:
                self._download(version, self.timeout_s)
            except PolicyUnavailable as e:  # the foreground tries again when it needs the version
                log.info("prefetch of policy v%d failed: %s", version, e)
            except Exception as e:  # noqa: BLE001 - a background thread must not die silently
                log.warning("prefetch of policy v%d failed: %r", version, e)
            with self._cv:
                nxt, self._wanted = self._wanted, None
                if nxt is None or nxt <= version or nxt in self._held:
                    self._flight = None
                    self._cv.notify_all()
                    return
                self._flight = version = nxt
                self._cv.notify_all()

    def _download(self, version: int, timeout_s: float) -> Path:
        with self._fetching:
            path = self.inner.fetch(version, timeout_s)
            report = self.inner.take_fetch_report()
        with self._cv:
            if report is not None:
                self._reports.append(report)
                del self._reports[:-MAX_REPORTS]
            if version not in self._held:
                self._held.append(version)
                self._held.sort()
                del self._held[:-self.keep]
            self._cv.notify_all()
        return path

    # ---- PolicySource ----------------------------------------------------------------------------
    def latest(self) -> int | None:
        return self.inner.latest()

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        """Version ``version``'s directory: at once when held, after the background download when it is in
        flight, else downloaded now."""
        if self.in_flight() == version:
            self.wait_for(version, timeout_s)
        if self.has(version):  # on disk: no download, so no waiting behind one of another version
            return self.inner.fetch(version, timeout_s)
        return self._download(version, timeout_s)

    def local(self, version: int) -> Path | None:
        return self.inner.local(version)

    def take_fetch_report(self) -> dict | None:
        """The oldest download's figures not handed out yet (background ones included), or None."""
        with self._cv:
            return self._reports.pop(0) if self._reports else None


__all__ = ["PrefetchingSource"]
