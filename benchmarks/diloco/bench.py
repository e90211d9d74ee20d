"""DiLoCo vs DDP on the same data and budget (W workers on loopback, torch.distributed gloo).

Runs, in one go and on identical batches (worker r at step s sees the same sequences in every run):
  * ddp fp32         gradients all-reduced every inner step (the baseline)
  * diloco fp32      H inner AdamW steps, then pseudo-gradients all-reduced, outer Nesterov step
  * diloco fp16      the same with the all-reduce in fp16
  * 1 worker         optional (--local): one worker, same steps and batch, W times fewer tokens (what
                     communication buys: DiLoCo should land well below it)

and prints final held-out eval loss, bytes handed to all_reduce per worker, and ratios against DDP.
OpenDiLoCo claims to check: ~H times less communication, loss close to DDP, no loss from fp16.

    python benchmarks/diloco/bench.py [--steps 600] [-H 25] [--batch-size 4] [--outer-momentum 0.9,0.5] [--local]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from swarmrl.diloco import DilocoConfig, run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600, help="inner steps per worker (same budget for every run)")
    ap.add_argument("-H", "--inner-steps", default="25",
                    help="H, or several comma-separated (fp16 is run for the first one)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--inner-lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--outer-momentum", default="0.9,0.5",
                    help="outer Nesterov momentum, or several comma-separated (fp32 and fp16 runs for each)")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--local", action="store_true", help="also run workers without any communication")
    ap.add_argument("--out", default="runs/bench_diloco")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    hs = [int(h) for h in str(args.inner_steps).split(",") if h.strip()]
    common = dict(workers=args.workers, total_steps=args.steps, inner_steps=hs[0],
                  batch_size=args.batch_size, seq_len=args.seq_len, inner_lr=args.inner_lr,
                  warmup_steps=args.warmup, eval_seqs=64, threads=1, seed=args.seed, timeout_s=3600)
    moms = [float(m) for m in str(args.outer_momentum).split(",") if m.strip()]
    runs: list[tuple[str, dict]] = [("ddp fp32", dict(mode="ddp", wire="fp32"))]
    for i, m in enumerate(moms):
        tag = "" if i == 0 else f" mu={m}"
        runs += [(f"diloco fp32{tag}", dict(mode="diloco", wire="fp32", outer_lr=args.outer_lr, outer_momentum=m)),
                 (f"diloco fp16{tag}", dict(mode="diloco", wire="fp16", outer_lr=args.outer_lr, outer_momentum=m))]
    runs += [(f"diloco H={h} fp32", dict(mode="diloco", wire="fp32", inner_steps=h, outer_lr=args.outer_lr,
                                         outer_momentum=moms[0])) for h in hs[1:]]
    if args.local:
        # one worker with the same per-worker batch and steps: W times fewer tokens, no communication
        runs.append(("1 worker, no comm", dict(mode="ddp", workers=1)))
    results = {}
    for name, kw in runs:
        slug = name.replace(" ", "_").replace(",", "").replace("=", "").replace(".", "")
        cfg = DilocoConfig(**{**common, **kw, "out": str(Path(args.out) / slug)})
        t = time.perf_counter()
        s = run(cfg)
        s["bench_wall_s"] = round(time.perf_counter() - t, 1)
        results[name] = s
        print(f"{name:>20}: eval loss {s['final_eval_loss']:.4f}  bytes/worker {s['bytes_sent_per_worker']:>12,}  "
              f"syncs {s['sync_calls_per_worker']:>4}  identical {s['identical_params']}  "
              f"train {s['train_s']:.0f}s (sync {s['sync_s']:.1f}s)", flush=True)

    base = results["ddp fp32"]
    print(f"\nDiLoCo vs DDP, {args.workers} workers x {args.steps} inner steps x {args.batch_size}x{args.seq_len} tokens, "
          f"H={hs[0]}, {base['params']:,} params")
    print(f"{'run':>20} | {'eval loss':>9} | {'loss / DDP':>10} | {'bytes/worker':>14} | {'DDP bytes / bytes':>17}")
    for name, s in results.items():
        if s["bytes_sent_per_worker"] == 0:
            print(f"{name:>20} | {s['final_eval_loss']:9.4f} | {s['final_eval_loss'] / base['final_eval_loss']:10.4f} | "
                  f"{0:14,} | {'no comm':>17}")
            continue
        ratio = base["bytes_sent_per_worker"] / s["bytes_sent_per_worker"] if s["bytes_sent_per_worker"] else float("inf")
        print(f"{name:>20} | {s['final_eval_loss']:9.4f} | {s['final_eval_loss'] / base['final_eval_loss']:10.4f} | "
              f"{s['bytes_sent_per_worker']:14,} | {ratio:17.1f}")
    for i, m in enumerate(moms):
        tag = "" if i == 0 else f" mu={m}"
        f32, f16 = results[f"diloco fp32{tag}"], results[f"diloco fp16{tag}"]
        print(f"outer lr {args.outer_lr} mu {m}: fp16 vs fp32 all-reduce: eval loss {f16['final_eval_loss']:.4f} vs "
              f"{f32['final_eval_loss']:.4f} (ratio {f16['final_eval_loss'] / f32['final_eval_loss']:.4f}), "
              f"{f32['bytes_sent_per_worker'] / f16['bytes_sent_per_worker']:.1f}x fewer bytes")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
