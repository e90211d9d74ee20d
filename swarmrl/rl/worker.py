"""Inference worker (local mode): loads the newest allowed policy, samples groups (``swarmrl.generation``, the loop
swarm nodes sample with too), writes the rollouts into the run directory.

Staleness gate (``contract.AsyncWindow``): with the trainer at step n (= newest policy version n), a worker
holding version v generates only for steps n .. v + async_level. It fills the lowest such step whose pool
still lacks usable groups, so a dead worker's share is taken up by the others and a restarted worker
simply rejoins.
"""

from __future__ import annotations

import random
import time

import torch

from swarmrl.contract import Demand, allowed_targets, draw_targets, worker_task_seed
from swarmrl.generation.batch import BatchOrigin, rollout_batch
from swarmrl.models.io import load_tokenizer
from swarmrl.policy.holder import BackendPolicy
from swarmrl.policy.sources import PolicySource, PolicyUnavailable, RunDirPolicySource, ShardcastPolicySource
from swarmrl.rl.config import RLConfig
from swarmrl.rollouts.wire import write_rollouts
from swarmrl.rundir.writer import RunDir
from swarmrl.utils.metrics import MetricsWriter
from swarmrl.utils.threads import set_role_threads


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
            res = rollout_batch(holder.backend, tokenizer, env, tasks, contract=cfg.contract, sampling=cfg.contract.sampling,
                                origin=BatchOrigin(worker_id, step, v, seed), budgets=budgets,
                                proofs=cfg.workers.proofs)
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
