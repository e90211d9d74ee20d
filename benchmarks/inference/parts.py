"""Two parts of the sampler's static-cache decoder, each against its baseline in the same run (docs/inference.md).

    python benchmarks/inference/parts.py [--model runs/warmstart/model] [--reps 15] [--threads 1]
                                         [--copy-model models/smollm2]

1. ``shared_prefill``: one batch of a worker (16 tasks x 8 rows of two-digit addition, T = 1, 6 new tokens: the
   main job's ``configs/run.toml``) through ``swarmrl.inference.sampler.generate`` with each distinct prompt
   prefilled once (the default) against ``share_prompts=False`` (every row prefilled, the code before), the same
   per-row seeds so both sample the same tokens (checked). Model: ``--model`` (a fresh tiny model of the main
   job's shape, ``ModelInitConfig()``, when absent).
2. ``lm_head``: one projection of the decoder (``static_decoder._Proj``) of SmolLM2-135M's LM head shape,
   [rows, 576] x [576, 49152] (random fp32 weights), for ``--rows`` rows: the weight copied into oneDNN's blocked
   layout (what the decoder uses from 16M parameters), a transposed copy with ``torch.mm`` (smaller models), and
   ``F.linear`` on the module's weight (HF's forward, the baseline).
3. ``weight_copy`` (with ``--copy-model DIR``): the memory the decoder's one-time weight copies take for that
   model: the bytes of the copies, and the process's resident size before and after ``StaticDecoder.for_model``
   (model loaded and its weights paged in, fp32), against the size of the model's parameters.

Variants alternate call by call (load that comes and goes hits all alike); medians. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from swarmrl.inference import SamplingParams
from swarmrl.inference.prompts import encode_prompt
from swarmrl.inference.sampler import generate
from swarmrl.inference.static_decoder import _Proj
from swarmrl.models import ModelInitConfig, init_model, load_model, load_tokenizer


def alternate(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds of each, one untimed warm-up call each, then ``reps`` rounds calling every one once."""
    for fn in fns.values():
        fn()
    ts: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in ts.items()}


def shared_prefill(model_dir: Path, reps: int, tasks: int, group: int) -> dict:
    from swarmrl.envs import make_env

    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    env = make_env("add", digits=2)
    prompts = [encode_prompt(tok, t.prompt) for t in env.sample(1, tasks) for _ in range(group)]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)

    def run(share: bool) -> list[list[int]]:
        gens = [torch.Generator().manual_seed(i) for i in range(len(prompts))]
        return generate(model, prompts, params, tok.eos_token_id, tok.pad_token_id, generators=gens,
                        share_prompts=share).completion_ids

    same = run(True) == run(False)
    t = alternate({"shared": lambda: run(True), "every_row": lambda: run(False)}, reps)
    return {"rows": len(prompts), "distinct_prompts": tasks, "prompt_tokens": sum(map(len, prompts)),
            "shared_ms": round(1e3 * t["shared"], 1), "every_row_ms": round(1e3 * t["every_row"], 1),
            "every_row_over_shared": round(t["every_row"] / t["shared"], 2), "same_tokens": same}


def lm_head(rows: list[int], reps: int, hidden: int = 576, vocab: int = 49152) -> dict:
    torch.manual_seed(0)
    lin = torch.nn.Linear(hidden, vocab, bias=False)
    onednn, mm = _Proj([lin], onednn=True), _Proj([lin], onednn=False)
    out = {}
    with torch.inference_mode():
        for n in rows:
            x = torch.randn(n, hidden)
            torch.testing.assert_close(onednn(x), F.linear(x, lin.weight), atol=1e-3, rtol=1e-4)
            t = alternate({"onednn": lambda: onednn(x), "mm": lambda: mm(x),
                           "f_linear": lambda: F.linear(x, lin.weight)}, reps)
            out[str(n)] = {"onednn_ms": round(1e3 * t["onednn"], 2), "mm_ms": round(1e3 * t["mm"], 2),
                           "f_linear_ms": round(1e3 * t["f_linear"], 2),
                           "f_linear_over_onednn": round(t["f_linear"] / t["onednn"], 2)}
    return {"shape": f"[rows, {hidden}] x [{hidden}, {vocab}]", "by_rows": out}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def weight_copy(model_dir: Path) -> dict:
    from swarmrl.inference.static_decoder import StaticDecoder

    model = load_model(model_dir)
    params = 0.0
    with torch.inference_mode():
        for p in model.parameters():  # page in the weights (the loader may map the file): only the copies count below
            params += p.numel() * p.element_size() + 0.0 * float(p.sum())
    before = rss_bytes()
    dec = StaticDecoder.for_model(model)
    added = rss_bytes() - before
    projs = [dec.head] + [p for ly in dec.layers for p in (ly.qkv, ly.o, ly.gate_up, ly.down)]
    copies = sum(p.w.numel() * p.w.element_size() for p in projs)
    return {"model": str(model_dir), "params_mb": round(params / 1e6, 1), "copies_mb": round(copies / 1e6, 1),
            "rss_added_mb": round(added / 1e6, 1), "onednn": dec.head.onednn}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="runs/warmstart/model", help="HF model dir (a fresh tiny model if absent)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--rows", default="16,8,13", help="LM-head rows, comma-separated")
    ap.add_argument("--copy-model", default="", help="HF model dir whose decoder weight copies are measured")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load_before = os.getloadavg()[0]
    res: dict = {"bench": "inference_parts", "threads": a.threads, "reps": a.reps, "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(a.model)
        if not (model_dir / "config.json").is_file():
            model_dir = Path(tmp) / "tiny"
            init_model(ModelInitConfig(seed=0), model_dir)
        res["model"] = str(a.model) if model_dir == Path(a.model) else "fresh tiny (ModelInitConfig())"
        res["shared_prefill"] = shared_prefill(model_dir, a.reps, a.tasks, a.group)
    res["lm_head"] = lm_head([int(r) for r in a.rows.split(",")], a.reps)
    if a.copy_model:
        res["weight_copy"] = weight_copy(Path(a.copy_model))
    res["load1_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
