"""Every loss x staleness x off-policy correction, at equal wall time: which objective learns most, whether stale
policies hurt, and whether correcting against the inference logprobs repairs them (AReaL's table is the model).

Each cell is ``swarmrl run --<mode>`` with the config as given plus ``rl.loss.kind``, ``rl.contract.async_level``,
``rl.loss.correction`` and ``rl.seed``, for ``--minutes`` of trainer time from the config's starting weights. Runs go
one after another (each gets the whole machine); each one's last committed policy is evaluated right after it by the
same code (``swarmrl.eval``, greedy, ``--eval-n`` held-out items no run trained on), then deleted. The start is
evaluated once. Reported per cell: the mean held-out gain over the seeds, its standard error (binomial: the mean of
the k end accuracies, sqrt(sum_i se_i^2) / k, combined with the start's), the seeds' values (their spread shows
the run-to-run noise), steps, the trainer's mean policy lag.

    python benchmarks/rl/losses.py                       # main job's task, every loss x {0,2,8} x {none,tis} x 2 seeds
    python benchmarks/rl/losses.py --config configs/smollm2.toml --async-levels 2 --corrections none --seeds 0 \\
        --minutes 5 --set ...                             # one row per loss at the default async level and correction

Results: a table on stderr, ``<out>/results.json`` and one JSON line on stdout. ``--resume`` keeps finished cells.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import evaluate_dir, run_ours, se  # noqa: E402  (the same run and evaluation code as the TRL benchmark)

from swarmrl.rl.losses.registry import loss_names  # noqa: E402  (loads no torch)

LOSSES = ",".join(loss_names())  # every registered loss (swarmrl/rl/losses/kinds/), in name order


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cell_name(loss: str, level: int, corr: str, seed: int) -> str:
    return f"{loss}-a{level}-{corr}-s{seed}"


def summarise(cells: dict[str, dict], acc0: float, n: int, losses: list[str], levels: list[int],
              corrs: list[str], seeds: list[int]) -> list[dict]:
    """One row per (loss, async level, correction): mean gain over the seeds with its standard error."""
    rows = []
    for loss, level, corr in itertools.product(losses, levels, corrs):
        runs = [cells[cell_name(loss, level, corr, s)] for s in seeds if cell_name(loss, level, corr, s) in cells]
        if not runs:
            continue
        gains = [r["accuracy"] - acc0 for r in runs]
        k = len(runs)
        err = math.sqrt(sum(se(r["accuracy"], n) ** 2 for r in runs) / k ** 2 + se(acc0, n) ** 2)
        rows.append({"loss": loss, "async_level": level, "correction": corr, "seeds": k,
                     "gain": round(sum(gains) / k, 4), "gain_se": round(err, 4),
                     "gains": [round(g, 4) for g in gains], "steps": [r["steps"] for r in runs],
                     "mean_lag": [r.get("mean_lag") for r in runs], "mismatch_kl": [r.get("mismatch_kl") for r in runs],
                     "clip_frac": [r.get("clip_frac") for r in runs],
                     "accuracy": round(sum(r["accuracy"] for r in runs) / k, 4)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/run.toml")
    ap.add_argument("--mode", default="local", choices=["local", "swarm"])
    ap.add_argument("--set", action="append", default=[], help="RunConfig overrides, for every cell")
    ap.add_argument("--minutes", type=float, default=1.0, help="trainer wall time per cell")
    ap.add_argument("--losses", default=LOSSES)
    ap.add_argument("--async-levels", default="0,2,8")
    ap.add_argument("--corrections", default="none,tis")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--eval-n", type=int, default=512)
    ap.add_argument("--resume", action="store_true", help="keep the cells in <out>/cells.json, run the others")
    ap.add_argument("--out", default="runs/losses")
    a = ap.parse_args()

    from swarmrl.config import load_config
    from swarmrl.job import RunConfig

    cfg = load_config(RunConfig, Path(a.config), a.set)
    losses = a.losses.split(",")
    levels = [int(x) for x in a.async_levels.split(",")]
    corrs = a.corrections.split(",")
    seeds = [int(x) for x in a.seeds.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cells: dict[str, dict] = json.loads((out / "cells.json").read_text()) if a.resume else {}
    n = a.eval_n
    if "initial" not in cells:
        cells["initial"] = {"accuracy": evaluate_dir(cfg, cfg.rl.model, n)}
    acc0 = cells["initial"]["accuracy"]
    _say(f"start {acc0:.3f} +- {se(acc0, n):.3f} (n = {n})")
    # seeds innermost but outermost in the order: a slow drift of the machine spreads over every cell alike
    order = [(loss, level, corr, s) for s in seeds for loss, level, corr in itertools.product(losses, levels, corrs)]
    for i, (loss, level, corr, s) in enumerate(order):
        name = cell_name(loss, level, corr, s)
        if name in cells:
            continue
        _say(f"== [{i + 1}/{len(order)}] {name}: {a.minutes:g} min")
        keep = max(cfg.rl.keep_versions, level + 1)
        sets = a.set + [f'rl.loss.kind="{loss}"', f"rl.contract.async_level={level}", f'rl.loss.correction="{corr}"',
                        f"rl.seed={s}", f"rl.keep_versions={keep}"]
        r = run_ours(name, a.mode, Path(a.config), sets, [], a.minutes, out / name)
        end = r["snapshots"][-1]
        r["accuracy"] = evaluate_dir(cfg, end["dir"], n)
        r["end_step"] = end["step"]
        del r["snapshots"]
        shutil.rmtree(out / name, ignore_errors=True)
        cells[name] = r
        (out / "cells.json").write_text(json.dumps(cells, indent=1))
        _say(f"   {r['steps']} steps, lag {r.get('mean_lag')}, held-out {r['accuracy']:.3f} "
             f"(gain {r['accuracy'] - acc0:+.3f})")
    rows = summarise(cells, acc0, n, losses, levels, corrs, seeds)
    res = {"config": a.config, "mode": a.mode, "sets": a.set, "minutes": a.minutes, "eval_n": n, "initial": acc0,
           "initial_se": round(se(acc0, n), 4), "rows": rows}
    (out / "results.json").write_text(json.dumps(res, indent=1))
    _say(f"\n{'loss':>8} {'async':>5} {'corr':>5} {'gain':>16} {'seeds':>16} {'steps':>10} {'lag':>12}")
    for r in rows:
        lag = "/".join(f"{x:.1f}" if x is not None else "-" for x in r["mean_lag"])
        _say(f"{r['loss']:>8} {r['async_level']:>5} {r['correction']:>5} {r['gain']:>+9.3f}+-{r['gain_se']:.3f} "
             f"{'/'.join(f'{g:+.3f}' for g in r['gains']):>16} {'/'.join(map(str, r['steps'])):>10} {lag:>12}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
