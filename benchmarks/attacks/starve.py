"""Demand-mode starvation by idle sybils, on a simulated clock: N sybils register and heartbeat once (taking
whatever work the steps in the window have), then go idle; one honest node heartbeats every
``--beat`` seconds and uploads each assignment at once; the sweeper runs every ``--sweep`` seconds; the
trainer moves to the next step as soon as a step has its usable groups. Drives the orchestrator's services
directly (no HTTP), so it also runs against older code (before issue 41 their calls were methods of
``Orchestrator`` itself and the tables lived in ``protocol.models``: both are looked up either way).

    python benchmarks/attacks/starve.py [--sybils 300] [--seconds 60] [--preset swarm|default] [--sybil-beat 5]
    PYTHONPATH=/path/to/other/checkout python benchmarks/attacks/starve.py    # the same against other code

Prints ONE JSON line: how many assignments the honest node got and completed, when it got the first, the
steps the trainer finished, and how many assignments the sybils' heartbeats listed (summed over beats).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path += [str(ROOT), str(ROOT / "tests")]  # after PYTHONPATH: point that at another checkout to measure it

from protocol_support import rollouts_for, write  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from swarmrl.protocol.config import OrchestratorConfig  # noqa: E402
from swarmrl.protocol.orchestrator import Orchestrator, Principal  # noqa: E402
from swarmrl.protocol.schemas import HeartbeatRequest, RegisterRequest, StepRequest  # noqa: E402
from swarmrl.protocol.signing import generate_key, node_id_for, public_key_hex  # noqa: E402

try:
    from swarmrl.protocol.tables import Submission  # noqa: E402
except ImportError:  # an older checkout (see above)
    from swarmrl.protocol.models import Submission  # noqa: E402

PRESETS = {  # "swarm": what swarmrl run derives (0.5 s heartbeats, dead after 20, timeout 30 s); "default": the defaults
    "swarm": dict(heartbeat_interval_s=0.5, dead_after_missed=20, assignment_timeout_s=30.0, idle_after_missed=10),
    "default": dict(heartbeat_interval_s=10.0, dead_after_missed=3, assignment_timeout_s=0.0),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sybils", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--beat", type=float, default=0.5, help="honest heartbeat (and upload) period, simulated s")
    ap.add_argument("--sweep", type=float, default=0.5, help="sweeper period, simulated s")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="swarm")
    ap.add_argument("--sybil-beat", type=float, default=0.0,
                    help="sybils keep heartbeating with this period (never uploading); 0: once, then idle")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="starve-"))
    kw = dict(data_dir=str(tmp / "orch"), run_secret="s", self_declared_stake=True, groups_per_step=4,
              tasks_per_node=2, lookahead=1, rate_limit_per_s=1e6, rate_limit_burst=10**6,
              contract={"group_size": 2, "async_level": 1, "filter_ties": False,
                        "task": {"name": "add", "params": {"digits": 2}}},
              **PRESETS[a.preset])
    kw = {k: v for k, v in kw.items() if k in OrchestratorConfig.model_fields}  # older code lacks some
    cfg = OrchestratorConfig(**kw)
    orch = Orchestrator(cfg)
    # the services (an older checkout: ``orch`` itself has their methods)
    members, beats, subs, run = (getattr(orch, n, orch) for n in ("membership", "assignments", "submissions", "run"))
    need = cfg.groups_per_step * cfg.overassign

    def join(now: float) -> Principal:
        pub = public_key_hex(generate_key())
        p = Principal(node_id_for(pub), pub, "worker", "0" * 64)
        members.register(p, RegisterRequest(throughput=10.0, stake=100.0), now=now)
        return p

    t0 = 1_000_000.0
    sybils = [join(t0) for _ in range(a.sybils)]
    taken = sum(len(beats.heartbeat(p, HeartbeatRequest(), now=t0).assignments) for p in sybils)
    honest = join(t0)
    got, done, first, t, next_sweep, next_sybil = set(), 0, None, t0, t0, t0 + (a.sybil_beat or float("inf"))
    while t < t0 + a.seconds:
        t += a.beat
        while next_sweep <= t:
            members.sweep(now=next_sweep)
            next_sweep += a.sweep
        while next_sybil <= t:
            taken += sum(len(beats.heartbeat(p, HeartbeatRequest(), now=next_sybil).assignments) for p in sybils)
            next_sybil += a.sybil_beat
        for x in beats.heartbeat(honest, HeartbeatRequest(), now=t).assignments:
            if x.assignment_id in got:
                continue
            got.add(x.assignment_id)
            first = t - t0 if first is None else first
            path = write(rollouts_for(honest.node_id, x), tmp / f"a{x.assignment_id}.parquet")
            data = path.read_bytes()
            try:
                subs.precheck_upload(honest, x.assignment_id)
                subs.accept_upload(honest, x.assignment_id, path, hashlib.sha256(data).hexdigest(), len(data), now=t)
                done += 1
            except Exception:  # noqa: BLE001  (a refused upload counts as not done)
                pass
        step, _ = run.current()
        with orch.db.tx() as s:
            have = s.execute(select(func.coalesce(func.sum(Submission.informative), 0))
                             .where(Submission.step == step)).scalar_one()
        if have >= need:
            run.set_step(StepRequest(step=step + 1, policy_version=step + 1))
    print(json.dumps({"preset": a.preset, "sybils": a.sybils, "sybil_beat_s": a.sybil_beat,
                      "sybil_assignments_listed": taken, "seconds": a.seconds,
                      "honest_assignments": len(got), "honest_completed": done,
                      "first_assignment_after_s": first, "steps_finished": run.current()[0]}))
    orch.db.dispose()


if __name__ == "__main__":
    main()
