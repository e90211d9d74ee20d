"""Swarm-scale simulation of the control plane: the REAL orchestrator service, simulated nodes, a simulated clock.

One ``Orchestrator`` (``swarmrl.protocol.orchestrator.service``) runs in this process, with no HTTP, on SQLite
under a temp dir (or ``--database-url``). Every call the swarm would make goes to it with ``now=`` set to the
simulated clock; nothing else is simulated on the service side:

* stake: a stake authority ``deposit``s for each node, the node ``register``s locking it (``Membership``; beyond
  ``--register-real`` nodes the same rows, a deposit, a node and a stake ledger row, are bulk-inserted, and
  said so in the results: registering 100k nodes one transaction at a time would take the whole time budget);
* heartbeats: signed (Ed25519, nonce; ``HotPath.answer``, else ``Assignments.signed_heartbeat``: what the HTTP
  layer runs) unless ``--unsigned``;
* uploads: signed ``Auth.authenticate`` + ``Submissions.precheck_upload`` + ``accept_upload`` of a real (tiny)
  rollout parquet file: the service reads and checks it, counts its usable groups and commits it to its content
  store;
* a validator polls ``pending`` and posts accepting ``Verdicts.verdict``s; a trainer polls ``accepted(step)`` and,
  once ``--groups-per-step`` usable groups are in, "trains" for ``--train-s`` and calls ``RunState.set_step``;
* a sweeper calls ``Membership.sweep`` every ``sweep_interval_s``, as the HTTP app does.

A simulated node behaves as ``swarmrl.protocol.node.run_node``: heartbeat; answer each listed assignment in
order (skipping those whose step is behind the reply's step), keep-alive heartbeats every interval while
generating (their replies ignored); after finishing work heartbeat again at once, else wait an interval. A
node's speed class (fast / mid / slow, lognormal around the class median) sets its generation time; its
reliability class sets a crash rate (crash: silent, in-flight work lost; some restart after a lognormal
downtime with the same key) and all nodes may leave (finish the current assignment, upload, stop).

Measured per run: assignment latency (simulated seconds from a node being idle, i.e. its list of work done or
just joined, to starting new work), wasted work (generated rollouts never used by the trainer: lost in a crash,
closed duplicates, late, surplus), rollouts/s (simulated), steps, and the wall-clock and CPU time of each kind of
service call (so where one orchestrator saturates can be read off: ``service_load`` is service busy seconds
per simulated second; above 1.0 one orchestrator could not keep up in real time).

    python benchmarks/swarm/simulate.py --nodes 1000 --minutes 10
    python benchmarks/swarm/simulate.py --nodes 1000,10000,100000 --minutes 10,3,1 --mode both
    python benchmarks/swarm/simulate.py --nodes 1000 --database-url postgresql+psycopg2://...
    python benchmarks/swarm/simulate.py --nodes 50 --minutes 5 --mode demand --overassign 1.0

Ends with one JSON line per (scale, mode) run.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import heapq
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from sqlalchemy import insert, select  # noqa: E402

from swarmrl.contract import RLContract
from swarmrl.protocol.config import OrchestratorConfig  # noqa: E402
from swarmrl.protocol.db import Database  # noqa: E402
from swarmrl.protocol.orchestrator.auth import SignedRequest  # noqa: E402
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError  # noqa: E402
from swarmrl.protocol.orchestrator.service import Orchestrator  # noqa: E402
from swarmrl.protocol.schemas import (  # noqa: E402
    DepositRequest,
    HeartbeatReply,
    HeartbeatRequest,
    RegisterRequest,
    StepRequest,
    VerdictRequest,
)
from swarmrl.protocol.signing import body_sha256, generate_key, node_id_for, public_key_hex, sign_request  # noqa: E402
from swarmrl.protocol.tables import Assignment, LedgerEntry, Node, Submission  # noqa: E402
from swarmrl.rollouts.wire import SCHEMA  # noqa: E402

HB_PATH = "/v1/nodes/heartbeat"
UPLOAD_PREFIX = "/v1/submissions/upload/"  # swarmrl.protocol.orchestrator.http.UPLOAD_PREFIX (no fastapi import)
T0 = 1_700_000_000.0  # simulated epoch (unix seconds)

# speed classes: (name, share of nodes, median seconds to generate one assignment)
SPEEDS = (("fast", 0.3, 30.0), ("mid", 0.5, 60.0), ("slow", 0.2, 150.0))
# reliability classes: (name, share, crashes per node-hour)
RELIABILITY = (("steady", 0.8, 0.1), ("flaky", 0.15, 2.0), ("bad", 0.05, 10.0))


@dataclasses.dataclass
class SimConfig:
    nodes: int = 1000
    minutes: float = 10.0  # simulated
    mode: str = "per-node"  # per-node (groups_per_step = 0 on the orchestrator) | demand
    groups_per_step: int = 0  # the trainer's batch (usable groups per step); 0: nodes * tasks_per_node // 2
    train_s: float = 20.0  # simulated trainer time per step
    heartbeat_s: float = 10.0
    sweep_s: float = 1.0
    validator_poll_s: float = 2.0
    trainer_poll_s: float = 2.0
    tasks_per_node: int = 8
    group_size: int = 4
    async_level: int = 2
    lookahead: int = 2  # demand mode (swarmrl.job.derive: lookahead = async_level)
    overassign: float = 1.5  # demand mode: > 1 / informative, or a step waits on its slowest holders
    assignment_timeout_s: float = 300.0  # demand mode: open work older than this is reassigned (configs/smollm2.toml)
    informative: float = 0.75  # chance that a group's rewards differ (a tied group is not usable)
    gen_sigma: float = 0.35  # lognormal spread of a node's median within its class
    gen_jitter: float = 0.15  # lognormal spread of one assignment around the node's median
    restart_p: float = 0.5  # a crashed node comes back (same key) with this probability
    downtime_s: float = 60.0  # median downtime before a restart (lognormal, sigma 0.5)
    leave_per_h: float = 0.2  # graceful departures per node-hour
    signed: bool = True
    register_real: int = 2000  # nodes that deposit + register through the service; the rest are bulk rows
    database_url: str = ""
    data_dir: str = ""  # "" = a temp dir, removed afterwards
    seed: int = 0
    progress: bool = True
    speeds: tuple = SPEEDS
    reliability: tuple = RELIABILITY

    def batch(self) -> int:
        return self.groups_per_step or max(1, self.nodes * self.tasks_per_node // 2)


class SimNode:
    __slots__ = ("i", "key", "pub", "nid", "principal", "median", "speed", "crash_per_h", "alive", "epoch",
                 "todo", "reply_step", "done", "busy", "gen_start", "gen_end", "idle_since", "leaving", "gone",
                 "spans", "crashes", "gen_token")

    def __init__(self, i: int, key: Any, pub: str, speed: str, median: float, crash_per_h: float) -> None:
        self.i, self.key, self.pub = i, key, pub
        self.nid = node_id_for(pub)
        self.principal = Principal(self.nid, pub, "worker", "0" * 64)
        self.speed, self.median, self.crash_per_h = speed, median, crash_per_h
        self.alive, self.epoch, self.leaving, self.gone = False, 0, False, False
        self.todo: list = []  # the current reply's assignments still to answer
        self.reply_step = 0
        self.done: set[int] = set()  # assignment ids answered by this process (cleared by a restart)
        self.busy: int | None = None  # assignment id being generated
        self.gen_start = self.gen_end = 0.0
        self.idle_since: float | None = None
        self.spans: list[list[float]] = []  # [alive from, alive until] (simulated, relative to T0)
        self.crashes = 0
        self.gen_token = 0  # the generation a keep-alive chain belongs to (one chain per generation)


class Timings:
    """Wall-clock and thread CPU seconds of each kind of service call."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = defaultdict(list)
        self.cpu: dict[str, float] = defaultdict(float)

    def call(self, kind: str, fn, *args, **kw):  # noqa: ANN001, ANN201
        c0, w0 = time.process_time(), time.perf_counter()  # every thread (the heartbeat writer's commits too)
        try:
            return fn(*args, **kw)
        finally:
            self.wall[kind].append(time.perf_counter() - w0)
            self.cpu[kind] += time.process_time() - c0

    def summary(self) -> dict[str, dict[str, float]]:
        out = {}
        for k, v in sorted(self.wall.items()):
            s = sorted(v)
            out[k] = {"n": len(s), "wall_ms_mean": 1e3 * sum(s) / len(s), "wall_ms_p50": 1e3 * pct(s, 50),
                      "wall_ms_p99": 1e3 * pct(s, 99), "cpu_ms_mean": 1e3 * self.cpu[k] / len(s),
                      "wall_s_total": sum(s)}
        return out


def pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, math.ceil(q / 100 * len(sorted_vals)) - 1))
    return sorted_vals[i]


class Sim:
    def __init__(self, sc: SimConfig, orch: Orchestrator, nodes: list[SimNode], validator: Principal,
                 authority: Principal, bulk_note: str) -> None:
        self.sc, self.orch, self.nodes = sc, orch, nodes
        self.validator, self.authority = validator, authority
        self.rng = random.Random(sc.seed + 1)
        self.t = 0.0
        self.end = sc.minutes * 60.0
        self.q: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.tm = Timings()
        self.hb_body = HeartbeatRequest().model_dump_json().encode()
        self.hb_sha = body_sha256(self.hb_body)
        self.hb_req = HeartbeatRequest()
        self.latency: list[float] = []
        # per generation attempt: assignment id -> dict(node, start, rollouts, outcome, submission, step)
        self.gens: list[dict[str, Any]] = []
        self.by_sub: dict[int, dict[str, Any]] = {}
        self.step = 0
        self.training = False
        self.gathered: dict[int, float] = {}  # step -> simulated time its batch was taken
        self.used_subs: dict[int, int] = {}  # submission id -> usable groups the trainer took from it
        self.step_times: list[float] = []
        self.counts: Counter = Counter()
        self.bulk_note = bulk_note
        self.uploads_dir = Path(orch.store.tmp)
        self.env_name = orch.cfg.contract.task.name

    # ---- events ----------------------------------------------------------------------------------
    def at(self, t: float, kind: str, i: int = -1, epoch: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.q, (t, self.seq, kind, i, epoch))

    def run(self) -> None:
        sc = self.sc
        for n in self.nodes:  # first heartbeats spread over one interval
            self.at(self.rng.uniform(0, sc.heartbeat_s), "join", n.i)
        self.at(sc.sweep_s, "sweep")
        self.at(sc.validator_poll_s, "validate")
        self.at(sc.trainer_poll_s, "trainer")
        wall0, last = time.perf_counter(), time.perf_counter()
        bar = Progress(sc, self.end)
        while self.q and self.q[0][0] <= self.end:
            t, _, kind, i, epoch = heapq.heappop(self.q)
            self.t = t
            getattr(self, "ev_" + kind)(i, epoch)
            if time.perf_counter() - last > 2.0:
                last = time.perf_counter()
                bar.update(t, self.step, sum(len(v) for v in self.tm.wall.values()), last - wall0)
        bar.close(self.t, self.step, time.perf_counter() - wall0)
        self.wall_s = time.perf_counter() - wall0

    def now(self) -> float:
        return T0 + self.t

    # ---- service calls (what a node, validator, trainer and sweeper send) -----------------------------
    def heartbeat(self, n: SimNode, kind: str):  # noqa: ANN201
        if self.sc.signed:
            h = sign_request(n.key, "POST", HB_PATH, content_sha256=self.hb_sha, timestamp=int(self.now()))
            return self.tm.call(kind, self.signed_heartbeat, h)
        return self.tm.call(kind, self.orch.assignments.heartbeat, n.principal, self.hb_req, now=self.now())

    def signed_heartbeat(self, h: dict[str, str]) -> HeartbeatReply:
        """As the HTTP layer runs it: the hot path (its group commit awaited), else the full path."""
        call = SignedRequest("POST", HB_PATH, h, body_sha256(self.hb_body))  # hashed per beat, as the HTTP layer does
        verified, done, reply = self.orch.hot_path.answer(call, self.hb_body, now=self.now())
        if done is None:
            return self.orch.assignments.signed_heartbeat(call, self.hb_req, now=self.now(), verified=verified)
        if not done.result():
            raise ProtocolError(401, "replayed nonce")
        return HeartbeatReply.model_validate_json(reply)

    def upload(self, n: SimNode, a: Any) -> tuple[int | None, int]:
        """Write the node's file (not timed: node side), then the service's three upload calls (timed)."""
        path = self.uploads_dir / f"sim-{n.nid}-{a.assignment_id}-{self.seq}"
        pq.write_table(self.rollout_table(n, a), path, compression="zstd")
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            if self.sc.signed:
                upath = f"{UPLOAD_PREFIX}{a.assignment_id}"
                h = sign_request(n.key, "PUT", upath, content_sha256=sha, timestamp=int(self.now()))
                p = self.orch.auth.authenticate(SignedRequest("PUT", upath, h, None), ("worker",), now=self.now())
            else:
                p = dataclasses.replace(n.principal, content_sha256=sha)
            self.orch.submissions.precheck_upload(p, a.assignment_id)
            rep = self.orch.submissions.accept_upload(p, a.assignment_id, path, sha, len(data), now=self.now())
            return rep.submission_id, 0
        except ProtocolError as e:
            path.unlink(missing_ok=True)
            return None, e.status
        finally:
            self.tm.wall["submission"].append(time.perf_counter() - w0)
            self.tm.cpu["submission"] += time.process_time() - c0

    def rollout_table(self, n: SimNode, a: Any) -> pa.Table:
        g, rows = a.contract.group_size, len(a.tasks) * a.contract.group_size
        rewards = []
        for _ in a.tasks:
            tied = self.rng.random() >= self.sc.informative
            rewards += [1.0] * g if tied else [k / max(1, g - 1) for k in range(g)]
        cols = {"worker_id": [n.nid] * rows, "step": [a.step] * rows, "policy_version": [a.policy_version] * rows,
                "task_id": [t.task_id for t in a.tasks for _ in range(g)], "env": [a.contract.task.name] * rows,
                "group_id": [f"{a.assignment_id}-{gi}" for gi in range(len(a.tasks)) for _ in range(g)],
                "prompt_ids": [[1, 2, 3]] * rows, "completion_ids": [[4, 5]] * rows,
                "logprobs": [[-0.1, -0.2]] * rows, "reward": rewards, "task_reward": rewards,
                "length_penalty": [0.0] * rows, "target_length": [a.target_length] * rows,
                "temperature": [1.0] * rows, "finished": [True] * rows, "seed": [a.seed] * rows,
                "proofs": [[]] * rows, "completion_mask": [[1, 1]] * rows}
        return pa.Table.from_pydict(cols, schema=SCHEMA)

    # ---- nodes -----------------------------------------------------------------------------------
    def ev_join(self, i: int, _epoch: int) -> None:
        n = self.nodes[i]
        self.start(n)

    def start(self, n: SimNode) -> None:
        sc = self.sc
        n.alive, n.epoch = True, n.epoch + 1
        n.done, n.todo, n.busy, n.leaving = set(), [], None, False
        n.idle_since = self.t
        n.spans.append([self.t, math.inf])
        crash = self.rng.expovariate(n.crash_per_h / 3600.0) if n.crash_per_h > 0 else math.inf
        leave = self.rng.expovariate(sc.leave_per_h / 3600.0) if sc.leave_per_h > 0 else math.inf
        if min(crash, leave) + self.t <= self.end:
            self.at(self.t + min(crash, leave), "crash" if crash < leave else "leave", n.i, n.epoch)
        self.main_beat(n)

    def main_beat(self, n: SimNode) -> None:
        """A heartbeat of the node's main loop: its reply is the node's list of work."""
        if n.leaving:
            return self.stop(n, graceful=True)
        try:
            reply = self.heartbeat(n, "heartbeat")
        except ProtocolError as e:
            self.counts[f"heartbeat_refused_{e.status}"] += 1
            self.at(self.t + self.sc.heartbeat_s, "beat", n.i, n.epoch)
            return
        n.todo = [a for a in reply.assignments if a.assignment_id not in n.done]
        n.reply_step = reply.step
        self.next_work(n, worked=False)

    def next_work(self, n: SimNode, worked: bool) -> None:
        while n.todo:
            a = n.todo.pop(0)
            n.done.add(a.assignment_id)
            if a.step < n.reply_step:  # run_node's worker skips work the trainer is past
                self.counts["skipped_stale"] += 1
                continue
            if n.idle_since is not None:
                self.latency.append(self.t - n.idle_since)
                n.idle_since = None
            dur = n.median * self.rng.lognormvariate(0.0, self.sc.gen_jitter)
            n.busy, n.gen_start, n.gen_end = a.assignment_id, self.t, self.t + dur
            n.todo.insert(0, a)  # kept at the head while generating (popped on completion)
            self.seq += 1
            n.gen_token = self.seq
            self.at(n.gen_end, "gen_done", n.i, n.epoch)
            self.at(self.t + self.sc.heartbeat_s, "keepalive", n.i, n.gen_token)
            return
        if n.idle_since is None:
            n.idle_since = self.t
        if worked:  # a node that just finished work beats again at once
            self.main_beat(n)
        else:
            self.at(self.t + self.sc.heartbeat_s, "beat", n.i, n.epoch)

    def ev_beat(self, i: int, epoch: int) -> None:
        n = self.nodes[i]
        if n.alive and n.epoch == epoch and n.busy is None:
            self.main_beat(n)

    def ev_keepalive(self, i: int, token: int) -> None:
        n = self.nodes[i]
        if not (n.alive and n.gen_token == token and n.busy is not None):
            return
        try:
            self.heartbeat(n, "heartbeat")
        except ProtocolError as e:
            self.counts[f"heartbeat_refused_{e.status}"] += 1
        self.at(self.t + self.sc.heartbeat_s, "keepalive", n.i, token)

    def ev_gen_done(self, i: int, epoch: int) -> None:
        n = self.nodes[i]
        if not (n.alive and n.epoch == epoch and n.busy is not None):
            return
        a = n.todo.pop(0)
        rollouts = len(a.tasks) * a.contract.group_size
        sid, status = self.upload(n, a)
        g = {"node": n.i, "assignment": a.assignment_id, "step": a.step, "rollouts": rollouts,
             "gen_s": self.t - n.gen_start, "uploaded_at": self.t, "submission": sid,
             "outcome": "uploaded" if sid is not None else f"refused_{status}",
             "past_window": self.step - a.step > self.sc.async_level,
             "reassigned": a.reassigned_from is not None}
        self.gens.append(g)
        if sid is not None:
            self.by_sub[sid] = g
        n.busy = None
        self.next_work(n, worked=True)

    def ev_crash(self, i: int, epoch: int) -> None:
        n = self.nodes[i]
        if not (n.alive and n.epoch == epoch):
            return
        if n.busy is not None:
            a = n.todo[0]
            frac = (self.t - n.gen_start) / max(1e-9, n.gen_end - n.gen_start)
            self.gens.append({"node": n.i, "assignment": a.assignment_id, "step": a.step,
                              "rollouts": frac * len(a.tasks) * a.contract.group_size, "gen_s": self.t - n.gen_start,
                              "uploaded_at": None, "crashed_at": self.t, "submission": None,
                              "outcome": "lost_in_crash",
                              "past_window": False, "reassigned": a.reassigned_from is not None})
        n.crashes += 1
        self.stop(n, graceful=False)
        if self.rng.random() < self.sc.restart_p:
            self.at(self.t + self.sc.downtime_s * self.rng.lognormvariate(0.0, 0.5), "restart", n.i, n.epoch)

    def ev_restart(self, i: int, epoch: int) -> None:
        n = self.nodes[i]
        if not n.alive and not n.gone and n.epoch == epoch:
            self.counts["restarts"] += 1
            self.start(n)

    def ev_leave(self, i: int, epoch: int) -> None:
        n = self.nodes[i]
        if n.alive and n.epoch == epoch:
            n.leaving = True
            if n.busy is None:
                self.stop(n, graceful=True)

    def stop(self, n: SimNode, graceful: bool) -> None:
        n.alive, n.busy, n.todo, n.idle_since = False, None, [], None
        n.spans[-1][1] = self.t
        if graceful:
            n.gone = True
            self.counts["left"] += 1
        else:
            self.counts["crashes"] += 1

    # ---- sweeper, validator, trainer ---------------------------------------------------------------
    def ev_sweep(self, _i: int, _e: int) -> None:
        dead = self.tm.call("sweep", self.orch.membership.sweep, now=self.now())
        self.counts["declared_dead"] += len(dead)
        self.at(self.t + self.sc.sweep_s, "sweep")

    def ev_validate(self, _i: int, _e: int) -> None:
        while True:
            items = self.tm.call("pending", self.orch.submissions.pending, 256).items
            for it in items:
                sid = it.submission.submission_id
                self.tm.call("verdict", self.orch.verdicts.verdict, self.validator,
                             VerdictRequest(submission_id=sid, accepted=True, reason="simulated"), now=self.now())
                if sid in self.by_sub:
                    self.by_sub[sid]["accepted_at"] = self.t
            if len(items) < 256:
                break
        self.at(self.t + self.sc.validator_poll_s, "validate")

    def ev_trainer(self, _i: int, _e: int) -> None:
        if self.training:
            return
        items = self.tm.call("accepted", self.orch.submissions.accepted, self.step).items
        have = sum(it.informative for it in items)
        need = self.sc.batch()
        if have >= need:
            self.gathered[self.step] = self.t
            left = need
            for it in items:  # the trainer's collect_batch: usable groups in submission order, the first `need` of them
                if left <= 0:
                    break
                take = min(left, it.informative)
                if take > 0:
                    self.used_subs[it.submission_id] = take
                left -= take
            self.training = True
            self.at(self.t + self.sc.train_s, "trained")
        else:
            self.at(self.t + self.sc.trainer_poll_s, "trainer")

    def ev_trained(self, _i: int, _e: int) -> None:
        self.step += 1
        self.tm.call("set_step", self.orch.run.set_step, StepRequest(step=self.step, policy_version=self.step))
        self.step_times.append(self.t)
        self.training = False
        self.at(self.t, "trainer")

    # ---- results -----------------------------------------------------------------------------------
    def result(self, setup: dict[str, Any]) -> dict[str, Any]:
        sc = self.sc
        waste = Counter()
        generated = used = 0.0
        late_past_window = 0.0
        for g in self.gens:
            r = g["rollouts"]
            if g["outcome"] == "uploaded":
                sid = g["submission"]
                acc = g.get("accepted_at")
                if sid in self.used_subs:
                    cat = "used"
                elif acc is None:
                    # not judged or not gathered by the end: neither used nor wasted yet (left out)
                    if g["step"] in self.gathered and g["uploaded_at"] > self.gathered[g["step"]]:
                        cat = "late"
                    else:
                        continue
                elif g["step"] in self.gathered and acc > self.gathered[g["step"]]:
                    cat = "late"
                elif g["step"] in self.gathered:
                    cat = "surplus"
                else:
                    continue  # accepted, its step not trained yet at the end
            elif g["outcome"] == "lost_in_crash":
                cat = "lost_in_crash"
            elif g["outcome"] == "refused_409":
                cat = "closed_duplicate"
            else:
                cat = g["outcome"]
            generated += r
            if cat == "used":
                used += r
            else:
                waste[cat] += r
                if cat == "late" and g["past_window"]:
                    late_past_window += r
        completed = sum(g["rollouts"] for g in self.gens if g["outcome"] == "uploaded")
        # nodes alive and still idle at the end count with the idle time so far (a lower bound)
        censored = [self.end - n.idle_since for n in self.nodes if n.alive and n.idle_since is not None]
        lat = sorted(self.latency + censored)
        tsum = self.tm.summary()
        busy = sum(v["wall_s_total"] for v in tsum.values())
        busy_cpu = sum(self.tm.cpu.values())
        # before the trainer took a first batch only crash losses are attributable: no waste figure then
        trained = bool(self.gathered) and generated > 0
        duration = min(self.t, self.end) or 1e-9
        fam = self.families()
        alive_ok = self.accepted_assigned_alive()
        steps = self.step
        out = {
            "nodes": sc.nodes, "mode": sc.mode, "simulated_s": round(duration, 1), "wall_s": round(self.wall_s, 1),
            "signed": sc.signed, "database": "sqlite" if not sc.database_url else sc.database_url.split(":")[0],
            "heartbeat_s": sc.heartbeat_s, "groups_per_step": sc.batch(), "train_s": sc.train_s,
            "steps": steps, "step_s_mean": round(duration / steps, 1) if steps else None,
            "assign_latency_p50_s": round(pct(lat, 50), 2), "assign_latency_p99_s": round(pct(lat, 99), 2),
            "assign_latency_n": len(lat), "idle_at_end": len(censored),
            "rollouts_per_s": round(completed / duration, 2),
            "used_rollouts_per_s": round(used / duration, 2),
            "wasted_fraction": round(sum(waste.values()) / generated, 4) if trained else None,
            "wasted_by_cause": {k: round(v / generated, 4) for k, v in sorted(waste.items())} if trained else {},
            "late_past_window_fraction": round(late_past_window / generated, 4) if trained else None,
            "heartbeat_ms_mean": round(tsum.get("heartbeat", {}).get("wall_ms_mean", float("nan")), 3),
            "heartbeat_ms_p99": round(tsum.get("heartbeat", {}).get("wall_ms_p99", float("nan")), 3),
            "heartbeat_cpu_ms": round(tsum.get("heartbeat", {}).get("cpu_ms_mean", float("nan")), 3),
            "submission_ms_mean": round(tsum.get("submission", {}).get("wall_ms_mean", float("nan")), 3),
            "submission_ms_p99": round(tsum.get("submission", {}).get("wall_ms_p99", float("nan")), 3),
            "submission_cpu_ms": round(tsum.get("submission", {}).get("cpu_ms_mean", float("nan")), 3),
            "service_load": round(busy / duration, 3), "service_cpu_load": round(busy_cpu / duration, 3),
            "heartbeats_per_sim_s": round(tsum.get("heartbeat", {}).get("n", 0) / duration, 1),
            "submissions_per_sim_s": round(tsum.get("submission", {}).get("n", 0) / duration, 2),
            "ops": {k: {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in v.items()}
                    for k, v in tsum.items()},
            "counts": dict(self.counts), "families": fam, "accepted_assigned_alive": alive_ok,
            "setup": setup,
        }
        return out

    def families(self) -> dict[str, int]:
        """Work taken over from another holder (a family with a row whose parent is set): how much of it was
        completed (some row of the family submitted) by the end, and by whom."""
        with self.orch.db.tx() as s:
            rows = s.execute(select(Assignment.origin_node_id, Assignment.step, Assignment.round, Assignment.node_id,
                                    Assignment.status, Assignment.parent_id)).all()
        fams: dict[tuple, list] = defaultdict(list)
        for o, st, r, nid, status, parent in rows:
            fams[(o, st, r or 0)].append((nid, status, parent))
        taken = done = by_other = 0
        for (origin, _st, _r), members in fams.items():
            if not any(p is not None for _, _, p in members):
                continue
            taken += 1
            sub = [nid for nid, status, _ in members if status == "submitted"]
            if sub:
                done += 1
                by_other += sub[0] != origin
        return {"taken_over": taken, "completed": done, "completed_by_other": by_other}

    def accepted_assigned_alive(self) -> dict[str, int]:
        """Every accepted submission's assignment row was created (or re-opened) while its node was alive."""
        spans = {n.nid: n.spans for n in self.nodes}
        ok = bad = 0
        with self.orch.db.tx() as s:
            rows = s.execute(select(Submission.node_id, Assignment.created_at).join(
                Assignment, Submission.assignment_id == Assignment.id).where(Submission.status == "accepted")).all()
        for nid, created in rows:
            t = created - T0
            if any(a - 1e-6 <= t <= b + 1e-6 for a, b in spans.get(nid, [])):
                ok += 1
            else:
                bad += 1
        return {"ok": ok, "bad": bad}


