"""swarmrl against TRL's GRPOTrainer: same model, task, starting weights, machine and wall-time budget, one sitting.

Systems, one after another (never side by side: each gets the whole machine):

- ``trl``: TRL's GRPOTrainer (``benchmarks/rl/trl_grpo.py`` in TRL's own environment, ``scripts/setup-trl.sh``),
  given the config's model, task, group size, completions per step, learning rate, warm-up, new tokens and
  temperature; TRL's defaults for the rest (torch's threads: all cores).
- ``local``: ``swarmrl run --local`` with the config as shipped (trusted workers).
- ``swarm``: ``swarmrl run --swarm`` (orchestrator, nodes with TOPLOC proofs, validator, relay), as shipped.

Each system's clock starts when it is launched (model loading included). At ``--marks`` points of the budget each
run's current policy is snapshotted (TRL saves it at its next step end; ours hardlinks the newest committed version);
after all runs, every snapshot is evaluated by the same code (``swarmrl.eval``, greedy, ``--eval-n`` held-out items
that no run trained on), so the curves differ only in what trained them.

Reported (a table on stderr, one JSON line on stdout, ``<out>/results.json``): each curve; the target = the reference's
held-out accuracy at the end of the budget (TRL's, or the first system's when ``trl`` is not run, e.g. LoRA against
full fine-tuning); each system's time to reach it (linear between snapshots) and its ratio to the budget; each
system's held-out gain at the budget and its ratio to the reference's; standard errors (binomial,
sqrt(p(1-p)/n); a gain's error combines its two ends). With ``--seeds`` every system runs once per seed (seed by
seed, the systems in turn) and a system's curve is its seeds' mean at the snapshot marks and the budget; each seed's
end point is listed too, with the standard error of the mean gain from the seeds' spread (``gain_seed_se``: the
runs' own variance, which the binomial error of the evaluation leaves out).

    python benchmarks/rl/vs_trl.py --config configs/smollm2.toml --minutes 15 \\
        --set 'rl.contract.task.params={digits=2, prompt="What is {expr}? Answer with just the number.", answer="last_number"}' \\
        --set rl.contract.sampling.max_new_tokens=16 --set rl.eval.max_new_tokens=16
    python benchmarks/rl/vs_trl.py --config configs/run.toml --minutes 3 --systems trl,local --seeds 0,1
    python benchmarks/rl/vs_trl.py --config configs/smollm2_lora.toml --minutes 10 \
        --systems 'full=swarm:rl.lora.enabled=false;rl.optim.lr=1e-5,lora=swarm'
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_trl(cfg, marks: list[float], minutes: float, out: Path, python: str, threads: int) -> dict:  # noqa: ANN001
    rl = cfg.rl
    spec = {"model": rl.model, "task": rl.contract.task.model_dump(mode="json"), "group_size": rl.contract.group_size,
            "prompts_per_step": rl.prompts_per_step, "lr": rl.optim.lr, "warmup_steps": rl.optim.warmup_steps,
            "max_new_tokens": rl.contract.sampling.max_new_tokens, "temperature": rl.contract.sampling.temperature,
            "chat_template": rl.contract.chat_template, "seed": rl.seed, "train_items": 50_000,
            "marks_s": marks, "minutes": minutes, "threads": threads}
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    from swarmrl.utils.procs import child_env

    env = child_env({**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"})  # dies with us
    with (out / "trl.log").open("w") as log:
        r = subprocess.run([python, str(REPO / "benchmarks/rl/trl_grpo.py"), "--spec", str(out / "spec.json"),
                            "--out", str(out)], stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"TRL run failed ({r.returncode}); see {out / 'trl.log'}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _link_version(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            os.link(f, dst / f.name)  # the trainer may delete the version next: the hardlink keeps the bytes


def run_ours(system: str, mode: str, config: Path, sets: list[str], marks: list[float], minutes: float,
             out: Path) -> dict:
    from swarmrl.config import load_config
    from swarmrl.job import RunConfig
    from swarmrl.job.launch import launch
    from swarmrl.rundir import RunLayout, read_trainer_log
    from swarmrl.rundir.writer import RunDir

    run_dir = out / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(RunConfig, config, sets + [f'mode="{mode}"', f'rl.run_dir="{run_dir}"',
                                                 f"rl.max_minutes={minutes}", "rl.steps=1000000",
                                                 "rl.eval.every_steps=0", "rl.eval.n=1", "final_eval_n=1",
                                                 "warmstart.enabled=false"])
    rd = RunDir(run_dir)
    t0 = time.monotonic()
    snaps: list[dict] = []
    stop = threading.Event()

    def snap(label: str, mark: float | None) -> None:
        v = rd.latest_version()
        if v is None:
            return
        d = out / f"snap-{label}"
        shutil.rmtree(d, ignore_errors=True)
        try:
            _link_version(rd.version_dir(v), d)
        except FileNotFoundError:  # deleted between reading LATEST and linking: the next one is newer
            shutil.rmtree(d, ignore_errors=True)
            v = rd.latest_version()
            _link_version(rd.version_dir(v), d)
        snaps.append({"mark_s": mark, "wall_s": round(time.monotonic() - t0, 2), "step": v, "dir": str(d)})

    seen: dict[int, float] = {}  # version -> when the watcher first saw it committed

    def watch() -> None:
        todo = list(marks)
        while not stop.wait(0.5):
            v = rd.latest_version()
            if v is not None:
                seen.setdefault(v, round(time.monotonic() - t0, 2))
            while todo and time.monotonic() - t0 >= todo[0]:
                m = todo.pop(0)
                snap(f"{m:g}", m)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    summary = launch(cfg, progress=_say)
    stop.set()
    th.join()
    log = read_trainer_log(RunLayout(run_dir).trainer_metrics)
    end_wall = round(time.monotonic() - t0, 2)
    snap("end", None)
    snaps[-1]["wall_s"] = seen.get(snaps[-1]["step"], end_wall)  # when the last version was committed
    for sub in ("policy", "shardcast", "nodes", "rollouts", "final_model", "validator"):  # the snapshots stay
        shutil.rmtree(run_dir / sub, ignore_errors=True)  # (a SmolLM2 swarm run leaves ~14 GB)
    steps = log.steps
    wait = sum(r.wait_s or 0.0 for r in steps)

    def mean(field: str) -> float | None:
        xs = [getattr(r, field) for r in steps if getattr(r, field) is not None]
        return round(sum(xs) / len(xs), 6) if xs else None
    return {"system": system, "mode": mode, "sets": sets, "steps": len(steps), "wall_s": end_wall, "snapshots": snaps,
            "trainer_wait_frac": round(wait / max(1e-9, steps[-1].wall_s or 0.0), 3) if steps else None,
            "trainer_peak_rss_mb": max((r.peak_rss_mb or 0.0 for r in steps), default=None),
            "mean_lag": summary.get("mean_lag"), "mismatch_kl": mean("mismatch_kl"), "clip_frac": mean("clip_frac")}


def evaluate_dir(cfg, model_dir: str, n: int) -> float:  # noqa: ANN001
    from swarmrl.eval.config import EvalConfig
    from swarmrl.eval.heldout import evaluate_path

    rl = cfg.rl
    return evaluate_path(EvalConfig(model=model_dir, task=rl.contract.task, n=n, max_new_tokens=rl.eval.max_new_tokens,
                                    chat_template=rl.contract.chat_template, threads=2))["accuracy"]


def interpolate(curve: list[tuple[float, float]], t: float) -> float:
    """Accuracy at time ``t`` along (time, accuracy) points, linear between them (the last one beyond)."""
    for (t0, a0), (t1, a1) in zip(curve, curve[1:]):
        if t0 <= t <= t1:
            return a0 if t1 == t0 else a0 + (a1 - a0) * (t - t0) / (t1 - t0)
    return curve[-1][1]


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first time the curve (linear between points) reaches ``target``; None if it never does."""
    if curve[0][1] >= target:
        return curve[0][0]
    for (t0, a0), (t1, a1) in zip(curve, curve[1:]):
        if a1 >= target:
            return t0 + (t1 - t0) * (target - a0) / (a1 - a0)
    return None


