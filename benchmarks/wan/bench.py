"""The swarm over emulated network links (``swarmrl.wan``): first what each profile's links really give, then
the main job (``swarmrl run -c configs/run.toml``) under each profile with a loopback baseline in the same
sitting.

    python benchmarks/wan/bench.py --lock /tmp/swarmrl-bench.lock                     # every profile, 300 steps
    python benchmarks/wan/bench.py --profiles loopback wan100 --steps 100 -- --set ...  # fewer
    python benchmarks/wan/bench.py --links-only                                       # the link check alone
    python benchmarks/wan/bench.py --profiles loopback wan20lossy \
        --variant waits:swarm.hold_policy=false --variant holds:                        # before/after, one sitting

Needs root (network namespaces). Prints one JSON line per profile's link check (``links``: round trip from a
node to the orchestrator, TCP throughput both ways over one connection, measured between the namespaces through
the core), then one JSON line per run: steps per hour, trainer idle fraction, mean policy lag, bytes per version
(a node's SHARDCAST download), a download's seconds, time for a version to reach every node (from the trainer's
commit to the last node's download of it, over versions every node fetched), held-out accuracy at the end and at
equal wall time (the last periodic evaluation at or before the shortest run's wall time), validated
submissions, and the share of assignments a node answered with a version it held instead of the assigned one
(``swarm.hold_policy``). Each run's directory is ``runs/wan/<config name>-<profile>[-<variant>]``; the warm start is
the config's (made by the first run if missing, reused after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from swarmrl.utils.metrics import read_metrics
from swarmrl.utils.procs import child_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "job"))
from mainjob import held  # noqa: E402  # the benchmark lock, as the main job's benchmark takes it

PROFILES = ["loopback", "datacenter", "wan100", "wan20lossy", "mixed"]


def link_check(profile: str, nbytes: int) -> dict:
    from swarmrl.wan import measure  # noqa: PLC0415
    from swarmrl.wan.harness import Harness  # noqa: PLC0415

    roles = ["orchestrator", "n0", "n1"] if profile == "mixed" else ["orchestrator", "n0"]
    out: dict = {"links": profile}
    with Harness.for_profile(profile, roles) as h:
        for node in roles[1:]:
            out[node] = {"link": h.links[node].describe(),
                         "rtt_ms": round(measure.rtt_ms(h, node, "orchestrator", n=20)["median"], 2),
                         "down_mbit_s": round(measure.throughput_mbit(h, "orchestrator", node, nbytes)["mbit_s"], 1),
                         "up_mbit_s": round(measure.throughput_mbit(h, node, "orchestrator", nbytes)["mbit_s"], 1)}
    return out


def parse_variant(spec: str) -> tuple[str, list[str]]:
    """``NAME:SET;SET...`` (``--set`` overrides of ``swarmrl run``; none after the colon: the config as it is)."""
    name, sep, sets = spec.partition(":")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"--variant {spec!r}: use NAME:KEY=VALUE[;KEY=VALUE...]")
    return name, [x for x in sets.split(";") if x]


def one_run(profile: str, steps: int | None, extra: list[str], timeout_s: float, config: str = "configs/run.toml",
            variant: tuple[str, list[str]] = ("", [])) -> Path:
    name = f"{Path(config).stem}-{profile}" + (f"-{variant[0]}" if variant[0] else "")
    run_dir = ROOT / "runs" / "wan" / name
    sets = [f'rl.run_dir="{run_dir}"'] + ([f"rl.steps={steps}"] if steps else []) + variant[1]
    if profile != "loopback":
        sets.append(f'wan.profile="{profile}"')
    argv = [sys.executable, "-m", "swarmrl", "run", "-c", config, *(a for s in sets for a in ("--set", s)),
            *extra]
    env = child_env({**os.environ, "PYTHONPATH": str(ROOT)})  # the run (and its roles) die with this benchmark
    p = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"{profile}: swarmrl run exited {p.returncode}: {p.stderr[-2000:]}")
    return run_dir


def figures(profile: str, run_dir: Path) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    nodes = {n: v for n, v in (s.get("swarm") or {}).get("nodes", {}).items() if not v.get("adversary")}
    records = {v["node_id"]: read_metrics(run_dir / "metrics" / f"node-{v['node_id']}.jsonl") for v in nodes.values()}
    fetches = {n: [r for r in rs if r.get("event") == "fetch"] for n, rs in records.items()}
    rows = [r for rs in fetches.values() for r in rs]
    done = [r for rs in records.values() for r in rs if r.get("event") == "assignment" and "sampled_version" in r]
    committed = {r["version"]: r["time"] for r in read_metrics(run_dir / "metrics" / "trainer.jsonl")
                 if "reward" in r and "version" in r and "time" in r}
    everywhere = set.intersection(*({r["version"] for r in rs} for rs in fetches.values())) if fetches else set()
    reach = [max(r["time"] for rs in fetches.values() for r in rs if r["version"] == v) - committed[v]
             for v in sorted(everywhere) if v in committed]
    med = lambda xs: round(statistics.median(xs), 3) if xs else None  # noqa: E731
    trainer_rows = [r for r in read_metrics(run_dir / "metrics" / "trainer.jsonl") if r.get("mismatch_kl") is not None]
    pub_log = run_dir / "shardcast" / "published.jsonl"
    published = [json.loads(ln) for ln in pub_log.read_text().splitlines()] if pub_log.is_file() else []
    deltas = [p for p in published if p["kind"] == "delta"]
    return {"profile": profile, "steps": s["steps"], "wall_s": s["wall_s"],
            "steps_per_hour": round(s["steps"] / s["wall_s"] * 3600, 1), "trainer_idle": s.get("trainer_wait_frac"),
            "policy_lag": s.get("mean_lag"), "bytes_per_version": med([r["bytes"] for r in rows]),
            "download_s": med([r["fetch_s"] for r in rows]), "downloads": len(rows),
            "reach_every_node_s": med(reach), "reach_every_node_max_s": round(max(reach), 3) if reach else None,
            "versions_everywhere": len(reach),
            "sampled_held": round(sum(r["sampled_version"] != r["policy_version"] for r in done) / len(done), 3)
            if done else None, "acc_initial": s["heldout_acc_initial"],
            "acc_final": s["heldout_acc_final"], "heldout_n": s["heldout_n"], "curve": s.get("curve", []),
            "accepted": sum(v.get("accepted", 0) for v in nodes.values()),
            "rejected": sum(v.get("rejected", 0) for v in nodes.values()),
            "mismatch_kl_mean": round(statistics.fmean(r["mismatch_kl"] for r in trainer_rows), 6)
            if trainer_rows else None,
            "published": {"keyframes": len(published) - len(deltas), "deltas": len(deltas),
                          "delta_bytes_mean": round(statistics.fmean(p["bytes"] for p in deltas)) if deltas else None,
                          "changed_share_mean": round(statistics.fmean(p["changed_share"] for p in deltas), 5)
                          if deltas else None} if published else None}


def at_equal_wall(rows: list[dict]) -> None:
    """Each row's held-out accuracy at the shortest run's wall time (its last periodic evaluation by then)."""
    t = min(r["wall_s"] for r in rows)
    for r in rows:
        before = [e for e in r["curve"] if e["wall_s"] <= t + 1e-6 and e.get("heldout_acc") is not None]
        r["equal_wall_s"] = t
        r["acc_at_equal_wall"] = before[-1]["heldout_acc"] if before else None
        r["version_at_equal_wall"] = before[-1]["version"] if before else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", nargs="+", default=PROFILES, help="loopback = no harness (the baseline)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the config's)")
    ap.add_argument("--link-bytes", type=int, default=16 << 20, help="bytes per throughput transfer")
    ap.add_argument("--links-only", action="store_true")
    ap.add_argument("--config", default="configs/run.toml", help="the swarm run's config (e.g. configs/smollm2.toml)")
    ap.add_argument("--variant", type=parse_variant, action="append", default=None,
                    help="NAME:SET;SET... run every profile once per variant with these --set overrides")
    ap.add_argument("--timeout-s", type=float, default=2400.0)
    ap.add_argument("--lock", type=Path, default=None, help="flock this file for the whole sitting")
    ap.add_argument("extra", nargs="*", help="arguments after -- go to swarmrl run")
    a = ap.parse_args()
    with held(a.lock):
        for prof in a.profiles:
            if prof != "loopback":
                print(json.dumps(link_check(prof, a.link_bytes)), flush=True)
        if a.links_only:
            return
        rows = []
        for prof in a.profiles:
            for var in a.variant or [("", [])]:
                t0 = time.monotonic()
                row = figures(prof, one_run(prof, a.steps, a.extra, a.timeout_s, a.config, var))
                row.update(variant=var[0], config=a.config, process_s=round(time.monotonic() - t0, 1))
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)
    at_equal_wall(rows)
    for r in rows:
        print(json.dumps({"profile": r["profile"], "variant": r["variant"], "equal_wall_s": r["equal_wall_s"],
                          "acc_at_equal_wall": r["acc_at_equal_wall"], "version": r["version_at_equal_wall"]}))


if __name__ == "__main__":
    main()