class Progress:
    """rich on a terminal, plain lines otherwise."""

    def __init__(self, sc: SimConfig, end: float) -> None:
        self.sc, self.end, self.bar = sc, end, None
        if sc.progress and sys.stdout.isatty():
            from rich.progress import Progress as RichProgress  # noqa: PLC0415  # lazy: TTY only

            self.bar = RichProgress(transient=True)
            self.bar.start()
            self.task = self.bar.add_task(f"{sc.nodes} nodes, {sc.mode}", total=end)

    def update(self, t: float, step: int, ops: int, wall: float) -> None:
        if not self.sc.progress:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=t, description=f"{self.sc.nodes} nodes, {self.sc.mode}, step {step}")
        else:
            print(f"  [{self.sc.nodes} {self.sc.mode}] sim {t:7.1f}/{self.end:.0f} s  step {step}  "
                  f"{ops} service calls  wall {wall:.0f} s", flush=True)

    def close(self, t: float, step: int, wall: float) -> None:
        if self.bar is not None:
            self.bar.stop()


def pick(classes: tuple, r: float) -> tuple:
    """The class whose share of the cumulative distribution holds ``r`` (uniform in [0, 1))."""
    for c in classes:
        r -= c[1]
        if r < 0:
            return c
    return classes[-1]


