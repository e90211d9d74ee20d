"""Async (async_level = 2) vs synchronous (async_level = 0) GRPO on the same wall-clock budget.

Both runs start from the same warm-started model, with the same workers, task and settings; only
the async level differs. Reports, for each: time to reach a target held-out accuracy, held-out
accuracy at the end of the budget, trainer steps done, and the fraction of wall time the trainer
waited for data. The sync run is the baseline measured in the same invocation.

    python benchmarks/rl/bench.py --minutes 3 --target-gain 0.10
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swarmrl.config import load_config
from swarmrl.job import RunConfig
from swarmrl.job.launch import launch
from swarmrl.rundir import RunLayout, read_trainer_log


def one(base: list[str], async_level: int, run_dir: Path, minutes: float) -> dict:
    cfg = load_config(RunConfig, Path("configs/run.toml") if Path("configs/run.toml").is_file() else None,
                      base + [f"rl.contract.async_level={async_level}", f'rl.run_dir="{run_dir}"', f"rl.max_minutes={minutes}",
                              "rl.steps=100000", "rl.eval.every_steps=5"])
    summary = launch(cfg, progress=lambda m: print(m, file=sys.stderr))
    log = read_trainer_log(RunLayout(run_dir).trainer_metrics)
    evals = [(e.wall_s or 0.0, e.heldout_acc) for e in log.evals]
    steps = log.steps
    return {"async_level": async_level, "steps": len(steps), "evals": evals,
            "wait_frac": sum(r.wait_s or 0.0 for r in steps) / max(1e-9, steps[-1].wall_s or 0.0) if steps else None,
            "final_acc": summary["heldout_acc_final"], "initial_acc": summary["heldout_acc_initial"],
            "mean_lag": summary["mean_lag"]}


def time_to(evals: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, a in evals if a >= target), None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--target-gain", type=float, default=0.10, help="target = initial accuracy + this")
    ap.add_argument("--out", default="runs/bench_rl")
    ap.add_argument("--set", action="append", default=[], help="extra RunConfig overrides")
    a = ap.parse_args()
    out = Path(a.out)
    res = {k: one(a.set, k, out / f"async{k}", a.minutes) for k in (0, 2)}
    init = res[0]["initial_acc"]
    target = init + a.target_gain
    print(f"\nsame budget: {a.minutes} min of trainer wall time, target held-out accuracy {target:.3f}")
    print(f"{'':>10} {'steps':>6} {'trainer wait':>13} {'mean lag':>9} {'final acc':>10} {'time to target':>15}")
    for k, r in res.items():
        tt = time_to(r["evals"], target)
        r["time_to_target_s"] = tt
        print(f"{'async=' + str(k):>10} {r['steps']:>6} {100 * r['wait_frac']:>12.1f}% {r['mean_lag']:>9.2f} "
              f"{r['final_acc']:>10.3f} {('%.0f s' % tt) if tt else 'not reached':>15}")
    s, y = res[0], res[2]
    print(f"\nratios async/sync: steps {y['steps'] / max(1, s['steps']):.2f}x, trainer wait fraction "
          f"{y['wait_frac'] / max(1e-9, s['wait_frac']):.2f}x"
          + (f", time to target {y['time_to_target_s'] / s['time_to_target_s']:.2f}x"
             if y.get("time_to_target_s") and s.get("time_to_target_s") else ""))
    (out / "bench.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
