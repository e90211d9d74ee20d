"""The aggregator's round state machine (no HTTP: ``aggregator`` serves it).

State: the members (joined nodes, each checked against the orchestrator once), the ejected, the open round with
its anchor digest and its uploads (at most one per member), the outer optimiser (``OuterNesterov`` over the
anchor), the published results of recent rounds, the judge's history (count sketches).

A round closes once ``cfg.workers`` members have joined and every joined, non-ejected one uploaded, or
``round_timeout_s`` after it opened if at least one did (a member missing a round is not punished). Closing (``close``, run off the event loop): the uploads are
taken out under the lock and the round marked closed (an upload for it is now refused with 409), the judge scores
them on a batch of the training data drawn with a seed drawn now at random (revealed in the result), the
accepted are averaged (``aggregate = "mean"``: all of them, nobody judged), the mean is quantized to int8 and
dequantized again, and that vector is the outer step's pseudo-gradient here and on every worker (the same bytes,
the same ``wire.dequantize``, the same ``OuterNesterov.step``: the same ``anchor_digest_after``). No accepted
upload: a zero update (the momentum still moves every party's anchor alike). The judgements go to the
orchestrator (``Reporter``: in order, retried until they land; the orchestrator's endpoint is idempotent).
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swarmrl.diloco.config import DilocoConfig
from swarmrl.diloco.outer import OuterNesterov
from swarmrl.diloco.trust import judge as J
from swarmrl.diloco.trust import wire

log = logging.getLogger("swarmrl.diloco.trust")

KEEP_RESULTS = 64  # published results kept for late readers


class Refused(Exception):
    """A request refused with an HTTP status (the server answers ``{"detail"}``)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


@dataclass
class RoundLog:
    round: int
    accepted: list[str]
    rejected: list[dict]
    stats: list[dict]
    digest_before: str
    digest_after: str
    score_seed: int
    closed_after_s: float


@dataclass
class _Open:
    round: int
    digest: str
    opened: float
    uploads: dict[str, wire.Upload] = field(default_factory=dict)
    closing: bool = False


