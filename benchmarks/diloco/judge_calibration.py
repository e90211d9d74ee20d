"""Calibrate the DiLoCo judge's rules on real honest pseudo-gradients (``swarmrl.diloco.trust.judge``).

In process, at the default ``DilocoConfig()`` (its model, corpus, inner AdamW and schedule, H, outer Nesterov):
``--workers`` ranks run H inner steps from the same anchor each round and upload int8 pseudo-gradients; the
outer step applies the int8-published mean (``swarmrl.diloco.trust.calibration``), for ``--rounds`` rounds. Each
round the judge's statistics are computed for the honest round and for each attack replacing rank 0's
contribution (sign-flipped, scaled x100, random with its norm, stale: its own of 2 rounds ago, replayed: the
previous round's published update), with all ``--workers`` contributions and with 3 (the hostile one and two
honest). Prints per statistic the honest worst and each attack's best (for the attacker), and writes the rows as
JSON (``--out``).

    flock /tmp/swarmrl-bench.lock .venv/bin/python benchmarks/diloco/judge_calibration.py --rounds 12 \
        --out /tmp/judge_calibration.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from swarmrl.diloco.config import DilocoConfig
from swarmrl.diloco.outer import OuterNesterov
from swarmrl.diloco.trust.calibration import ATTACKS, judged_rounds
from swarmrl.diloco.trust.scoring import ScoringModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--config", default="", help="a DilocoConfig JSON file instead of the default")
    ap.add_argument("--steps", type=int, default=0, help="inner steps per round (default: the config's H)")
    args = ap.parse_args()
    cfg = DilocoConfig.model_validate_json(Path(args.config).read_text()) if args.config else DilocoConfig()
    cfg = cfg.model_copy(update={"seed": args.seed})
    torch.set_num_threads(cfg.threads)
    scorer = ScoringModel(cfg)
    rows, t0 = [], time.perf_counter()
    outer = OuterNesterov(scorer.initial(), lr=cfg.outer_lr, momentum=cfg.outer_momentum)
    for r, judged in judged_rounds(cfg, scorer, args.workers, args.rounds, sorted({args.workers, 3}),
                                   score_seed=lambda k: 10_000 + k, steps=args.steps or None):
        for j in judged:
            median_gap = 1.0 - statistics.median(s.history_cosine for s in j.stats)
            for s, v in zip(j.stats, j.verdicts):
                rows.append({"round": r.round, "case": j.case, "n": j.n,
                             "hostile": j.case != "honest" and s.node_id == "rank0", "node": s.node_id,
                             "norm_ratio": s.norm_ratio, "agreement": s.agreement, "agreement_z": s.agreement_z,
                             "loss_change": s.loss_change,
                             "loss_rise": s.loss_rise, "history_cosine": s.history_cosine,
                             "history_kind": s.history_kind,
                             "gap_ratio": (1.0 - s.history_cosine) / median_gap if median_gap > 0 else 1.0,
                             "accepted": v.accepted, "reason": v.reason})
        outer.step(r.update)
        ev = scorer.loss_fn(scorer.eval_batch)(outer.anchor)
        print(f"round {r.round}: held-out loss {ev:.4f} ({time.perf_counter() - t0:.0f}s)", flush=True)
    report(rows)
    if args.out:
        Path(args.out).write_text(json.dumps(rows))


def report(rows: list[dict]) -> None:
    for n in sorted({r["n"] for r in rows}):
        sub = [r for r in rows if r["n"] == n]
        honest = [r for r in sub if not r["hostile"]]
        print(f"\n{n} contributions. honest worst over every round and case ({len(honest)} rows): "
              f"norm_ratio max {max(r['norm_ratio'] for r in honest):.3f}, agreement min "
              f"{min(r['agreement'] for r in honest):.3f} (z {min(r['agreement_z'] for r in honest):.1f}), "
              f"loss_rise max {max(r['loss_rise'] for r in honest):.4f}, "
              f"history_cosine max {max(r['history_cosine'] for r in honest):.4f}, gap ratio min "
              f"{min(r['gap_ratio'] for r in honest if r['history_cosine'] > -1):.3f}; condemned "
              f"{sum(not r['accepted'] for r in honest)}")
        for kind in ATTACKS:
            hs = [r for r in sub if r["hostile"] and r["case"] == kind]
            if hs:
                print(f"  {kind:9s} ({len(hs):2d} rounds) best for it: norm_ratio min "
                      f"{min(r['norm_ratio'] for r in hs):8.3f}, agreement max {max(r['agreement'] for r in hs):6.3f} "
                      f"(z {max(r['agreement_z'] for r in hs):.1f}),"
                      f" loss_rise min {min(r['loss_rise'] for r in hs):8.4f}, history_cosine min "
                      f"{min(r['history_cosine'] for r in hs):6.4f}, gap ratio max {max(r['gap_ratio'] for r in hs):.2e}; caught {sum(not r['accepted'] for r in hs)}/"
                      f"{len(hs)} by {sorted({r['reason'].split(':')[0] for r in hs})}")


if __name__ == "__main__":
    main()
