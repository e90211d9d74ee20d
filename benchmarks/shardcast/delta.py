"""What a policy version costs on the wire (issue 40): full float32, full bfloat16 (the inference weights a node
would sample with), and a delta from the version before (``swarmrl.shardcast.delta`` over the bfloat16 files), with
the share of elements that changed at each step.

    python benchmarks/shardcast/delta.py --config configs/smollm2.toml --minutes 15      # train, then measure
    python benchmarks/shardcast/delta.py --run-dir runs/shardcast-delta                  # measure a kept run

Trains with the config's settings (``swarmrl run --local``: the trainer's updates are the config's; rollouts from
local workers) for ``--minutes``, keeping every version, then reads consecutive versions' float32 files, casts
each to bfloat16 as a publisher would, and encodes each delta; every delta is applied back and checked bit-exact.
Prints one JSON line per version and a summary (totals and the ratio of float32 bytes to delta bytes). The run
directory is deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from swarmrl.utils.procs import child_env

ROOT = Path(__file__).resolve().parents[2]


def bf16_bytes(path: Path) -> bytes:
    import torch  # noqa: PLC0415
    from safetensors.torch import load_file, save  # noqa: PLC0415

    return save({k: v.to(torch.bfloat16) for k, v in load_file(path).items()})


def measure(run_dir: Path) -> dict:
    from swarmrl.shardcast.delta import apply_delta, encode_delta, read_header  # noqa: PLC0415

    versions = sorted(p for p in (run_dir / "policy").glob("v*") if (p / "model.safetensors").is_file())
    rows, prev = [], None
    for v in versions:
        f32 = (v / "model.safetensors").stat().st_size
        cur = bf16_bytes(v / "model.safetensors")
        row = {"version": int(v.name[1:]), "float32_bytes": f32, "bfloat16_bytes": len(cur)}
        if prev is not None:
            t0 = time.perf_counter()
            d = encode_delta(prev, cur)
            row["encode_s"] = round(time.perf_counter() - t0, 2)
            if d is not None:
                t0 = time.perf_counter()
                assert apply_delta(prev, d) == cur, "delta not bit-exact"
                row.update(apply_s=round(time.perf_counter() - t0, 2), delta_bytes=len(d),
                           changed_share=round(read_header(d).share, 5))
        print(json.dumps(row), flush=True)
        rows.append(row)
        prev = cur
    deltas = [r for r in rows if "delta_bytes" in r]
    if not deltas:
        return {"versions": len(rows)}
    f32, d = statistics.mean(r["float32_bytes"] for r in deltas), statistics.mean(r["delta_bytes"] for r in deltas)
    return {"versions": len(rows), "deltas": len(deltas), "float32_mb": round(f32 / 1e6, 1),
            "bfloat16_mb": round(statistics.mean(r["bfloat16_bytes"] for r in deltas) / 1e6, 1),
            "delta_mb_mean": round(d / 1e6, 2), "delta_mb_max": round(max(r["delta_bytes"] for r in deltas) / 1e6, 2),
            "changed_share_mean": round(statistics.mean(r["changed_share"] for r in deltas), 5),
            "changed_share_range": [min(r["changed_share"] for r in deltas), max(r["changed_share"] for r in deltas)],
            "float32_over_delta": round(f32 / d, 1)}


def train(config: str, run_dir: Path, minutes: float) -> None:
    env = child_env({**os.environ, "PYTHONPATH": str(ROOT)})  # the run dies with this benchmark
    sets = [f'rl.run_dir="{run_dir}"', f"rl.max_minutes={minutes}", "rl.steps=100000", "rl.keep_versions=100000",
            "rl.eval.every_steps=0", "final_eval_n=16"]
    subprocess.run([sys.executable, "-m", "swarmrl", "run", "-c", config, "--local",
                    *(a for s in sets for a in ("--set", s))], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/smollm2.toml")
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--run-dir", type=Path, default=None, help="measure this run's versions (no training)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    run_dir = a.run_dir or ROOT / "runs" / "shardcast-delta"
    if a.run_dir is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        t0 = time.monotonic()
        train(a.config, run_dir, a.minutes)
        print(json.dumps({"trained_s": round(time.monotonic() - t0, 1), "config": a.config}), flush=True)
    try:
        print(json.dumps({"summary": measure(run_dir)}), flush=True)
    finally:
        if a.run_dir is None and not a.keep:
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