class Rounds:
    """The state machine. ``loss_for(seed, round) -> loss_at`` builds the scoring function (None: no loss
    statistic); ``report(round, accepted, rejected)`` sends the judgements (called from the reporter thread)."""

    def __init__(self, cfg: DilocoConfig, run_id: str, anchor: torch.Tensor,
                 loss_for: Callable[[int, int], Callable[[torch.Tensor], float]] | None,
                 report: Callable[[int, list[str], list[dict]], None] | None = None,
                 log_path: Path | None = None) -> None:
        t = cfg.trust
        self.cfg, self.trust, self.run_id = cfg, t, run_id
        self.numel, self.chunk = anchor.numel(), cfg.int8_chunk
        self.max_upload_bytes = wire.max_upload_bytes(self.numel, self.chunk)
        self.rules = J.Rules.of(t)
        self.outer = OuterNesterov(anchor, lr=cfg.outer_lr, momentum=cfg.outer_momentum)
        self.sketch = J.CountSketch(self.numel, seed=secrets.randbits(31))
        self.history = J.History(t.history_rounds)
        self.loss_for = loss_for
        self.lock = threading.Lock()
        self.members: dict[str, str] = {}  # node id -> public key
        self.ejected: dict[str, str] = {}  # node id -> reason
        self.open = _Open(0, wire.anchor_digest(self.outer.anchor), time.monotonic())
        self.results: dict[int, bytes] = {}
        self.logs: list[RoundLog] = []
        self.reporter = Reporter(report) if report is not None else None
        self.log_path = log_path

    # ---- views
    def describe(self) -> dict:
        with self.lock:
            o = self.open
            return {"run_id": self.run_id, "numel": self.numel, "int8_chunk": self.chunk,
                    "inner_steps": self.cfg.inner_steps, "outer_lr": self.cfg.outer_lr,
                    "outer_momentum": self.cfg.outer_momentum, "round": o.round, "anchor_digest": o.digest,
                    "max_upload_bytes": self.max_upload_bytes, "aggregate": self.trust.aggregate,
                    "members": sorted(self.members), "ejected": sorted(self.ejected),
                    "pending": sorted(o.uploads), "outer_steps": self.outer.steps,
                    "reported_rounds": self.reporter.done if self.reporter else -1}

    def state(self) -> bytes:
        with self.lock:
            s = wire.State(self.open.round, self.outer.steps, self.open.digest, self.outer.anchor.clone(),
                           None if self.outer.buf is None else self.outer.buf.clone())
        return wire.encode_state(s)

    def result(self, round_no: int) -> bytes | None:
        with self.lock:
            if round_no not in self.results and round_no < self.open.round:
                raise Refused(404, f"round {round_no}'s result is no longer kept")
            return self.results.get(round_no)

    # ---- members
    def is_member(self, node_id: str) -> bool:
        with self.lock:
            return node_id in self.members and node_id not in self.ejected

    def add_member(self, node_id: str, public_key: str) -> int:
        with self.lock:
            if node_id in self.ejected:
                raise Refused(403, f"node {node_id} was ejected: {self.ejected[node_id]}")
            self.members[node_id] = public_key
            return self.open.round

    def check_member(self, node_id: str) -> None:
        with self.lock:
            if node_id in self.ejected:
                raise Refused(403, f"node {node_id} was ejected: {self.ejected[node_id]}")
            if node_id not in self.members:
                raise Refused(403, f"node {node_id} has not joined (POST /v1/diloco/join)")

    # ---- uploads
    def admissible(self, node_id: str, round_no: int) -> str:
        """Before the body is read: the round is open and this member has not uploaded to it; returns the
        round's anchor digest (409 otherwise)."""
        with self.lock:
            o = self.open
            if round_no < o.round or (round_no == o.round and o.closing):
                raise Refused(409, f"round {round_no} is closed (the open round is {o.round}"
                                   f"{', closing' if o.closing else ''})")
            if round_no > o.round:
                raise Refused(409, f"round {round_no} is not open yet (the open round is {o.round})")
            if node_id in o.uploads:
                raise Refused(409, f"node {node_id} already uploaded to round {round_no}")
            return o.digest

    def take(self, node_id: str, up: wire.Upload) -> bool:
        """Store a validated upload of the open round; True when the round is now complete (close it)."""
        with self.lock:
            o = self.open
            if up.round != o.round or o.closing or up.meta.anchor_digest != o.digest:
                raise Refused(409, f"round {up.round} closed while the upload was checked")
            if node_id in o.uploads:
                raise Refused(409, f"node {node_id} already uploaded to round {o.round}")
            if node_id in self.ejected or node_id not in self.members:
                raise Refused(403, f"node {node_id} is not an active member")
            o.uploads[node_id] = up
            return self._complete()

    def _complete(self) -> bool:
        """The run's ``cfg.workers`` members have joined (ever: the ejected count) and every active one uploaded
        (a late joiner is waited for; ``due`` closes the round after ``round_timeout_s`` anyway)."""
        active = set(self.members) - set(self.ejected)
        return len(self.members) >= self.cfg.workers and bool(active) and active <= set(self.open.uploads)

    def due(self) -> bool:
        """Whether the open round should close now (every active member uploaded, or its time is up)."""
        with self.lock:
            o = self.open
            if o.closing or not o.uploads:
                return False
            return self._complete() or time.monotonic() - o.opened >= self.trust.round_timeout_s

    # ---- closing
    def close(self) -> RoundLog | None:
        """Judge, publish and step the open round (None if it was closed already or has no uploads)."""
        with self.lock:
            o = self.open
            if o.closing or not o.uploads:
                return None
            o.closing = True
            ids = sorted(o.uploads)
            vectors = [o.uploads[i].vector for i in ids]
            anchor = self.outer.anchor.clone()
        seed = secrets.randbits(31)
        verdicts, stats = self._judge(ids, vectors, anchor, o.round, seed)
        accepted = [v.node_id for v in verdicts if v.accepted]
        rejected = [{"node_id": v.node_id, "reason": v.reason} for v in verdicts if not v.accepted]
        mean = J.aggregate([vec for i, vec in zip(ids, vectors) if i in accepted],
                           clip=self.rules.clip and self.trust.aggregate == "judged")
        codes, scales = wire.quantize(mean if mean is not None else torch.zeros(self.numel), self.chunk)
        update = wire.dequantize(codes, scales, self.chunk)
        for i, vec in zip(ids, vectors):
            self.history.add(o.round, "contribution", i, self.sketch(vec))
        self.history.add(o.round, "update", "", self.sketch(update))
        with self.lock:
            self.outer.step(update)
            after = wire.anchor_digest(self.outer.anchor)
            res = wire.Result(o.round, o.digest, after, accepted, rejected, seed, codes, scales)
            self.results[o.round] = wire.encode_result(res)
            for old in [r for r in self.results if r <= o.round - KEEP_RESULTS]:
                del self.results[old]
            for r in rejected:
                self.ejected[r["node_id"]] = r["reason"]
            self.open = _Open(o.round + 1, after, time.monotonic())
        rl = RoundLog(o.round, accepted, rejected, stats, o.digest, after, seed,
                      round(time.monotonic() - o.opened, 3))
        self.logs.append(rl)
        self._write_log(rl)
        if self.reporter is not None and (accepted or rejected):
            self.reporter.put(o.round, accepted, rejected)
        log.info("round %d closed: %d accepted, %d rejected %s; anchor %s", o.round, len(accepted), len(rejected),
                 [r["node_id"][:8] + ": " + r["reason"] for r in rejected], after)
        return rl

    def _judge(self, ids: list[str], vectors: list[torch.Tensor], anchor: torch.Tensor, round_no: int,
               seed: int) -> tuple[list[J.Verdict], list[dict]]:
        if self.trust.aggregate == "mean":
            return [J.Verdict(i, True) for i in ids], []
        loss_at = self.loss_for(seed, round_no) if self.loss_for is not None else None
        try:
            stats = J.contribution_stats(ids, vectors, loss_at, anchor, self.sketch, self.history, round_no)
        except Exception:  # the scoring model failed: judge by geometry alone rather than never close the round
            log.exception("round %d: scoring failed; judged without the loss statistic", round_no)
            stats = J.contribution_stats(ids, vectors, None, anchor, self.sketch, self.history, round_no)
        return J.judge(stats, self.rules), [s.__dict__ for s in stats]

    def close_logged(self) -> RoundLog | None:
        """``close`` for a background thread: a failure is logged, not lost."""
        try:
            return self.close()
        except Exception:
            log.exception("closing round %d failed", self.open.round)
            raise

    def _write_log(self, rl: RoundLog) -> None:
        if self.log_path is None:
            return
        with open(self.log_path, "a") as f:
            f.write(json.dumps(rl.__dict__) + "\n")

    def stop(self) -> None:
        if self.reporter is not None:
            self.reporter.stop()


class Reporter:
    """Sends the rounds' judgements in order from a thread of its own, retrying each until it lands (the
    orchestrator's endpoint is idempotent per node and round). ``done``: the last round reported."""

    def __init__(self, send: Callable[[int, list[str], list[dict]], None], retry_s: float = 1.0) -> None:
        self.send, self.retry_s = send, retry_s
        self.q: queue.Queue = queue.Queue()
        self.done = -1
        self.errors = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="diloco-reporter", daemon=True)
        self.thread.start()

    def put(self, round_no: int, accepted: list[str], rejected: list[dict]) -> None:
        self.q.put((round_no, accepted, rejected))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self.q.get(timeout=0.2)
            except queue.Empty:
                continue
            delay = self.retry_s
            while not self._stop.is_set():
                try:
                    self.send(*item)
                    self.done = item[0]
                    break
                except Exception as e:  # the orchestrator is down or refused: retried, it is idempotent
                    self.errors += 1
                    log.warning("reporting round %d failed (%s); retrying in %.0fs", item[0], e, delay)
                    self._stop.wait(delay)
                    delay = min(delay * 2, 30.0)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
