"""Inference worker: loads the newest allowed policy, samples groups, scores them, writes rollouts.

Staleness gate (``contract.AsyncWindow``): with the trainer at step n (= newest policy version n), a worker
holding version v generates only for steps n .. v + async_level. It fills the lowest such step whose pool
still lacks usable groups, so a dead worker's share is taken up by the others and a restarted worker
simply rejoins.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from swarmrl.contract import (
    Budget,
    Demand,
    RLContract,
    Rollout,
    RowOrigin,
    Samples,
    allowed_targets,
    draw_targets,
    format_prompt,
    score_groups,
    worker_task_seed,
)
from swarmrl.envs.base import Environment, Task
from swarmrl.envs.multiturn import is_multiturn
from swarmrl.envs.vf import is_verifiers_env
from swarmrl.episodes.turns import sample_turns
from swarmrl.inference.backend import InferenceBackend, as_backend
from swarmrl.inference.prompts import decode_completion, encode_prompt
from swarmrl.models.io import load_tokenizer
from swarmrl.policy.holder import BackendPolicy
from swarmrl.policy.sources import PolicySource, PolicyUnavailable, RunDirPolicySource, ShardcastPolicySource
from swarmrl.rl.config import RLConfig
from swarmrl.rollouts.wire import write_rollouts
from swarmrl.rundir.writer import RunDir
from swarmrl.toploc import build_proofs_many
from swarmrl.utils.metrics import MetricsWriter
from swarmrl.utils.threads import set_role_threads


@dataclass
class BatchResult:
    rows: list[Rollout]
    informative: int
    tokens: int
    seconds: float
    reward_mean: float
    task_reward_mean: float


def rollout_batch(policy: InferenceBackend | torch.nn.Module, tokenizer, env: Environment, tasks: list[Task],
                  cfg: RLConfig, *, worker_id: str, step: int, policy_version: int, seed: int,
                  budgets: list[Budget | None] | None, generator: torch.Generator | None = None, proofs: bool = False,
                  contract: RLContract | None = None) -> BatchResult:
    """Sample ``group_size`` completions per task (task i under ``budgets[i]``, None: no budget) and build scored
    rollout rows (``contract.score_groups``); with ``proofs``, TOPLOC proofs over the final-norm states captured
    while sampling (no second pass). A multi-turn environment's tasks are sampled turn by turn
    (``swarmrl.episodes.turns``): rows with a completion mask, proofs over the model's tokens. A verifiers environment's
    (``vf:``) are episodes over the chat endpoint (``swarmrl.episodes.vf.sample_episodes``): rows with a
    completion mask, proofs over the model's tokens, scored on their conversation; no thinking budgets. ``policy``: an inference
    backend, or an in-memory model sampled with ``ours`` from ``generator`` (a backend has its own random stream). ``contract``: the rules to sample under (group size,
    chat template, proof geometry; a node passes its assignment's), None: the run config's."""
    if generator is not None and isinstance(policy, InferenceBackend):
        raise ValueError("generator is for an in-memory model; a backend samples from its own stream")
    backend = as_backend(policy, tokenizer.eos_token_id, tokenizer.pad_token_id, generator)
    t0 = time.perf_counter()
    budgets = list(budgets) if budgets is not None else [None] * len(tasks)
    c = cfg.contract if contract is None else contract
    masks = texts = None
    if is_verifiers_env(env):  # episodes over the chat endpoint (swarmrl.episodes.vf), their own prompts
        out = _verifiers_episodes(backend, tokenizer, env, tasks, budgets, c.group_size, cfg, proofs)
        masks, texts = out.masks, out.texts
    else:
        prompts = [encode_prompt(tokenizer, format_prompt(t.prompt, b), c.chat_template)
                   for t, b in zip(tasks, budgets)]
        flat = [p for p in prompts for _ in range(c.group_size)]
        if is_multiturn(env):  # the model's turns and the environment's replies, one token sequence each
            out = sample_turns(backend, tokenizer, env, [t for t in tasks for _ in range(c.group_size)], flat,
                               cfg.sampling, capture_hidden=proofs)
            masks = out.masks
        else:
            out = backend.generate(flat, cfg.sampling, capture_hidden=proofs)
    samples = Samples(out.prompt_ids, out.completion_ids, out.logprobs, out.finished,
                      proofs=build_proofs_many(out.hidden, c.proof) if proofs else None, masks=masks, texts=texts)
    origin = RowOrigin(worker_id, step, policy_version, seed, cfg.sampling.temperature)
    scored = score_groups(env=env, tasks=tasks, budgets=budgets, group_size=c.group_size, samples=samples,
                          decode=lambda ids: decode_completion(tokenizer, ids), origin=origin)
    rows = scored.rows
    n = len(rows)
    return BatchResult(rows, scored.informative, scored.tokens, time.perf_counter() - t0,
                       sum(r.reward for r in rows) / n, sum(r.task_reward for r in rows) / n)


def _verifiers_episodes(backend: InferenceBackend, tokenizer, env: Environment, tasks: list[Task],  # noqa: ANN001
                        budgets: list[Budget | None], group_size: int, cfg: RLConfig, proofs: bool):  # noqa: ANN202
    if any(b is not None for b in budgets):
        raise ValueError(f"{env.name}: thinking budgets do not apply to verifiers episodes")
    from swarmrl.episodes.vf import sample_episodes  # noqa: PLC0415  # lazy: the optional verifiers extra

    out = sample_episodes(backend, tokenizer, env, [t for t in tasks for _ in range(group_size)], cfg.sampling,
                          capture_hidden=proofs)
    if out.hidden is not None:  # the model's tokens' states, turn by turn, as for our multi-turn trajectories
        out.hidden = [torch.cat(h) if h else torch.empty(0) for h in out.hidden]
    return out


def worker_policy_source(run: RunDir, cfg: RLConfig, worker_id: str) -> PolicySource:
    """The run dir's policies, or with SHARDCAST on the origin's (or its relays') downloads, servers and
    manifest key read from the run dir before each fetch."""
    if not cfg.shardcast.enabled:
        return RunDirPolicySource(run.root)
    return ShardcastPolicySource([], "", run.cache(worker_id), cfg.model, keep=2,
                                 discover=lambda: run.weight_servers(cfg.shardcast.servers))


def run_worker(cfg: RLConfig, worker_id: str, max_batches: int | None = None) -> None:
    set_role_threads(cfg.workers.threads)
    run = RunDir(cfg.run_dir)
    tokenizer = load_tokenizer(cfg.model)
    env = cfg.contract.task.build()
    source = worker_policy_source(run, cfg, worker_id)
    stream_seed = worker_task_seed(worker_id, 0, 0, cfg.seed) % (2**31)
    gen = torch.Generator().manual_seed(stream_seed)
    holder = BackendPolicy(source, cfg.model, cfg.inference, eos_id=tokenizer.eos_token_id,
                           pad_id=tokenizer.pad_token_id, generator=gen, seed=stream_seed)
    window = cfg.contract.window(last_step=cfg.steps - 1)
    rule = cfg.contract.group_rule()
    demand = Demand(cfg.prompts_per_step)
    metrics = MetricsWriter(run.role_metrics("worker", worker_id))
    counter = 0
    throughput: float | None = None
    seqs = cfg.workers.prompts_per_batch * cfg.contract.group_size
    budget = cfg.contract.budget
    batches = 0
    try:
        while not run.is_done():
            latest = run.latest_version()
            if latest is not None and latest != holder.version:
                try:
                    holder.load(latest, timeout_s=cfg.shardcast.fetch_wait_s if cfg.shardcast.enabled else 5.0)
                except PolicyUnavailable:
                    pass  # keep the version held (if any) and try again next round
                fetched = source.take_fetch_report()
                if fetched is not None:
                    metrics.write(worker=worker_id, event="fetch", **fetched)
            if latest is None or holder.version < 0:
                time.sleep(cfg.workers.poll_s)
                continue
            v = holder.version
            step = demand.step_in_need(window, v, latest, run.informative_groups)
            if step is None:
                time.sleep(cfg.workers.poll_s)
                continue
            seed = worker_task_seed(worker_id, step, counter, cfg.seed)
            counter += 1
            tasks = env.sample(seed, cfg.workers.prompts_per_batch)
            budgets = None
            if budget.enabled:
                targets = draw_targets(len(tasks), allowed_targets(budget, throughput, seqs), random.Random(seed))
                budgets = [budget.budget(t) for t in targets]
            res = rollout_batch(holder.backend, tokenizer, env, tasks, cfg, worker_id=worker_id, step=step,
                                policy_version=v, seed=seed, budgets=budgets, proofs=cfg.workers.proofs)
            write_rollouts(res.rows, run.new_rollout_path(step, worker_id, rule.count_usable(res.rows)))
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
        holder.backend.close()
