"""What publishing bfloat16 inference weights costs in inference/trainer mismatch (issue 40), precision alone.

    python benchmarks/rl/mismatch.py --model models/smollm2 --prompts 64 --group 8

A node samples with the published weights of a version and reports their logprobs; the trainer computes its own with
its float32 master weights. Without staleness (the same version on both sides) the difference is the precision of
what is published. For each setting the same prompts (two-digit sums asked as ``configs/smollm2.toml`` asks them, in
the chat template) are sampled with the node's sampler (``swarmrl.inference.sampler.generate``, temperature 1.0, 16
new tokens, one seeded stream per row) using the published weights, and each sampled token is scored by the float32
masters with a plain forward (the trainer's path). Printed: the mean over tokens of the k3 estimate of
KL(pi_infer || pi_train) (``mismatch_kl`` in the trainer's metrics), its standard error over completions, and
the largest per-token |log-ratio|.

- ``float32``: the published weights are the masters (before issue 40): only the two code paths differ;
- ``bfloat16``: the published weights are the masters cast to bfloat16 (``swarmrl.models.io.save_inference_weights``,
  the default since), held in float32 by the node as it does.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics

import torch

from swarmrl.inference.sampler import SamplingParams, generate
from swarmrl.models.io import load_model, load_tokenizer


def _prompts(tok, n: int, seed: int) -> list[list[int]]:  # noqa: ANN001
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        msg = [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]
        text = tok.apply_chat_template(msg, add_generation_prompt=True, tokenize=False)
        out.append(tok.encode(text, add_special_tokens=False))
    return out


@torch.no_grad()
def _score(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1:-1].float(), dim=-1)
    return logp[torch.arange(len(completion)), torch.tensor(completion)].tolist()


def measure(master: torch.nn.Module, published: torch.nn.Module, tok, prompts: list[list[int]], group: int,  # noqa: ANN001
            seed: int) -> dict:
    rows = [p for p in prompts for _ in range(group)]
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(rows))]
    out = generate(published, rows, SamplingParams(max_new_tokens=16, temperature=1.0), eos_id=tok.eos_token_id,
                   pad_id=tok.pad_token_id, generators=gens)
    per_completion, worst, tokens = [], 0.0, 0
    for p, c, lp in zip(out.prompt_ids, out.completion_ids, out.logprobs):
        if not c:
            continue
        train = _score(master, p, c)
        ks = [math.exp(t - i) - 1 - (t - i) for t, i in zip(train, lp)]
        worst = max(worst, *(abs(t - i) for t, i in zip(train, lp)))
        per_completion.append(sum(ks) / len(ks))
        tokens += len(ks)
    return {"mismatch_kl": statistics.fmean(per_completion),
            "se": statistics.stdev(per_completion) / math.sqrt(len(per_completion)),
            "max_abs_log_ratio": worst, "completions": len(per_completion), "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/smollm2")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    tok = load_tokenizer(a.model)
    master = load_model(a.model)
    cast = load_model(a.model)
    with torch.no_grad():
        for p in cast.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    prompts = _prompts(tok, a.prompts, a.seed)
    for name, published in (("float32", master), ("bfloat16", cast)):
        print(json.dumps({"published": name, "model": a.model, **measure(master, published, tok, prompts, a.group,
                                                                        a.seed)}), flush=True)


if __name__ == "__main__":
    main()
