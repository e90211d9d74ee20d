"""Hostile outsiders, one JSON line: what the attacks of ``benchmarks/attacks/`` cost us, now and (where a
baseline tree is given) before.

    python benchmarks/attacks/bench.py [--base /path/to/old/checkout] [--conns 20000] [--steps 8]

- ``bomb_peak_rss_mb``: peak RSS of the upload path refusing a ~17 KB rollout file that decodes to 2 GiB
  (``bomb.py --measure``; ``bomb_unbounded_peak_rss_mb``: the old read-it-whole path, under an address-space cap);
- ``idle_conns``, ``honest_beat_before_p50_s``, ``honest_beat_p50_s``, ``honest_beat_p99_s``,
  ``honest_beat_failures``, ``honest_beat_held``: a real orchestrator with ``--conns`` half-sent connections held
  open from other loopback addresses, and an honest node's signed heartbeats before and during the attack
  (``honest_beat.py``; with ``--base`` the same N against the old tree, ``base_*``);
- ``honest_slashed``, ``adversaries_caught`` / ``adversaries``: a short swarm run (the real processes of
  ``swarmrl run``) with one node of every adversary kind at once, and the honest nodes' fate; ``idle_*``: how the
  ``idle_connections`` node's attack was judged (``held``: the honest nodes' heartbeat and upload p50 outside
  and during its rounds, ``swarmrl.job.report.honest_latency``), from how many addresses, how many it held.

Each part runs as its own process, bounded in time; nothing leaves 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarmrl.contract import RLContract

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _json_lines(cmd: list[str], timeout: float) -> list[dict]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def bomb() -> dict:
    m = _json_lines([sys.executable, str(HERE / "bomb.py"), "--measure"], 600)[-1]
    return {"bomb_file_bytes": m["file_bytes"], "bomb_decoded_bytes": m["decoded_bytes"],
            "bomb_peak_rss_mb": m["bounded"]["peak_rss_mb"], "bomb_outcome": m["bounded"]["result"][:80],
            "bomb_unbounded_peak_rss_mb": m["unbounded"]["peak_rss_mb"],
            "bomb_unbounded_outcome": m["unbounded"]["result"][:80]}


def slowloris(conns: int, beats: int, base: Path | None) -> dict:
    cmd = [sys.executable, str(HERE / "honest_beat.py"), "--conns", str(conns), "--beats", str(beats)]
    if base is not None:
        cmd += ["--base", str(base)]
    rows = _json_lines(cmd, 1500)
    out: dict = {}
    for r in rows:
        prefix = "base_" if base is not None and r is not rows[-1] else ""
        out.update({f"{prefix}idle_conns": r.get("idle_conns"),
                    f"{prefix}honest_beat_before_p50_s": r.get("honest_beat_before_p50_s"),
                    f"{prefix}honest_beat_p50_s": r.get("honest_beat_p50_s"),
                    f"{prefix}honest_beat_p99_s": r.get("honest_beat_p99_s"),
                    f"{prefix}honest_beat_failures": r.get("honest_beat_failures"),
                    f"{prefix}honest_beat_held": r.get("held")})
    return out


def swarm(steps: int) -> dict:
    from swarmrl.attacks.config import ADVERSARY_KINDS
    from swarmrl.envs.config import TaskConfig
    from swarmrl.job import RunConfig, SwarmSection, WarmstartSection
    from swarmrl.job.launch import launch
    from swarmrl.models import ModelInitConfig, init_model
    from swarmrl.rl.config import EvalSection, RLConfig, ShardcastSection, WorkerSection

    tmp = Path(tempfile.mkdtemp(prefix="swarmrl-attacks-"))
    model = ROOT / "runs" / "warmstart" / "model"
    if not (model / "config.json").is_file():
        model = tmp / "model"
        init_model(ModelInitConfig(), model)
    rl = RLConfig(run_dir=str(tmp / "run"), model=str(model), contract=RLContract(task=TaskConfig(name="add", params={"digits": 2}), async_level=1, group_size=4,
                                       filter_ties=False),  # a fresh model ties everywhere: nothing would train
                  steps=steps, keep_versions=3, prompts_per_step=8,
                  eval=EvalSection(every_steps=0, n=16), workers=WorkerSection(num=0, prompts_per_batch=4),
                  shardcast=ShardcastSection(enabled=True, relays=1))
    cfg = RunConfig(mode="swarm", rl=rl, warmstart=WarmstartSection(enabled=False), final_eval_n=64,
                    swarm=SwarmSection(nodes=2, adversaries=list(ADVERSARY_KINDS), overassign=2.0,
                                       assignment_timeout_s=10.0))
    t0 = time.monotonic()
    s = launch(cfg, progress=lambda m: None)
    nodes = s["swarm"]["nodes"].values()
    honest = [n for n in nodes if n["adversary"] is None]
    cheats = [n for n in nodes if n["adversary"] is not None]
    caught = [n["adversary"] for n in cheats if n["caught"]]
    out = {"swarm_steps": s["steps"], "swarm_wall_s": round(time.monotonic() - t0, 1),
           "honest_slashed": sum(1 for n in honest if n["slashed"] > 0 or n["rejected"] > 0),
           "honest_accepted": sum(n["accepted"] for n in honest), "adversaries": len(cheats),
           "adversaries_caught": len(caught), "not_caught": sorted({n["adversary"] for n in cheats} - set(caught))}
    for n in cheats:
        if n["adversary"] == "idle_connections":
            out.update({k: n.get(k) for k in ("held", "idle_rounds", "idle_addresses", "idle_peak_open",
                                              "idle_closed_by_server", "idle_refused_503")})
            out["idle_held"] = out.pop("held")
            for kind, v in (n.get("honest_latency") or {}).items():
                out[f"honest_{kind}_p50_s"] = [v.get("quiet_p50_s"), v.get("during_p50_s")]  # outside, during
                out[f"honest_{kind}_calls"] = [v.get("quiet_n"), v.get("during_n")]
                out[f"honest_{kind}_unserved_during"] = v.get("during_unserved")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, default=None, help="an older checkout to run the slowloris part against too")
    ap.add_argument("--conns", type=int, default=20000, help="idle connections the attacker holds")
    ap.add_argument("--beats", type=int, default=100, help="honest heartbeats timed")
    ap.add_argument("--steps", type=int, default=20, help="trainer steps of the all-adversaries swarm run (slow "
                    "adversaries, like the bomb writer, need a few steps to get their first upload in)")
    ap.add_argument("--skip", action="append", default=[], choices=["bomb", "slowloris", "swarm"])
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    out: dict = {}
    if "bomb" not in a.skip:
        out.update(bomb())
    if "slowloris" not in a.skip:
        out.update(slowloris(a.conns, a.beats, a.base))
    if "swarm" not in a.skip:
        out.update(swarm(a.steps))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
