"""Held-out accuracy of a model on a task (greedy decoding, batched, through an inference backend). A multi-turn
task is evaluated as it is trained: turn by turn with the environment's replies (``swarmrl.episodes.turns``),
scored on the whole trajectory's text, under ``max_trajectory_tokens`` (``swarmrl.inference.params.TokenLimits``)."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from swarmrl.envs.base import Environment
from swarmrl.envs.multiturn import is_multiturn
from swarmrl.episodes.turns import sample_turns
from swarmrl.eval.config import EvalConfig
from swarmrl.inference.backend import InferenceBackend, as_backend, make_backend
from swarmrl.inference.params import SamplingParams, TokenLimits
from swarmrl.inference.prompts import decode_completion, encode_prompt
from swarmrl.inference.static_decoder import borrowed_weights
from swarmrl.models.io import load_tokenizer


def evaluate(policy: InferenceBackend | torch.nn.Module, tokenizer, env: Environment, n: int = 512,
             batch_size: int = 256, limits: TokenLimits | None = None, chat_template: bool = False,
             seed: int = 1234) -> dict[str, float]:
    """``policy``: an inference backend, or an in-memory model (sampled with ``ours``; put in eval mode for the
    duration, as the trainer and SFT evaluate the model they are training). ``limits``: the token limits (None:
    their defaults)."""
    tasks = env.heldout_set(n, seed=seed)
    params = SamplingParams.greedy(limits or TokenLimits())
    backend = as_backend(policy, tokenizer.eos_token_id, tokenizer.pad_token_id)
    module = policy if isinstance(policy, torch.nn.Module) else None
    correct = 0.0
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    # an in-memory model is evaluated between training steps (trainer, SFT): it samples on its own weights, with no
    # copy in the sampler's layout (the trainer's memory peak when it had one)
    try:
        with borrowed_weights(module) if module is not None else nullcontext():
            for i in range(0, len(tasks), batch_size):
                chunk = tasks[i: i + batch_size]
                prompts = [encode_prompt(tokenizer, t.prompt, chat_template) for t in chunk]
                if is_multiturn(env):
                    out = sample_turns(backend, tokenizer, env, chunk, prompts, params)  # type: ignore[arg-type]
                else:
                    out = backend.generate(prompts, params)
                for t, ids in zip(chunk, out.completion_ids):
                    correct += env.verify(t, decode_completion(tokenizer, ids))
    finally:
        if module is not None:
            module.train(was_training)
    return {"accuracy": correct / len(tasks), "n": len(tasks)}


def evaluate_path(cfg: EvalConfig) -> dict[str, float]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tok = load_tokenizer(cfg.model)
    backend = make_backend(cfg.inference, cfg.model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    try:
        res = evaluate(backend, tok, cfg.task.build(), cfg.n, cfg.batch_size, cfg.token_limits(), cfg.chat_template,
                       cfg.seed)
    finally:
        backend.close()
    return {"model": cfg.model, "task": cfg.task.name, **res}
