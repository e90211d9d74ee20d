"""Swarm mode vs local mode of the async GRPO loop, same model, task and settings.

The local run (trainer + N file-based workers) is the baseline measured in the same invocation; the
swarm run adds the orchestrator, signed uploads, the validator (schema/seed/tasks/policy/rewards,
logprob spot check, TOPLOC proofs) and the adapter, with N honest nodes (plus optional adversaries).
Reports held-out accuracy before/after, steps, wall time, accepted/rejected submissions and the
wall-time overhead ratio.

    python benchmarks/swarm/bench.py --model /tmp/sft5/model --steps 15 [--adversary forge_rewards ...]
    python benchmarks/swarm/bench.py --config configs/run.toml --model runs/warmstart/model --steps 100
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from swarmrl.config import load_config
from swarmrl.job import RunConfig
from swarmrl.job.launch import launch


def one(mode: str, model: Path, out: Path, a: argparse.Namespace) -> dict:
    sets = [f'mode="{mode}"', f'rl.model="{model}"', f'rl.run_dir="{out / mode}"', f"rl.steps={a.steps}",
            f"rl.workers.num={a.workers}", f"swarm.nodes={a.workers}", f"swarm.adversaries={json.dumps(a.adversary)}",
            "warmstart.enabled=false", f"final_eval_n={a.eval_n}", f"rl.eval.n={a.eval_n}", *a.set]
    cfg = load_config(RunConfig, a.config, sets)
    print(f"--- {mode} run", file=sys.stderr)
    s = launch(cfg, progress=lambda m: print(m, file=sys.stderr))
    row = {"mode": mode, "steps": s["steps"], "wall_s": s["wall_s"], "acc_initial": s["heldout_acc_initial"],
           "acc_final": s["heldout_acc_final"], "trainer_wait_frac": s["trainer_wait_frac"], "mean_lag": s["mean_lag"]}
    if mode == "swarm":
        row.update(s["swarm"]["totals"])
        row["nodes"] = {k: {x: v[x] for x in ("adversary", "status", "accepted", "rejected", "refused_uploads")}
                        for k, v in s["swarm"]["nodes"].items()}
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/tmp/sft5/model", help="warm-started model (copied, not modified)")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--workers", type=int, default=2, help="local workers = honest swarm nodes")
    ap.add_argument("--eval-n", type=int, default=512)
    ap.add_argument("--adversary", action="append", default=[])
    ap.add_argument("--out", default="runs/bench_swarm")
    ap.add_argument("--set", action="append", default=[], help="extra RunConfig overrides")
    ap.add_argument("--config", default=None, help="base RunConfig TOML (e.g. configs/run.toml; default: built-in)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = out / "model"
    if model.exists():
        shutil.rmtree(model)
    shutil.copytree(a.model, model)
    res = [one("local", model, out, a), one("swarm", model, out, a)]
    (out / "results.json").write_text(json.dumps(res, indent=2))
    print(f"\n{'mode':>6} {'steps':>5} {'wall s':>7} {'acc before':>10} {'acc after':>9} {'wait':>6} {'lag':>5} "
          f"{'accepted':>8} {'rejected':>8} {'slashed':>7}")
    for r in res:
        print(f"{r['mode']:>6} {r['steps']:>5} {r['wall_s']:>7.1f} {r['acc_initial']:>10.3f} {r['acc_final']:>9.3f} "
              f"{100 * r['trainer_wait_frac']:>5.0f}% {r['mean_lag']:>5.2f} {r.get('accepted', '-'):>8} "
              f"{r.get('rejected', '-'):>8} {r.get('slashed_nodes', '-'):>7}")
    loc, sw = res
    print(f"\nswarm/local wall time for {a.steps} steps: {sw['wall_s'] / max(1e-9, loc['wall_s']):.2f}x; "
          f"per step {sw['wall_s'] / max(1, sw['steps']):.1f}s vs {loc['wall_s'] / max(1, loc['steps']):.1f}s")


if __name__ == "__main__":
    main()
