"""DiLoCo and DDP across continents: each worker in a network namespace of its own behind an emulated link
(``swarmrl.diloco.wan.run_wan``), at ``DilocoConfig()``'s method and scenario unless a flag says otherwise.

Per profile (``datacenter``: 1 Gbit/s; ``wan100``: 100 Mbit/s, +50 ms; ``wan20lossy``: 20 Mbit/s, +150 ms, 0.5%
loss each way; two workers talk through both of their links), in this order:

  * diloco torch          ``DilocoConfig()`` over torch.distributed (gloo): ``overlap_steps = "auto"`` times the
                          first round's all-reduce and overlaps the later ones with the next inner steps if the
                          link calls for it (the tau it chose is in the row). Its training loop's wall time is the
                          profile's budget B
  * diloco torch blocking the same with ``overlap_steps = 0``: classic DiLoCo, every outer round waits
  * ddp                   gradients all-reduced (gloo, fp32) every step, time-limited to B (``max_wall_s``: it
                          stops at the first step after which one more step would end past B), or its
                          total_steps if those take less
  * diloco hivemind       the default DiLoCo over hivemind's DHT averaging (``overlap_steps = "auto"``)
  * diloco hivemind blocking   the same with ``overlap_steps = 0``
  * diloco torch overlap  the outer all-reduce overlapped with the next ``--overlap`` inner steps from the first
                          round (a fixed ``overlap_steps``; the worker moves to the new anchor plus its progress
                          meanwhile); not in the default set

Figures per run (rank 0 unless said):
  * ``util``: compute utilization = time in inner steps (forward, backward, clipping, AdamW; a DDP step's
    all-reduce excluded) over the training loop's wall time (first inner step, or the step-0 evaluation, to the
    end of the last outer round) less the time spent evaluating held-out loss and writing metrics; rank 0 is the
    worker that evaluates over torch.distributed (the others wait for its evaluation at the next collective, so
    their figure is lower by that: ``util_min`` is the lowest worker's);
  * ``loop_s``: that wall time, evaluation included (``--evals`` held-out evaluations a run, 4 by default);
    ``steps``: inner steps done;
  * ``bytes``/``tcp``: per worker (the most any worker sent), handed to the averaging and counted by the kernel on
    its TCP connections during training (``swarmrl.diloco.traffic``);
  * ``loss``: held-out loss at the end; ``loss_at_B``: the last held-out evaluation at or before B (the loss
    every run had at equal wall time); the whole curve (step, wall time, loss) is in the JSON line.

    python benchmarks/diloco/wan.py --lock /tmp/swarmrl-bench.lock [--profiles datacenter wan100 wan20lossy]
        [--runs torch ddp torch-blocking hivemind hivemind-blocking torch-overlap] [--overlap TAU] [--json FILE]

(``--lock``: the benchmark lock is taken for each run, not for the sitting, so other measurements interleave; the
DDP run's budget is the blocking run's loop time, a ratio within the sitting.)

Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks" / "job")]

from mainjob import held  # noqa: E402  # the benchmark lock, per run, as the main job's benchmark takes it

from swarmrl.diloco.config import DilocoConfig  # noqa: E402
from swarmrl.diloco.wan import run_wan  # noqa: E402

PROFILES = ["datacenter", "wan100", "wan20lossy"]
RUNS = {"torch": ("diloco torch", {}), "ddp": ("ddp", {"mode": "ddp"}),
        "torch-blocking": ("diloco torch blocking", {"overlap_steps": 0}),
        "hivemind": ("diloco hivemind", {"backend": "hivemind"}),
        "hivemind-blocking": ("diloco hivemind blocking", {"backend": "hivemind", "overlap_steps": 0}),
        "torch-overlap": ("diloco torch overlap", {"overlap": True}),
        "hivemind-overlap": ("diloco hivemind overlap", {"backend": "hivemind", "overlap": True})}
DEFAULT_RUNS = ["torch", "ddp", "torch-blocking", "hivemind", "hivemind-blocking"]


def config(key: str, args: argparse.Namespace, profile: str, budget: float | None) -> DilocoConfig:
    kw = dict(RUNS[key][1])
    if kw.pop("overlap", False):
        kw["overlap_steps"] = args.overlap
    if args.steps is not None:
        kw["total_steps"] = args.steps
    if args.workers is not None:
        kw["workers"] = args.workers
    if args.evals:  # evaluation is a scenario field, not the method: a few points on the curve, not one per round,
        # at multiples of H (round ends, unless "auto" lengthened the rounds: then rank 0's model within a round)
        d = DilocoConfig()
        h = d.inner_steps
        kw["eval_every"] = max(h, kw.get("total_steps", d.total_steps) // args.evals // h * h)
    if kw.get("mode") == "ddp" and budget is not None:
        kw["max_wall_s"] = budget
    return DilocoConfig(**kw, out=str(Path(args.out) / profile / key), timeout_s=args.timeout_s)


def loss_at(evals: list[dict], t: float) -> float | None:
    """The last held-out evaluation at or before wall time ``t`` of the training loop."""
    before = [e for e in evals if e.get("wall_s") is not None and e["wall_s"] <= t + 1e-6]
    return before[-1]["eval_loss"] if before else None


def row(name: str, s: dict) -> dict:
    return {"run": name, "util": s["utilization"], "util_min": min(s["utilization_per_worker"]),
            "loop_s": s["loop_s"], "steps": s["steps_done"], "rounds": s["sync_calls_per_worker"],
            "inner_ms_per_step": round(1000 * s["inner_s"] / max(1, s["steps_done"]), 1),
            "bytes": s["bytes_sent_per_worker"], "tcp": s["tcp_bytes_sent_per_worker"],
            "tcp_setup": s["tcp_setup_bytes_sent_per_worker"], "loss": round(s["final_eval_loss"], 4),
            "sync_s": s["sync_s"], "eval_s": s["eval_s"], "solo_rounds": s["solo_rounds"],
            "stopped_at_budget": s["stopped_at_max_wall"], "tcp_peers": s["tcp_peers"],
            "rtt_ms": (s["wan"]["rtt_ms_w1_w0"] or {}).get("median"), "process_wall_s": s["wall_s"],
            "overlap_steps": s.get("overlap_steps_per_worker"),
            "curve": [(e["step"], e.get("wall_s"), round(e["eval_loss"], 4)) for e in s["evals"]]}


def bench_profile(profile: str, args: argparse.Namespace) -> list[dict]:
    rows, budget = [], None
    keys = sorted(args.runs, key=lambda k: k != "torch")  # the default gloo run first: it sets the budget
    for key in keys:
        if key == "ddp" and budget is None:
            raise SystemExit("ddp needs the 'torch' run first (its wall time is the budget)")
        with held(args.lock):
            t0 = time.monotonic()
            s = run_wan(config(key, args, profile, budget), profile, seed=args.seed)
        r = row(RUNS[key][0], s)
        r.update(profile=profile, bench_s=round(time.monotonic() - t0, 1))
        if key == "torch":
            budget = s["loop_s"]
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "curve"}), flush=True)
    for r in rows:
        r["budget_s"] = budget
        r["loss_at_B"] = loss_at([{"step": c[0], "wall_s": c[1], "eval_loss": c[2]} for c in r["curve"]], budget)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| profile | run | util (lowest worker) | loop wall | steps | bytes/worker | TCP bytes/worker | "
             "held-out loss | loss at B |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        at_b = f"{r['loss_at_B']:.4f}" if r["loss_at_B"] is not None else "-"
        lines.append(f"| {r['profile']} | {r['run']} | {100 * r['util']:.1f}% ({100 * r['util_min']:.1f}%) | "
                     f"{r['loop_s']:.1f} s | {r['steps']} | {r['bytes']:,} | {r['tcp']:,} | {r['loss']:.4f} | "
                     f"{at_b} (B = {r['budget_s']:.1f} s) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", nargs="+", default=PROFILES, choices=PROFILES)
    ap.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, choices=list(RUNS))
    ap.add_argument("--overlap", type=int, default=None, help="overlap_steps of the overlapped runs (default: H)")
    ap.add_argument("--steps", type=int, default=None, help="total_steps (default: the config's)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--evals", type=int, default=4,
                    help="held-out evaluations per run (eval_every = total_steps / this, down to a multiple of "
                         "H; 0: the config's, one a round). "
                         "Rank 0 evaluates while the others wait at the next collective: at the default's 256 "
                         "windows, one evaluation a round (H = 32) took a fifth of an 800-step loop on wan20lossy")
    ap.add_argument("--seed", type=int, default=0, help="the links' loss seed")
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    ap.add_argument("--out", default="runs/diloco-wan")
    ap.add_argument("--json", type=Path, default=None, help="also write every row (curves included) here")
    ap.add_argument("--lock", type=Path, default=None, help="flock this file around each run")
    args = ap.parse_args()
    if args.evals < 0:
        ap.error(f"--evals must be >= 0 (0: one evaluation a round), got {args.evals}")
    if args.overlap is None:
        args.overlap = DilocoConfig().inner_steps
    d = DilocoConfig()
    print(json.dumps({"settings": {k: getattr(d, k) for k in ("total_steps", "workers", "batch_size", "seq_len",
                                                              "inner_steps", "wire", "overlap_steps", "data")},
                      "init": d.init.model_dump(), "overlap": args.overlap}), flush=True)
    rows: list[dict] = []
    for p in args.profiles:  # in the order given: a sitting cut short keeps the profiles done
        rows += bench_profile(p, args)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        print(table(rows), flush=True)


if __name__ == "__main__":
    main()