def build(sc: SimConfig, data_dir: Path) -> tuple[Orchestrator, list[SimNode], Principal, Principal, dict]:
    rng = random.Random(sc.seed)
    vkey, tkey, akey = generate_key(), generate_key(), generate_key()
    cfg = OrchestratorConfig(
        data_dir=str(data_dir), database_url=sc.database_url, run_secret="simulated-run-secret",
        validator_keys=[public_key_hex(vkey)], trainer_keys=[public_key_hex(tkey)],
        stake_authority_keys=[public_key_hex(akey)], self_declared_stake=False,
        heartbeat_interval_s=sc.heartbeat_s, sweep_interval_s=sc.sweep_s, tasks_per_node=sc.tasks_per_node,
        contract=RLContract(group_size=sc.group_size, async_level=sc.async_level),
        groups_per_step=sc.batch() if sc.mode == "demand" else 0,
        lookahead=sc.lookahead, overassign=sc.overassign, assignment_timeout_s=sc.assignment_timeout_s,
        # the per-key token bucket runs on the wall clock; a simulated hour passes in seconds here
        rate_limit_per_s=1e9, rate_limit_burst=1_000_000_000,
        metrics_path=str(data_dir / "metrics.jsonl"))
    if sc.database_url:
        db = Database(sc.database_url)
        db.drop_all()
        db.create_all()
        orch = Orchestrator(cfg, db)
    else:
        orch = Orchestrator(cfg)
    t_keys = time.perf_counter()
    nodes = []
    for i in range(sc.nodes):
        key = generate_key()
        name, _, median = pick(sc.speeds, rng.random())
        median *= rng.lognormvariate(0.0, sc.gen_sigma)
        per_h = pick(sc.reliability, rng.random())[2]
        nodes.append(SimNode(i, key, public_key_hex(key), name, median, per_h))
    t_keys = time.perf_counter() - t_keys
    vp = Principal(node_id_for(public_key_hex(vkey)), public_key_hex(vkey), "validator", "0" * 64)
    ap = Principal(node_id_for(public_key_hex(akey)), public_key_hex(akey), "authority", "0" * 64)
    tm = Timings()
    real = nodes[: sc.register_real]
    for n in real:  # the production path: a stake authority deposits, the node registers locking it
        tm.call("deposit", orch.membership.deposit, ap, DepositRequest(node_id=n.nid, amount=100.0), now=T0)
        tm.call("register", orch.membership.register, n.principal, RegisterRequest(throughput=1000.0 / n.median, stake=100.0),
                now=T0)
    bulk = nodes[sc.register_real:]
    t_bulk = time.perf_counter()
    with orch.db.engine.begin() as conn:  # the same rows deposit + register write, in bulk
        for k in range(0, len(bulk), 5000):
            chunk = bulk[k:k + 5000]
            conn.execute(insert(Node.__table__), [
                {"id": n.nid, "public_key": n.pub, "role": "worker", "status": "active", "hardware": {},
                 "throughput": 1000.0 / n.median, "registered_at": T0, "last_heartbeat": T0} for n in chunk])
            conn.execute(insert(LedgerEntry.__table__), [
                {"node_id": n.nid, "kind": kind, "amount": 100.0, "created_at": T0, "note": note}
                for n in chunk for kind, note in (("deposit", "deposited by stake authority (bulk)"),
                                                  ("stake", "stake locked at registration"))])
    t_bulk = time.perf_counter() - t_bulk
    regs = tm.summary()
    setup = {"registered_via_service": len(real), "bulk_inserted": len(bulk), "keygen_s": round(t_keys, 1),
             "bulk_insert_s": round(t_bulk, 1),
             **{f"{k}_ms_mean": round(v["wall_ms_mean"], 3) for k, v in regs.items()}}
    return orch, nodes, vp, ap, setup


