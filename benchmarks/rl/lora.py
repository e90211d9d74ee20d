"""LoRA policies (``rl.lora``): what a version weighs on the wire and how long it takes to reach a worker, full
weights against a rank-16 adapter, and (``--run``) a short local run of each.

Sizes: the full version is what the trainer commits and publishes (``save_pretrained`` of the float32 policy);
the LoRA version is the adapter file the trainer writes for the same model (rank 16, alpha 32, the attention and
MLP projections, float32). Transfer: one SHARDCAST origin and one relay in this process (the trainer's shard size,
1 MB), each version published at the origin and fetched from the relay by a client (signed manifest, BLAKE3 per
shard); the time from publish to a verified file on the client's disk, median over ``--versions``.

``--run``: ``swarmrl run --local`` on the main config (warm start included) for ``--minutes`` of trainer time,
once with full fine-tuning and once with ``rl.lora.enabled`` (its own learning rate, ``--lora-lr``): steps, wall
time, held-out accuracy at start and end, published bytes per version.

    python benchmarks/rl/lora.py --model models/smollm2 [--run --minutes 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from swarmrl.models import ModelInitConfig, init_model, load_model, load_tokenizer
from swarmrl.rl.config import LoraSection
from swarmrl.rl.lora import LoraPolicy
from swarmrl.shardcast import FetchOptions, Origin, fetch
from swarmrl.shardcast.server.relay import Relay


def version_files(model_dir: Path, out: Path) -> dict[str, Path]:
    """The full version and the rank-16 LoRA version of ``model_dir``, written as the trainer writes them."""
    full, lora = out / "full", out / "lora"
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    model.save_pretrained(full, safe_serialization=True)
    policy = LoraPolicy.wrap(load_model(model_dir), LoraSection(enabled=True))
    lora.mkdir(parents=True)
    policy.save(lora, tok)
    return {"full": full / "model.safetensors", "lora": lora / "adapter_model.safetensors"}


VARIANTS = {"r16_attention": {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}, "r8": {"rank": 8, "alpha": 16}}


def variant_bytes(model_dir: Path, out: Path) -> dict[str, int]:
    """Adapter bytes of other settings (sizes only): rank 16 on attention alone, rank 8 on every projection."""
    res = {}
    tok = load_tokenizer(model_dir)
    for name, kw in VARIANTS.items():
        d = out / name
        d.mkdir(parents=True)
        LoraPolicy.wrap(load_model(model_dir), LoraSection(enabled=True, **kw)).save(d, tok)
        res[f"bytes_lora_{name}"] = (d / "adapter_model.safetensors").stat().st_size
    return res


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def transfer_times(files: dict[str, Path], work: Path, versions: int) -> dict[str, float]:
    """Median seconds from publishing a version at the origin to a verified copy fetched through one relay."""
    origin = Origin(work / "origin", key=work / "origin.key", keep=3, shard_size=1_000_000, fsync=False)
    origin.serve()
    port = _free_port()
    relay = Relay(work / "relay", [origin.url], origin.public_key, keep=3)
    loop = asyncio.new_event_loop()
    th = threading.Thread(target=loop.run_until_complete, args=(relay.run_forever(port=port),), daemon=True)
    th.start()
    url = f"http://127.0.0.1:{port}"
    out: dict[str, float] = {}
    v = 0
    try:
        time.sleep(0.5)
        for kind, path in files.items():
            times = []
            for _ in range(versions):
                v += 1
                t0 = time.perf_counter()
                origin.publish_sync(path, version=v)
                fetch([url], work / f"got-{v}.bin", origin.public_key, version=v, options=FetchOptions(wait_s=120))
                times.append(time.perf_counter() - t0)
                (work / f"got-{v}.bin").unlink()
            out[kind] = round(statistics.median(times), 4)
    finally:
        origin.close()
    return out


def sizes(model_dir: Path, versions: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        files = version_files(model_dir, Path(tmp))
        b = {k: p.stat().st_size for k, p in files.items()}
        t = transfer_times(files, Path(tmp) / "sc", versions)
        more = variant_bytes(model_dir, Path(tmp) / "variants")
    return {"model": str(model_dir), "bytes_full": b["full"], "bytes_lora_r16": b["lora"], **more,
            "bytes_ratio": round(b["full"] / b["lora"], 1), "publish_fetch_s_full": t["full"],
            "publish_fetch_s_lora": t["lora"], "time_ratio": round(t["full"] / max(t["lora"], 1e-9), 1)}


def local_run(name: str, out: Path, minutes: float, extra: list[str]) -> dict:
    from swarmrl.config import load_config  # noqa: PLC0415
    from swarmrl.job import RunConfig  # noqa: PLC0415
    from swarmrl.job.launch import launch  # noqa: PLC0415
    from swarmrl.rundir import RunLayout, read_trainer_log  # noqa: PLC0415

    run_dir = out / name
    cfg = load_config(RunConfig, "configs/run.toml", ['mode="local"', f'rl.run_dir="{run_dir}"', "rl.steps=100000",
                                                      f"rl.max_minutes={minutes}", "rl.eval.every_steps=0", *extra])
    t0 = time.monotonic()
    summary = launch(cfg, progress=lambda m: print(m, file=sys.stderr))
    log = read_trainer_log(RunLayout(run_dir).trainer_metrics)
    pub = sorted(RunLayout(run_dir).policy.glob("v*/*.safetensors"))
    return {"run": name, "steps": len(log.steps), "wall_s": round(time.monotonic() - t0, 1),
            "trainer_s": round(max((r.wall_s or 0.0 for r in log.steps), default=0.0), 1),
            "heldout_initial": summary["heldout_acc_initial"], "heldout_final": summary["heldout_acc_final"],
            "heldout_n": summary["heldout_n"], "version_bytes": pub[-1].stat().st_size if pub else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/smollm2", help="HF dir of a real model (SmolLM2-135M-Instruct)")
    ap.add_argument("--versions", type=int, default=3, help="versions sent per kind for the transfer median")
    ap.add_argument("--run", action="store_true", help="also run the main config locally, full vs LoRA")
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--lora-lr", type=float, default=2e-3)
    ap.add_argument("--out", default="runs/bench_lora")
    ap.add_argument("--set", action="append", default=[], help="extra RunConfig overrides for --run")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / "tiny"
        init_model(ModelInitConfig(), tiny)  # the main job's model shape (what `swarmrl model init` makes)
        print(json.dumps({"tiny": sizes(tiny, a.versions)}), flush=True)
    if Path(a.model).is_dir():
        print(json.dumps({"real": sizes(Path(a.model), a.versions)}), flush=True)
    if a.run:
        out = Path(a.out)
        for name, extra in (("full", []), ("lora", ["rl.lora.enabled=true", f"rl.optim.lr={a.lora_lr}"])):
            print(json.dumps(local_run(name, out, a.minutes, [*a.set, *extra])), flush=True)


if __name__ == "__main__":
    main()
