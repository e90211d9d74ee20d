"""Generation throughput: our sampler (``ours`` backend) against HF ``model.generate``, and vLLM when importable.

    python benchmarks/inference/bench.py [--model /work/models/smollm2] [--prompts 16] [--new-tokens 64]
                                         [--reps 3] [--threads 1] [--no-tiny]

Models: a tiny Qwen2 made on the fly (``swarmrl.models.tiny``; head size 64 so vLLM's CPU attention takes it
too) unless ``--no-tiny``, and each ``--model`` directory. Every engine gets the same prompts (left-padded text
of varying lengths), greedy decoding and exactly ``--new-tokens`` new tokens per prompt (no EOS stop: ours and
vLLM run with no EOS id, HF with ``min_new_tokens``), one torch thread (vLLM: its OpenMP threads bound to CPU 0,
``omp_threads_bind="0"``, which pins this process to CPU 0, so all engines then share that core), one untimed
warm-up call each, then ``--reps`` rounds timing each engine once per round (median per engine). vLLM runs only
where ``import vllm`` works (its own environment, see docs/inference.md); its engine start-up is not timed.

Prints ONE JSON line: per model the tokens/s of each engine (new tokens / wall seconds), ``ours_over_hf``
(and ``vllm_over_hf``), how many completions are token-for-token HF's up to their first EOS (``same_as_hf_*``;
greedy, so a numerics check; past an EOS HF's ``min_new_tokens`` makes them part), and
the 1-minute load average before and after (noise indicator: the machine is shared).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from swarmrl.inference import SamplingParams
from swarmrl.inference.backend import OursBackend
from swarmrl.models import ModelInitConfig, init_model, load_model, load_tokenizer

TINY = ModelInitConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024)


def _prompts(tok, n: int) -> list[list[int]]:
    return [list(tok.encode(f"Question {i}: what is {17 * i + 3} plus {5 * i * i + 11}?" + " Think." * (i % 5)
                            + " Answer:", add_special_tokens=False)) for i in range(n)]


def _same(ours: list[list[int]], ref: list[list[int]], eos: int) -> int:
    """Completions equal to the reference up to their first EOS (HF's ``min_new_tokens`` masks EOS, so past it the
    two legitimately part)."""
    n = 0
    for a, b in zip(ours, ref):
        k = a.index(eos) if eos in a else len(a)
        n += a[:k] == b[:k]
    return n


def _alternate(fns: dict, reps: int) -> tuple[dict, dict]:
    """One untimed warm-up call each, then ``reps`` rounds timing every engine once per round (load that comes and
    goes on the shared machine hits all alike); the median time and the last output of each."""
    outs = {k: fn() for k, fn in fns.items()}
    ts: dict = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.perf_counter()
            outs[k] = fn()
            ts[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in ts.items()}, outs


def _hf(model, prompts: list[list[int]], pad_id: int, new: int) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, use_cache=True, pad_token_id=pad_id)
    return out[:, width:].tolist()


def bench_model(path: Path, name: str, a: argparse.Namespace) -> dict:
    model, tok = load_model(path), load_tokenizer(path)
    prompts = _prompts(tok, a.prompts)
    greedy = SamplingParams(max_new_tokens=a.new_tokens, temperature=0.0)
    total = a.prompts * a.new_tokens
    ours = OursBackend(model, eos_id=-1, pad_id=tok.pad_token_id)
    fns = {"ours": lambda: ours.generate(prompts, greedy).completion_ids,
           "hf": lambda: _hf(model, prompts, tok.pad_token_id, a.new_tokens)}
    vb = None
    if a.vllm:
        from swarmrl.inference.config import VLLMOptions
        from swarmrl.inference.vllm_backend import VLLMBackend

        vb = VLLMBackend(path, VLLMOptions(omp_threads_bind="0"), eos_id=-1, pad_id=tok.pad_token_id)
        fns["vllm"] = lambda: vb.generate(prompts, greedy).completion_ids
    try:
        t, outs = _alternate(fns, a.reps)
    finally:
        if vb is not None:
            vb.close()
    assert all(len(c) == a.new_tokens for out in outs.values() for c in out)
    row = {"params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
           "prompt_tokens": sum(len(p) for p in prompts), "ours_tok_s": round(total / t["ours"], 1),
           "hf_tok_s": round(total / t["hf"], 1), "ours_over_hf": round(t["hf"] / t["ours"], 2),
           "same_as_hf_ours": _same(outs["ours"], outs["hf"], tok.eos_token_id)}
    if vb is not None:
        row.update(vllm_tok_s=round(total / t["vllm"], 1), vllm_over_hf=round(t["hf"] / t["vllm"], 2),
                   same_as_hf_vllm=_same(outs["vllm"], outs["hf"], tok.eos_token_id))
    return {name: row}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", default=[], help="HF model dir (repeatable)")
    ap.add_argument("--no-tiny", action="store_true")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    a.vllm = importlib.util.find_spec("vllm") is not None
    torch.set_num_threads(a.threads)
    load_before = os.getloadavg()[0]
    res: dict = {"bench": "inference", "prompts": a.prompts, "new_tokens": a.new_tokens, "decoding": "greedy",
                 "threads": a.threads, "reps": a.reps, "torch": torch.__version__, "vllm": a.vllm}
    with tempfile.TemporaryDirectory() as tmp:
        if not a.no_tiny:
            init_model(TINY, Path(tmp) / "tiny")
            res.update(bench_model(Path(tmp) / "tiny", "tiny", a))
        for m in a.model:
            res.update(bench_model(Path(m), Path(m).name, a))
    res["load1_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
