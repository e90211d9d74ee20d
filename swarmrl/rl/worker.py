"""Inference worker: loads the newest allowed policy, samples groups, scores them, writes rollouts.

Staleness gate: with ``async_level = k`` and trainer at step n (= newest policy version n), a
worker holding version v generates only for steps m with n <= m <= v + k. It fills the lowest
such step whose pool still lacks informative groups, so a dead worker's share is taken up by the
others and a restarted worker simply rejoins.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass

import torch
from safetensors.torch import load_file

from swarmrl.envs.base import Environment, Task
from swarmrl.inference.prompts import decode_completion, encode_prompt
from swarmrl.inference.sampler import generate
from swarmrl.models.io import load_model, load_tokenizer
from swarmrl.rl.advantages import group_advantages, is_informative
from swarmrl.rl.budget import allowed_targets, draw_targets, format_prompt, length_penalty
from swarmrl.rl.config import RLConfig
from swarmrl.rl.rollouts import Rollout, write_rollouts
from swarmrl.rl.store import RunDir
from swarmrl.utils.metrics import MetricsWriter


def task_seed(worker_id: str, step: int, counter: int, run_seed: int) -> int:
    h = hashlib.blake2b(f"{run_seed}|{worker_id}|{step}|{counter}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") >> 1


@dataclass
class BatchResult:
    rows: list[Rollout]
    informative: int
    tokens: int
    seconds: float
    reward_mean: float
    task_reward_mean: float


def make_proofs(hidden: torch.Tensor) -> list[bytes]:
    """TOPLOC proofs over the final-norm states captured while sampling (no second forward pass)."""
    from swarmrl.toploc import proofs_for_sample

    return proofs_for_sample(hidden)


def rollout_batch(model, tokenizer, env: Environment, tasks: list[Task], cfg: RLConfig, *, worker_id: str,
                  step: int, policy_version: int, seed: int, targets: list[int] | None,
                  generator: torch.Generator | None = None, proofs: bool = False) -> BatchResult:
    """Sample ``group_size`` completions per task and build scored rollout rows."""
    t0 = time.perf_counter()
    g = cfg.group_size
    rng = random.Random(seed)
    tlist = draw_targets(len(tasks), targets, rng) if targets else [None] * len(tasks)
    prompts = [encode_prompt(tokenizer, format_prompt(t.prompt, tl, cfg.budget), cfg.chat_template)
               for t, tl in zip(tasks, tlist)]
    flat = [p for p in prompts for _ in range(g)]
    out = generate(model, flat, cfg.sampling, tokenizer.eos_token_id, tokenizer.pad_token_id,
                   capture_hidden=proofs, generator=generator)
    rows: list[Rollout] = []
    informative = 0
    tokens = 0
    for i, task in enumerate(tasks):
        target = tlist[i]
        idx = range(i * g, (i + 1) * g)
        task_rewards, penalties = [], []
        for j in idx:
            ids = out.completion_ids[j]
            tokens += len(ids)
            text = decode_completion(tokenizer, ids)
            task_rewards.append(float(env.verify(task, text)))
            n = len(ids) - (1 if out.finished[j] else 0)
            penalties.append(length_penalty(n, target, cfg.budget.penalty))
        rewards = [r - p for r, p in zip(task_rewards, penalties)]
        adv = group_advantages(rewards, use_std=cfg.loss.use_std)
        informative += int(is_informative(rewards))
        for k, j in enumerate(idx):
            rows.append(Rollout(
                worker_id=worker_id, step=step, policy_version=policy_version, task_id=task.task_id,
                env=task.env, group_id=f"{task.task_id}#{seed}#{i}", prompt_ids=out.prompt_ids[j],
                completion_ids=out.completion_ids[j], logprobs=out.logprobs[j], reward=rewards[k],
                task_reward=task_rewards[k], length_penalty=penalties[k], advantage=adv[k],
                target_length=target, temperature=cfg.sampling.temperature, finished=out.finished[j], seed=seed,
                proofs=make_proofs(out.hidden[j]) if proofs else [],
            ))
    n = len(rows)
    return BatchResult(rows, informative, tokens, time.perf_counter() - t0,
                       sum(r.reward for r in rows) / n, sum(r.task_reward for r in rows) / n)


class PolicyHolder:
    """Keeps the model in memory and swaps in new versions' weights from the run dir."""

    def __init__(self, run: RunDir, init_model_path: str) -> None:
        self.run = run
        self.model = load_model(init_model_path)
        self.version = -1

    def refresh(self, allow_wait_s: float = 5.0) -> int | None:
        latest = self.run.latest_version()
        if latest is None or latest == self.version:
            return latest
        path = self.run.version_dir(latest) / "model.safetensors"
        deadline = time.monotonic() + allow_wait_s
        while True:
            try:
                state = load_file(str(path))
                break
            except (FileNotFoundError, OSError):
                if time.monotonic() > deadline:
                    return self.version if self.version >= 0 else None
                time.sleep(0.05)
                newer = self.run.latest_version()
                if newer is not None and newer != latest:
                    latest, path = newer, self.run.version_dir(newer) / "model.safetensors"
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m]:
            raise RuntimeError(f"policy v{latest} does not match the model: missing {missing}, unexpected {unexpected}")
        if getattr(self.model.config, "tie_word_embeddings", False):
            self.model.tie_weights()
        self.model.eval()
        self.version = latest
        return latest