def simulate(sc: SimConfig, keep: bool = False) -> dict[str, Any]:
    """Run one simulation; returns the results (with ``keep``, also the live orchestrator under "_orch" and the
    sim under "_sim"; the caller disposes of the database)."""
    tmp = None
    if sc.data_dir:
        data_dir = Path(sc.data_dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="swarmrl-sim-")
        data_dir = Path(tmp.name)
    orch, nodes, vp, ap, setup = build(sc, data_dir)
    sim = Sim(sc, orch, nodes, vp, ap, "")
    try:
        sim.run()
        res = sim.result(setup)
    finally:
        if not keep:
            orch.db.dispose()
            if tmp is not None:
                tmp.cleanup()
    if keep:
        res["_orch"], res["_sim"], res["_tmp"] = orch, sim, tmp
    return res


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| nodes | mode | sim min | wall s | steps | assign p50 / p99 s | wasted | lost / dup / late / surplus "
            "| rollouts/s | hb ms (cpu) | upload ms (cpu) | load (cpu) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        w = r["wasted_by_cause"]
        if r["wasted_fraction"] is None:
            wasted, causes = "n/a", "no step trained"
        else:
            wasted = f"{r['wasted_fraction']:.1%}"
            causes = " / ".join(f"{w.get(k, 0):.1%}" for k in ("lost_in_crash", "closed_duplicate", "late", "surplus"))
        lines.append(
            f"| {r['nodes']:,} | {r['mode']} | {r['simulated_s'] / 60:.1f} | {r['wall_s']:.0f} | {r['steps']} "
            f"| {r['assign_latency_p50_s']:.1f} / {r['assign_latency_p99_s']:.1f} | {wasted} "
            f"| {causes} | {r['rollouts_per_s']:.0f} | {r['heartbeat_ms_mean']:.2f} "
            f"({r['heartbeat_cpu_ms']:.2f}) | {r['submission_ms_mean']:.1f} ({r['submission_cpu_ms']:.1f}) "
            f"| {r['service_load']:.2f} ({r['service_cpu_load']:.2f}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1000", help="comma-separated scales, e.g. 1000,10000,100000")
    ap.add_argument("--minutes", default="10", help="simulated minutes, one value or one per scale")
    ap.add_argument("--mode", choices=("per-node", "demand", "both"), default="per-node")
    ap.add_argument("--groups-per-step", type=int, default=0, help="trainer batch; 0: nodes * tasks_per_node / 2")
    ap.add_argument("--heartbeat-s", default="10", help="heartbeat interval, one value or one per scale")
    ap.add_argument("--train-s", type=float, default=20.0)
    ap.add_argument("--overassign", type=float, default=SimConfig.overassign,
                    help="demand mode: open work a step may hold, in batches (1.0: exactly one batch)")
    ap.add_argument("--register-real", type=int, default=2000)
    ap.add_argument("--unsigned", action="store_true", help="heartbeat() instead of signed_heartbeat()")
    ap.add_argument("--database-url", default="")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="also write the results (a JSON list) here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    scales = [int(x) for x in args.nodes.split(",")]

    def per_scale(v: str, cast) -> list:  # noqa: ANN001
        vals = [cast(x) for x in v.split(",")]
        return vals * len(scales) if len(vals) == 1 else vals

    minutes, hbs = per_scale(args.minutes, float), per_scale(args.heartbeat_s, float)
    modes = ("per-node", "demand") if args.mode == "both" else (args.mode,)
    results = []
    for n, m, hb in zip(scales, minutes, hbs, strict=True):
        for mode in modes:
            sc = SimConfig(nodes=n, minutes=m, mode=mode, groups_per_step=args.groups_per_step, heartbeat_s=hb,
                           train_s=args.train_s, overassign=args.overassign, register_real=args.register_real,
                           signed=not args.unsigned,
                           database_url=args.database_url, seed=args.seed, progress=not args.quiet)
            print(f"simulating {n:,} nodes, {mode}, {m:g} simulated minutes, heartbeat {hb:g} s", flush=True)
            results.append(simulate(sc))
    print()
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k not in ("ops", "counts", "families", "setup")}))


if __name__ == "__main__":
    main()
