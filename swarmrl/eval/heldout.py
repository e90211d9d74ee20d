"""Held-out accuracy of a model on a task (greedy decoding, batched, KV cache)."""

from __future__ import annotations

import torch

from swarmrl.envs.base import Environment
from swarmrl.eval.config import EvalConfig
from swarmrl.inference.params import SamplingParams
from swarmrl.inference.prompts import decode_completion, encode_prompt
from swarmrl.inference.sampler import generate
from swarmrl.models.io import load_model, load_tokenizer


def evaluate(model, tokenizer, env: Environment, n: int = 512, batch_size: int = 256, max_new_tokens: int = 8,
             chat_template: bool = False, seed: int = 1234) -> dict[str, float]:
    tasks = env.heldout_set(n, seed=seed)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    correct = 0.0
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(tasks), batch_size):
            chunk = tasks[i: i + batch_size]
            prompts = [encode_prompt(tokenizer, t.prompt, chat_template) for t in chunk]
            out = generate(model, prompts, params, tokenizer.eos_token_id, tokenizer.pad_token_id)
            for t, ids in zip(chunk, out.completion_ids):
                correct += env.verify(t, decode_completion(tokenizer, ids))
    finally:
        model.train(was_training)
    return {"accuracy": correct / len(tasks), "n": len(tasks)}


def evaluate_path(cfg: EvalConfig) -> dict[str, float]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = load_model(cfg.model)
    tok = load_tokenizer(cfg.model)
    res = evaluate(model, tok, cfg.task.build(), cfg.n, cfg.batch_size, cfg.max_new_tokens, cfg.chat_template, cfg.seed)
    return {"model": cfg.model, "task": cfg.task.name, **res}