def run_worker(cfg: RLConfig, worker_id: str, max_batches: int | None = None) -> None:
    torch.set_num_threads(cfg.workers.threads)
    run = RunDir(cfg.run_dir)
    tokenizer = load_tokenizer(cfg.model)
    env = cfg.task.build()
    holder = PolicyHolder(run, cfg.model)
    gen = torch.Generator().manual_seed(task_seed(worker_id, 0, 0, cfg.seed) % (2**31))
    metrics = MetricsWriter(run.metrics / f"worker-{worker_id}.jsonl")
    counter = 0
    throughput: float | None = None
    seqs = cfg.workers.prompts_per_batch * cfg.group_size
    batches = 0
    try:
        while not run.is_done():
            latest = holder.refresh()
            if latest is None:
                time.sleep(cfg.workers.poll_s)
                continue
            v = holder.version
            step = next((m for m in range(latest, min(v + cfg.async_level, cfg.steps - 1) + 1)
                         if run.informative_groups(m) < cfg.prompts_per_step), None)
            if step is None:
                time.sleep(cfg.workers.poll_s)
                continue
            seed = task_seed(worker_id, step, counter, cfg.seed)
            counter += 1
            tasks = env.sample(seed, cfg.workers.prompts_per_batch)
            targets = allowed_targets(cfg.budget, throughput, seqs) if cfg.budget.enabled else None
            res = rollout_batch(holder.model, tokenizer, env, tasks, cfg, worker_id=worker_id, step=step,
                                policy_version=v, seed=seed, targets=targets, generator=gen,
                                proofs=cfg.workers.proofs)
            counted = res.informative if cfg.filter_ties else len(tasks)
            write_rollouts(res.rows, run.new_rollout_path(step, worker_id, counted))
            tps = res.tokens / max(res.seconds, 1e-9)
            throughput = tps if throughput is None else 0.7 * throughput + 0.3 * tps
            metrics.write(worker=worker_id, step=step, policy_version=v, lag=step - v, tokens=res.tokens,
                          gen_s=round(res.seconds, 4), tokens_per_s=round(tps, 1), informative=res.informative,
                          groups=len(tasks), reward=res.reward_mean, task_reward=res.task_reward_mean)
            batches += 1
            if max_batches is not None and batches >= max_batches:
                break
    finally:
        metrics.close()
