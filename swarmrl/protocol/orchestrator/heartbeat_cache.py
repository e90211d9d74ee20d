"""What the heartbeat hot path keeps in memory: the nonces seen (``NonceCache``), the per-node mirror of what a
heartbeat would answer (``Mirror``), and the group-commit writer that persists heartbeats in batches
(``BeatWriter``). ``hot_path.HotPath`` answers from them; the other services only drop what a commit changed.

Nothing here is the source of truth: the database is. The mirror lets a steady-state heartbeat (a node whose
work at the current step is already assigned, nothing orphaned waiting for a taker) be answered without a
database read; its writes (the nonce, ``last_heartbeat``) are committed in one transaction per batch *before*
the reply goes out, so a crash loses nothing a reply promised. Every other state change drops the mirror of the
nodes it touched (``Mirror.after_commit``, called by ``Database.tx`` with the transaction's ``info``); the next
heartbeat of such a node takes the full path, which rebuilds the mirror under a generation check (a change
committed meanwhile wins).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("swarmrl.protocol.orchestrator")  # one logger for the whole orchestrator


class NonceCache:
    """Nonces seen by this process (every signed endpoint), until they expire: a replay is refused without a
    database round trip. Bounded: ``add`` answers None when full (the caller sheds load instead of forgetting)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, public_key: str, nonce: str, expires_at: float) -> bool | None:
        """True if new (now recorded), False if seen before, None if the cache is full."""
        k = public_key + nonce
        with self._lock:
            if k in self._seen:
                return False
            if len(self._seen) >= self.max_entries:
                return None
            self._seen[k] = expires_at
            return True

    def load(self, rows: Iterable[tuple[str, str, float]]) -> int:
        n = 0
        with self._lock:
            for pk, nonce, exp in rows:
                self._seen[pk + nonce] = exp
                n += 1
        return n

    def purge(self, now: float) -> int:
        with self._lock:
            old = [k for k, exp in self._seen.items() if exp < now]
            for k in old:
                del self._seen[k]
        return len(old)


@dataclass
class HotNode:
    """What a heartbeat of this node answers at ``step``, as the full path last computed it."""

    public_key: str
    last_heartbeat: float
    step: int
    specs: list | None  # AssignmentSpec of the node's open work in the window (None: not derived yet from rows)
    rows: list = field(default_factory=list)  # the open Assignment rows, until specs is derived
    reply_key: tuple | None = None  # (step, policy_version, weights) the cached reply was built for
    reply: bytes = b""


@dataclass
class Mirror:
    """node id -> HotNode, with generations so a rebuild racing a change never installs stale state."""

    nodes: dict[str, HotNode] = field(default_factory=dict)
    _gens: dict[str, int] = field(default_factory=dict)
    _epoch: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def generation(self, node_id: str) -> tuple[int, int]:
        """Read before the full path reads the database; ``install`` succeeds only if unchanged."""
        with self._lock:
            return self._epoch, self._gens.get(node_id, 0)

    def install(self, node_id: str, gen: tuple[int, int], hot: HotNode) -> bool:
        with self._lock:
            if (self._epoch, self._gens.get(node_id, 0)) != gen:
                return False
            self.nodes[node_id] = hot
            return True

    def dirty(self, node_ids: Iterable[str]) -> None:
        """After a commit that changed these nodes' rows or assignments."""
        with self._lock:
            for nid in node_ids:
                self._gens[nid] = self._gens.get(nid, 0) + 1
                self.nodes.pop(nid, None)

    def dirty_all(self) -> None:
        with self._lock:
            self._epoch += 1
            self.nodes.clear()

    def after_commit(self, info: dict) -> None:
        """A transaction that changed nodes or assignments committed (``Database.after_commit``): drop what the
        mirror knew of the nodes it names in ``info["dirty"]`` (all of them with ``info["dirty_all"]``)."""
        if info.get("dirty_all"):
            self.dirty_all()
        elif info.get("dirty"):
            self.dirty(info["dirty"])

    def touch(self, node_id: str, now: float) -> None:
        hot = self.nodes.get(node_id)
        if hot is not None and hot.last_heartbeat < now:
            hot.last_heartbeat = now


@dataclass
class Beat:
    """One heartbeat's writes: its nonce row and its liveness time."""

    node_id: str
    public_key: str
    nonce: str
    expires_at: float
    now: float
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class Overloaded(Exception):
    pass


class BeatWriter:
    """Group commit: heartbeats queue their writes; one thread commits everything queued in one transaction and
    then completes their futures (the HTTP layer replies only then). Under load a batch grows instead of the
    queue of transactions, so throughput rises with load while each write stays durable before its reply."""

    def __init__(self, write: Callable[[list[Beat]], list[bool]], max_queue: int, name: str = "beat-writer") -> None:
        self._write = write  # commits a batch; returns per beat: True written, False refused (replayed nonce)
        self.max_queue = max_queue
        self._queue: list[Beat] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._name = name
        self.batches = 0
        self.written = 0

    def submit(self, beat: Beat) -> concurrent.futures.Future:
        with self._cond:
            if self._closed:
                raise Overloaded("orchestrator is shutting down")
            if len(self._queue) >= self.max_queue:
                raise Overloaded(f"{len(self._queue)} heartbeats waiting to be written")
            self._queue.append(beat)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return beat.future

    def queued(self) -> int:
        return len(self._queue)

    def close(self, timeout: float = 10.0) -> None:
        """Commit what is queued and stop the thread (a later ``submit`` starts a new one)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            t = self._thread
        if t is not None:
            t.join(timeout)
        with self._cond:
            self._closed, self._thread = False, None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                batch, self._queue = self._queue, []
            try:
                ok = self._write(batch)
            except Exception as e:  # a database failure: every beat of the batch is answered 503, none punished
                log.exception("writing %d heartbeats failed", len(batch))
                for b in batch:
                    b.future.set_exception(e)
                continue
            self.batches += 1
            self.written += sum(ok)
            for b, good in zip(batch, ok, strict=True):
                b.future.set_result(good)