def se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/smollm2.toml")
    ap.add_argument("--set", action="append", default=[], help="RunConfig overrides, for every system")
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--marks", type=int, default=5, help="snapshots in the budget (evenly spaced, the end included)")
    ap.add_argument("--systems", default="trl,local,swarm",
                    help="trl, local, swarm, or NAME=MODE:SET;SET (ours with more overrides, e.g. "
                         "local_t2=local:rl.trainer.threads=2)")
    ap.add_argument("--resume", action="store_true", help="keep the runs in <out>/runs.json, run the others")
    ap.add_argument("--eval-n", type=int, default=512)
    ap.add_argument("--trl-python", default=str(REPO / ".venv-trl/bin/python"))
    ap.add_argument("--trl-threads", type=int, default=0, help="torch threads for TRL (0: torch's default)")
    ap.add_argument("--seeds", default="", help="e.g. 0,1: every system once per seed (rl.seed, TRL's seed too); "
                                                "curves, gains and times to target are the seeds' mean")
    ap.add_argument("--out", default="runs/vs_trl")
    a = ap.parse_args()

    from swarmrl.config import load_config
    from swarmrl.job import RunConfig

    cfg = load_config(RunConfig, Path(a.config), a.set)
    budget = a.minutes * 60.0
    marks = [round(budget * k / a.marks, 1) for k in range(1, a.marks)]
    out = Path(a.out)
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else [cfg.rl.seed]
    runs: dict[str, dict] = json.loads((out / "runs.json").read_text()) if a.resume else {}
    specs = {}
    for tok in a.systems.split(","):
        name, _, rest = tok.partition("=")
        mode, _, extra = rest.partition(":")
        specs[name] = (mode or name, [x for x in extra.split(";") if x])
    systems = list(specs)

    def key(s: str, seed: int) -> str:  # a run's name: the system's alone when there is one seed
        return s if len(seeds) == 1 else f"{s}@{seed}"

    for seed in seeds:  # seed by seed, each system in turn: the machine drifts across the sitting, not the systems
        for s, (mode, extra) in specs.items():
            k = key(s, seed)
            if k in runs:
                continue
            sets = a.set + extra + ([f"rl.seed={seed}"] if a.seeds else [])
            _say(f"== {k}: {a.minutes} min")
            runs[k] = (run_trl(load_config(RunConfig, Path(a.config), sets), marks, a.minutes, out / k, a.trl_python,
                               a.trl_threads) if mode == "trl"
                       else run_ours(k, mode, Path(a.config), sets, marks, a.minutes, out / k))
            out.mkdir(parents=True, exist_ok=True)
            (out / "runs.json").write_text(json.dumps(runs, indent=1))
    _say(f"== evaluating every snapshot on {a.eval_n} held-out items")
    acc0 = evaluate_dir(cfg, cfg.rl.model, a.eval_n)
    seed_curves: dict[str, list[list[tuple[float, float]]]] = {}
    for s in systems:
        seed_curves[s] = []
        for seed in seeds:
            r = runs[key(s, seed)]
            c = [(0.0, acc0)]
            for sn in r["snapshots"]:
                sn["accuracy"] = evaluate_dir(cfg, sn["dir"], a.eval_n)
                c.append((sn["wall_s"], sn["accuracy"]))
                _say(f"{key(s, seed)} t={sn['wall_s']:.0f}s step {sn['step']}: {sn['accuracy']:.3f}")
            seed_curves[s].append(c)
    grid = [0.0, *marks, budget]  # several seeds: their mean, at the marks and the budget
    curves = {s: cs[0] if len(cs) == 1 else [(t, sum(interpolate(c, t) for c in cs) / len(cs)) for t in grid]
              for s, cs in seed_curves.items()}
    n, k_seeds = a.eval_n, len(seeds)
    ref = "trl" if "trl" in systems else systems[0]  # the reference: its accuracy at the budget is the target
    target = interpolate(curves[ref], budget)
    res: dict = {"config": a.config, "sets": a.set, "minutes": a.minutes, "eval_n": n, "seeds": seeds,
                 "initial": acc0, "initial_se": round(se(acc0, n), 4), "reference": ref, "target": round(target, 4)}
    for s in systems:
        at = interpolate(curves[s], budget)
        ends = [interpolate(c, budget) for c in seed_curves[s]]
        at_se = math.sqrt(sum(se(x, n) ** 2 for x in ends)) / k_seeds  # binomial, of the mean over the seeds
        tt = time_to(curves[s], target)
        rs = [runs[key(s, seed)] for seed in seeds]
        res[s] = {"curve": [(round(t, 1), round(acc, 4)) for t, acc in curves[s]], "at_budget": round(at, 4),
                  "at_budget_se": round(at_se, 4), "gain": round(at - acc0, 4),
                  "gain_se": round(math.hypot(at_se, se(acc0, n)), 4),
                  "time_to_target_s": round(tt, 1) if tt is not None else None,
                  "time_to_target_over_budget": round(tt / budget, 3) if tt is not None else None,
                  **{k: v for k, v in rs[0].items() if k not in ("snapshots", "system", "dir")}}  # several
        # seeds: the run fields (peak RSS, waiting) are the first seed's, the steps their mean (below)
        if k_seeds > 1:  # the seeds' spread: a standard error of the mean gain that counts the runs' variance
            res[s]["gain_seed_se"] = round(statistics.stdev(ends) / math.sqrt(k_seeds), 4)
            res[s]["steps"] = round(sum(r["steps"] for r in rs) / k_seeds, 1)
            res[s]["per_seed"] = [{"seed": seed, "steps": r["steps"], "at_budget": round(e, 4),
                                   "gain": round(e - acc0, 4)} for seed, r, e in zip(seeds, rs, ends)]
    for s in systems:
        if s != ref:
            g = res[ref]["gain"]
            res[s][f"gain_over_{ref}"] = round(res[s]["gain"] / g, 3) if g > 0 else None
    (out / "results.json").write_text(json.dumps(res, indent=1))
    _say(f"\ntarget ({ref} at {a.minutes:g} min): {target:.3f}; start {acc0:.3f} +- {se(acc0, n):.3f} (n = {n})")
    _say(f"{'':>6} {'steps':>6} {'at budget':>14} {'gain':>14} {'time to target':>15} {'x budget':>9}")
    for s in systems:
        r = res[s]
        tt = r["time_to_target_s"]
        _say(f"{s:>6} {r['steps']:>6} {r['at_budget']:>8.3f}+-{r['at_budget_se']:.3f} {r['gain']:>+8.3f}+-{r['gain_se']:.3f}"
             f" {('%.0f s' % tt) if tt is not None else 'not reached':>15} {r['time_to_target_over_budget'] or '':>9}"
             + (f"  seeds: gains {', '.join('%+.3f' % x['gain'] for x in r['per_seed'])}, "
                f"their standard error {r['gain_seed_se']:.3f}" if "per_seed" in r else ""))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
