"""Which reasoning-gym tasks a model can learn from: its greedy held-out score on each candidate, at the start.

    python benchmarks/envs/rg_screen.py --model models/smollm2 --n 256
    python benchmarks/envs/rg_screen.py --model DIR --task "rg:chain_sum answer=last_number max_terms=2"

RL learns from groups whose rewards differ, so a task worth training on starts neither near 0 (no group has a
correct answer) nor near 1 (nothing left to learn): the issue asks for 10-50%. Each task is evaluated as ``swarmrl
eval`` does (held-out split, greedy, chat template on by default), and the line printed per task gives the mean score
(reasoning-gym scorers give partial credit), the share of items scored 1.0, both with their standard errors, the mean
completion length in tokens and whether the solved share is inside the band.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

from swarmrl.envs import make_env
from swarmrl.inference.backend import make_backend
from swarmrl.inference.config import InferenceConfig
from swarmrl.inference.params import SamplingParams
from swarmrl.inference.prompts import decode_completion, encode_prompt
from swarmrl.models.io import load_tokenizer

# small numeric tasks a 135M chat model might partly solve, each under the last-number rule (it answers in a sentence)
CANDIDATES = [
    "rg:chain_sum answer=last_number min_terms=2 max_terms=2 min_digits=1 max_digits=1",
    "rg:chain_sum answer=last_number min_terms=2 max_terms=2 min_digits=1 max_digits=2",
    "rg:products answer=last_number min_digits=1 max_digits=1",
    "rg:leg_counting answer=last_number min_animals=1 max_animals=2 max_instances=3",
    "rg:gcd answer=last_number max_value=20",
    "rg:lcm answer=last_number max_value=10",
    "rg:simple_equations answer=last_number min_terms=2 max_terms=2 max_value=10",
    "rg:letter_counting answer=last_number min_words=3 max_words=5",
]


def parse(spec: str) -> tuple[str, dict]:
    name, *kv = spec.split()
    params: dict = {}
    for item in kv:
        k, v = item.split("=", 1)
        params[k] = int(v) if v.lstrip("-").isdigit() else v
    return name, params


def screen(backend, tok, spec: str, n: int, max_new_tokens: int, chat: bool, batch: int) -> dict:  # noqa: ANN001
    name, params = parse(spec)
    env = make_env(name, **params)
    tasks = env.heldout_set(n)
    sp = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    scores, lengths = [], []
    t0 = time.perf_counter()
    for i in range(0, len(tasks), batch):
        chunk = tasks[i: i + batch]
        out = backend.generate([encode_prompt(tok, t.prompt, chat) for t in chunk], sp)
        for t, ids in zip(chunk, out.completion_ids):
            scores.append(float(env.verify(t, decode_completion(tok, ids))))
            lengths.append(len(ids))
    m = len(scores)
    mean, solved = statistics.fmean(scores), sum(s >= 1.0 for s in scores) / m
    return {"task": spec, "n": m, "score": round(mean, 4), "score_se": round(statistics.stdev(scores) / math.sqrt(m), 4),
            "solved": round(solved, 4), "solved_se": round(math.sqrt(solved * (1 - solved) / m), 4),
            "mean_tokens": round(statistics.fmean(lengths), 1), "in_band_10_50": 0.10 <= solved <= 0.50,
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/smollm2")
    ap.add_argument("--task", action="append", help="a task spec (name then key=value params); default: CANDIDATES")
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--no-chat-template", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    tok = load_tokenizer(a.model)
    backend = make_backend(InferenceConfig(), a.model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    try:
        for spec in a.task or CANDIDATES:
            print(json.dumps(screen(backend, tok, spec, a.n, a.max_new_tokens, not a.no_chat_template, a.batch)),
                  flush=True)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
