"""DiLoCo trusting no one: one of W workers hostile, judged by the aggregator and with plain averaging beside it.

Every run is ``DilocoConfig()`` (the method and the scenario, unchanged unless a flag below says otherwise) with
``backend = "swarm"`` (``swarmrl.diloco.trust``): a real orchestrator, the aggregator and W worker processes on
loopback, each worker a protocol member (key, deposited stake) uploading signed int8 pseudo-gradients. Runs:

  * honest          every worker honest, judged (the reference: ratio 1.0)
  * ATTACK judged   rank W-1 hostile (``TrustConfig.adversary``), the aggregator judging: the hostile worker should
                    be slashed and ejected, no honest one, and the held-out loss stay within 2% of honest
  * ATTACK mean     the same attack against plain averaging (``aggregate = "mean"``: every well-formed upload
                    averaged, nobody judged): the damage the judge prevents

for ATTACK in sign_flip, scale (x ``--scale``), random, stale, replay (``swarmrl.attacks.diloco``). Per run: the
held-out loss (``final_eval_loss`` of the lowest-ranked worker that finished; every honest worker holds the same
parameters), its ratio to honest, the workers slashed and ejected (rank, node id prefix, the round the aggregator
first rejected it, the stake slashed, from the orchestrator's ledger), the bytes each worker handed to HTTP
(upload bodies; the most any worker sent) and the wall time. A JSON line per run and a Markdown table at the end
(``--md FILE`` writes it).

    flock /tmp/swarmrl-bench.lock .venv/bin/python benchmarks/diloco/attacks.py [--steps N] [--kinds a,b] ...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from swarmrl.attacks.diloco import HOSTILE_ENTRY  # noqa: E402
from swarmrl.diloco.config import DilocoConfig, TrustConfig  # noqa: E402
from swarmrl.diloco.launch import run  # noqa: E402
from swarmrl.utils.metrics import read_metrics  # noqa: E402

KINDS = ("sign_flip", "scale", "random", "stale", "replay")


def _cfg(args: argparse.Namespace, slug: str, **trust) -> DilocoConfig:
    scenario: dict = {"workers": args.workers, "seed": args.seed, "timeout_s": args.timeout}
    if args.steps is not None:
        scenario["total_steps"] = args.steps
    if args.corpus_bytes is not None:
        scenario["corpus"] = {"max_bytes": args.corpus_bytes}
    return DilocoConfig.model_validate({**scenario, "backend": "swarm", "out": str(Path(args.out) / slug),
                                        "trust": TrustConfig(**trust).model_dump()})


def _margins(out: str) -> dict:
    """The judge's statistics over the run (the aggregator's log of every round): the accepted contributions' worst
    against each rule (agreement and its z, loss rise, norm ratio, history cosine) and the rejected ones' best
    agreement z; None where nothing was accepted or rejected, or the rule was not scored (plain mean)."""
    acc, rej = [], []
    for r in read_metrics(Path(out) / "aggregator.rounds.jsonl"):
        for st in r.get("stats", []):
            (acc if st["node_id"] in r["accepted"] else rej).append(st)

    def pick(rows: list[dict], key: str, f) -> float | None:  # noqa: ANN001
        vals = [st[key] for st in rows if st.get(key) is not None]
        return round(f(vals), 4) if vals else None

    return {"accepted_min_agreement": pick(acc, "agreement", min),
            "accepted_min_agreement_z": pick(acc, "agreement_z", min),
            "accepted_max_loss_rise": pick(acc, "loss_rise", max),
            "accepted_max_norm_ratio": pick(acc, "norm_ratio", max),
            "accepted_max_history_cosine": pick(acc, "history_cosine", max),
            "rejected_max_agreement_z": pick(rej, "agreement_z", max)}


def _row(name: str, kind: str, aggregate: str, s: dict, honest_loss: float | None) -> dict:
    bad = [m for m in s["members"] if m["slashed"] > 0 or m["status"] == "ejected"]
    return {
        "run": name, "adversary": kind, "aggregate": aggregate, "final_eval_loss": round(s["final_eval_loss"], 5),
        "ratio": round(s["final_eval_loss"] / honest_loss, 4) if honest_loss else 1.0,
        "slashed": [{"rank": m["rank"], "node": m["node_id"][:8], "first_rejected_round": m["first_rejected_round"],
                     "slashed": m["slashed"], "status": m["status"], "adversary": m["adversary"]} for m in bad],
        "honest_slashed": [m["rank"] for m in bad if m["adversary"] == "none"],
        "hostile_caught": any(m["adversary"] != "none" and m["status"] == "ejected" and m["slashed"] > 0
                              for m in s["members"]),
        "bytes_per_worker": s["bytes_sent_per_worker"], "rounds": s["sync_calls_per_worker"],
        "honest_identical_params": s["honest_identical_params"], "wall_s": s["wall_s"], **_margins(s["out"]),
    }


def _md(rows: list[dict]) -> str:
    out = ["| run | aggregate | held-out loss | ratio to honest | slashed / ejected (rank: first rejected round, "
           "stake slashed) | honest slashed | bytes / worker | wall s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        who = ", ".join(f"rank {b['rank']} ({b['node']}, {b['adversary']}): round {b['first_rejected_round']}, "
                        f"{b['slashed']:g} slashed, {b['status']}" for b in r["slashed"]) or "none"
        out.append(f"| {r['run']} | {r['aggregate']} | {r['final_eval_loss']:.4f} | {r['ratio']:.4f} | {who} | "
                   f"{', '.join(map(str, r['honest_slashed'])) or 'none'} | {r['bytes_per_worker']:,} | "
                   f"{r['wall_s']:.0f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_diloco_attacks")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--kinds", default=",".join(KINDS), help="attacks to run (comma-separated)")
    ap.add_argument("--scale", type=float, default=100.0, help="the scale attack's factor")
    ap.add_argument("--steps", type=int, default=None, help="total_steps (default: DilocoConfig()'s)")
    ap.add_argument("--corpus-bytes", type=int, default=None, help="corpus.max_bytes (default: DilocoConfig()'s)")
    ap.add_argument("--no-mean", action="store_true", help="skip the plain-averaging runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0, help="per-run limit (s)")
    ap.add_argument("--md", default="", help="also write the Markdown table here")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"unknown attack {k!r}; choose from {', '.join(KINDS)}")
    hostile = [args.workers - 1]
    rows: list[dict] = []
    t0 = time.perf_counter()
    honest = run(_cfg(args, "honest"))
    ref = honest["final_eval_loss"]
    rows.append(_row("honest", "none", "judged", honest, ref))
    print(json.dumps(rows[-1]), flush=True)
    for kind in kinds:
        extra = {"adversary_scale": args.scale} if kind == "scale" else {}
        for aggregate in ("judged",) + (() if args.no_mean else ("mean",)):
            s = run(_cfg(args, f"{kind}_{aggregate}", adversary=kind, adversary_ranks=hostile, aggregate=aggregate,
                         **extra), hostile_entry=HOSTILE_ENTRY)
            rows.append(_row(f"{kind}" + (f" x{args.scale:g}" if kind == "scale" else ""), kind, aggregate, s, ref))
            print(json.dumps(rows[-1]), flush=True)
    table = _md(rows)
    print(table)
    judged = [r for r in rows if r["aggregate"] == "judged" and r["adversary"] != "none"]
    verdict = {
        "all_within_2pct": all(r["ratio"] <= 1.02 for r in judged),
        "all_hostile_caught": all(r["hostile_caught"] for r in judged),
        "no_honest_slashed": not any(r["honest_slashed"] for r in rows),
        "total_wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(verdict))
    (Path(args.out)).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "attacks.json").write_text(json.dumps({"rows": rows, "verdict": verdict}, indent=2))
    if args.md:
        Path(args.md).write_text(table + "\n")


if __name__ == "__main__":
    main()
