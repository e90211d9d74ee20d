"""DiLoCo (default config) vs DDP on the same data and budget, over torch.distributed (gloo) and hivemind.

Runs, in one go and on identical batches (worker r at step s sees the same sequences in every run):
  * ddp fp32            gradients all-reduced (gloo) every inner step: the baseline
  * diloco default      ``DilocoConfig()``'s H, wire, outer lr/momentum, overlap (torch.distributed gloo)
  * diloco hivemind     the same over hivemind's DHT averaging (skipped cleanly if hivemind is absent)
  * 1 worker            one worker alone, no communication (W times fewer tokens): what communication
                        buys; ``gap_closed`` = (lone - diloco) / (lone - ddp), 1.0 = as good as DDP
  * before              the previous default (H 25, fp32, outer lr 0.7, momentum 0.9), for before/after
  * overlap             the default with the outer all-reduce overlapped with the next H inner steps
  * W=4                 DDP, DiLoCo and the lone worker again with 4 workers (a lone worker is further
                        from DDP there, so the comparison says more); --no-w4 skips it

Bytes are what one worker hands to the collectives (int8: codes plus chunk scales; hivemind int8: codes
plus its per-part codebooks); the ring/butterfly wire traffic is ~2(W-1)/W times that for every run.
Ends with one JSON line: bytes_ratio and loss_gap (default config, gloo), the hivemind_* figures, the
lone-worker baseline and the settings used.

    python benchmarks/diloco/bench.py [--steps 600] [--workers 2] [--batch-size 4] [-H N] [--wire int8] ...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from swarmrl.diloco import DilocoConfig, run  # noqa: E402
from swarmrl.diloco.comm import hivemind_available  # noqa: E402
from swarmrl.diloco.config import HivemindConfig  # noqa: E402

BEFORE = dict(inner_steps=25, wire="fp32", outer_lr=0.7, outer_momentum=0.9, overlap_steps=0)


def _ratio(base: dict, s: dict) -> float | None:
    return round(base["bytes_sent_per_worker"] / s["bytes_sent_per_worker"], 2) if s["bytes_sent_per_worker"] else None


def _gap(base: dict, s: dict, key: str = "final_eval_loss") -> float | None:
    if base.get(key) is None or s.get(key) is None:
        return None
    return round(s[key] / base[key] - 1.0, 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DilocoConfig()
    ap.add_argument("--steps", type=int, default=600, help="inner steps per worker (same budget for every run)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--inner-lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("-H", "--inner-steps", type=int, default=d.inner_steps, help="default: DilocoConfig's")
    ap.add_argument("--wire", default=d.wire, choices=["fp32", "fp16", "bf16", "int8"])
    ap.add_argument("--outer-lr", type=float, default=d.outer_lr)
    ap.add_argument("--outer-momentum", type=float, default=d.outer_momentum)
    ap.add_argument("--overlap-steps", type=int, default=d.overlap_steps)
    ap.add_argument("--no-hivemind", action="store_true")
    ap.add_argument("--no-extras", action="store_true", help="skip the before / overlap / W=4 runs")
    ap.add_argument("--no-w4", action="store_true")
    ap.add_argument("--out", default="runs/bench_diloco")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    common = dict(workers=args.workers, total_steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                  inner_lr=args.inner_lr, warmup_steps=args.warmup, eval_seqs=64, threads=1, seed=args.seed,
                  timeout_s=3600)
    default = dict(mode="diloco", inner_steps=args.inner_steps, wire=args.wire, outer_lr=args.outer_lr,
                   outer_momentum=args.outer_momentum, overlap_steps=args.overlap_steps)
    runs: list[tuple[str, dict]] = [("ddp fp32", dict(mode="ddp", wire="fp32")), ("diloco default", default)]
    hm_skip = None
    if args.no_hivemind:
        hm_skip = "--no-hivemind"
    elif not hivemind_available():
        hm_skip = "hivemind not installed"
    elif args.wire == "bf16":
        hm_skip = "hivemind has no bf16 wire"
    if hm_skip is None:
        runs.append(("diloco hivemind", {**default, "backend": "hivemind",
                                         "hivemind": HivemindConfig(matchmaking_time=1.0, round_timeout=30.0)}))
    runs.append(("1 worker, no comm", dict(mode="ddp", workers=1)))
    if not args.no_extras:
        runs.append(("before (H25 fp32 mu0.9)", {**default, **BEFORE}))
        runs.append((f"overlap tau={args.inner_steps}", {**default, "overlap_steps": args.inner_steps}))
        if not args.no_w4:
            runs += [("W=4 ddp fp32", dict(mode="ddp", wire="fp32", workers=4)),
                     ("W=4 diloco default", {**default, "workers": 4})]
    results: dict[str, dict] = {}
    for name, kw in runs:
        slug = "".join(c if c.isalnum() else "_" for c in name)
        cfg = DilocoConfig(**{**common, **kw, "out": str(Path(args.out) / slug)})
        t = time.perf_counter()
        s = run(cfg)
        s["bench_wall_s"] = round(time.perf_counter() - t, 1)
        if cfg.backend == "hivemind":
            ws = [json.loads((Path(cfg.out) / f"worker{r}.summary.json").read_text()) for r in range(cfg.workers)]
            s["solo_rounds"] = max(w["solo_rounds"] for w in ws)
        results[name] = s
        print(f"{name:>24}: eval loss {s['final_eval_loss']:.4f} (answers {s['final_answer_loss']:.4f})  bytes/worker {s['bytes_sent_per_worker']:>12,}  "
              f"syncs {s['sync_calls_per_worker']:>4}  identical {s['identical_params']}  "
              f"wall {s['bench_wall_s']:.0f}s (sync {s['sync_s']:.2f}s)", flush=True)

    base, lone = results["ddp fp32"], results["1 worker, no comm"]
    print(f"\nDiLoCo vs DDP, {args.workers} workers x {args.steps} inner steps x {args.batch_size}x{args.seq_len} tokens, "
          f"{base['params']:,} params; default: H={args.inner_steps} wire={args.wire} outer lr {args.outer_lr} "
          f"mu {args.outer_momentum} overlap {args.overlap_steps}")
    print(f"{'run':>24} | {'eval loss':>9} | {'loss / DDP':>10} | {'answer loss':>11} | {'/ DDP':>6} | "
          f"{'bytes/worker':>14} | {'DDP bytes / bytes':>17}")
    for name, s in results.items():
        ref = results["W=4 ddp fp32"] if name.startswith("W=4") else base
        ratio = _ratio(ref, s)
        print(f"{name:>24} | {s['final_eval_loss']:9.4f} | {s['final_eval_loss'] / ref['final_eval_loss']:10.4f} | "
              f"{s['final_answer_loss']:11.4f} | {s['final_answer_loss'] / ref['final_answer_loss']:6.3f} | "
              f"{s['bytes_sent_per_worker']:14,} | {('no comm' if ratio is None else f'{ratio:.1f}'):>17}")

    def gap_closed(ddp: dict, s: dict, key: str = "final_eval_loss") -> float | None:
        span = lone[key] - ddp[key]
        return round((lone[key] - s[key]) / span, 3) if span > 0 else None

    ours = results["diloco default"]
    line: dict = {
        "bytes_ratio": _ratio(base, ours), "loss_gap": _gap(base, ours),
        "ddp_eval_loss": round(base["final_eval_loss"], 5), "diloco_eval_loss": round(ours["final_eval_loss"], 5),
        "lone_worker_loss_gap": _gap(base, lone), "gap_closed": gap_closed(base, ours),
        # loss on the answer tokens only (determined by the prompt; the operands' entropy left out)
        "answer_loss_gap": _gap(base, ours, "final_answer_loss"),
        "lone_worker_answer_loss_gap": _gap(base, lone, "final_answer_loss"),
        "answer_gap_closed": gap_closed(base, ours, "final_answer_loss"),
    }
    hm = results.get("diloco hivemind")
    if hm is not None:
        line.update(hivemind_bytes_ratio=_ratio(base, hm), hivemind_loss_gap=_gap(base, hm),
                    hivemind_gap_closed=gap_closed(base, hm),
                    hivemind_answer_loss_gap=_gap(base, hm, "final_answer_loss"), hivemind_solo_rounds=hm["solo_rounds"])
    else:
        line.update(hivemind_bytes_ratio=None, hivemind_loss_gap=None, hivemind_skipped=hm_skip)
    before = results.get("before (H25 fp32 mu0.9)")
    if before is not None:
        line.update(before_bytes_ratio=_ratio(base, before), before_loss_gap=_gap(base, before),
                    before_answer_loss_gap=_gap(base, before, "final_answer_loss"))
    ov = results.get(f"overlap tau={args.inner_steps}")
    if ov is not None:
        line.update(overlap_bytes_ratio=_ratio(base, ov), overlap_loss_gap=_gap(base, ov),
                    overlap_answer_loss_gap=_gap(base, ov, "final_answer_loss"),
                    overlap_sync_s=ov["sync_s"], default_sync_s=ours["sync_s"])
    if "W=4 ddp fp32" in results:
        b4, o4 = results["W=4 ddp fp32"], results["W=4 diloco default"]
        line.update(w4_bytes_ratio=_ratio(b4, o4), w4_loss_gap=_gap(b4, o4), w4_lone_worker_loss_gap=_gap(b4, lone),
                    w4_gap_closed=gap_closed(b4, o4), w4_answer_loss_gap=_gap(b4, o4, "final_answer_loss"),
                    w4_lone_worker_answer_loss_gap=_gap(b4, lone, "final_answer_loss"),
                    w4_answer_gap_closed=gap_closed(b4, o4, "final_answer_loss"))
    line["settings"] = {**{k: v for k, v in common.items() if k not in ("timeout_s",)},
                        **{k: v for k, v in default.items() if k != "mode"}, "params": base["params"],
                        "int8_chunk": d.int8_chunk, "error_feedback": d.error_feedback}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench.json").write_text(json.dumps({"runs": results, "summary": line}, indent=2, default=str))
    print(json.dumps(line))


if __name__ == "__main__":
    main()
