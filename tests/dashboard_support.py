"""A live orchestrator for the dashboard tests: three registered nodes heartbeating, one accepted and one
rejected (slashed, ejected) submission, one pending, and a trainer that announced steps with its records."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from protocol_support import make_cfg, rollouts_for, running, write

from swarmrl.dashboard.schemas import TrainerPoint
from swarmrl.protocol.client import NodeClient, TrainerClient, ValidatorClient
from swarmrl.protocol.schemas import VerdictRequest
from swarmrl.protocol.signing import generate_key

STEPS = 6


def trainer_points(step: int) -> list[TrainerPoint]:
    """Step ``step``'s record (version step + 1), plus the base model's evaluation with the first one."""
    pts = [TrainerPoint(version=step + 1, step=step, loss=0.5 / (step + 1), reward=0.2 + 0.1 * step,
                        task_reward=0.25 + 0.1 * step, heldout_acc=0.3 + 0.05 * step if step % 2 else None,
                        wall_s=2.0 * step)]
    return ([TrainerPoint(version=0, heldout_acc=0.25)] if step == 0 else []) + pts


@contextmanager
def live_swarm(tmp: Path, beat_s: float = 0.2) -> Iterator[dict]:
    cfg, keys = make_cfg(tmp, shardcast_relays=["http://127.0.0.1:9/relay-a", "http://127.0.0.1:9/relay-b"])
    with running(cfg) as srv:
        nodes = [NodeClient(srv.url, generate_key()) for _ in range(3)]
        assignments = []
        for i, n in enumerate(nodes):
            n.register(throughput=100.0 * (i + 1), stake=100.0, hardware={"cpu": "test"})
            assignments.append(n.heartbeat().assignments[0])
        tc, vc = TrainerClient(srv.url, keys["trainer"]), ValidatorClient(srv.url, keys["validator"])
        subs = []
        for i, (n, a) in enumerate(zip(nodes, assignments)):
            path = write(rollouts_for(n.node_id, a, correct=i != 1, forge_rewards=i == 1), tmp / f"r{i}.parquet")
            subs.append(n.submit(a.assignment_id, path).submission_id)
        vc.verdict(VerdictRequest(submission_id=subs[0], accepted=True, reason="ok"))
        vc.verdict(VerdictRequest(submission_id=subs[1], accepted=False, reason="forged rewards"))
        for step in range(STEPS):
            tc.set_step(step + 1, step + 1, metrics=trainer_points(step))
        stop = threading.Event()

        def beat() -> None:  # the honest nodes keep heartbeating (the ejected one is refused)
            while not stop.wait(beat_s):
                for n in (nodes[0], nodes[2]):
                    try:
                        n.heartbeat()
                    except Exception:
                        pass

        t = threading.Thread(target=beat, daemon=True)
        t.start()
        try:
            yield {"url": srv.url, "orch": srv.orch, "nodes": [n.node_id for n in nodes], "submissions": subs,
                   "trainer": tc}
        finally:
            stop.set()
            t.join(timeout=5)
            for c in (*nodes, tc, vc):
                c.close()
