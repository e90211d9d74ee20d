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
    """Keeps the model in memory and swaps in new versions' weights.

    Weights come from the run directory, or through SHARDCAST (relays, verified per shard against
    the origin's signed manifest) when ``cfg.shardcast.enabled``. Version 0 is the base model.
    """

    def __init__(self, run: RunDir, cfg: RLConfig, worker_id: str) -> None:
        self.run = run
        self.cfg = cfg
        self.model = load_model(cfg.model)
        self.version = -1
        self.cache = run.root / "cache" / worker_id
        self.last_fetch: dict | None = None

    def _servers(self) -> tuple[list[str], str] | None:
        origin = self.run.read_json("origin.json")
        if not isinstance(origin, dict):
            return None
        servers = list(self.cfg.shardcast.servers)
        if not servers:
            relays = self.run.read_json("relays.json")
            servers = list(relays) if isinstance(relays, list) and relays else [origin["url"]]
        return servers, origin["public_key"]

    def _fetch(self, version: int) -> dict[str, torch.Tensor] | None:
        from swarmrl.shardcast import FetchError, fetch

        found = self._servers()
        if found is None:
            return None
        servers, pubkey = found
        self.cache.mkdir(parents=True, exist_ok=True)
        out = self.cache / f"v{version:06d}.safetensors"
        try:
            res = fetch(servers, out, pubkey, version=version, wait_s=self.cfg.shardcast.fetch_wait_s)
        except FetchError:
            return None
        self.last_fetch = {"version": version, "fetch_s": round(res.seconds, 4), "bytes": res.size,
                           "bytes_by_server": res.bytes_by_server, "excluded": res.excluded}
        state = load_file(str(out))
        for old in self.cache.glob("v*.safetensors"):
            if old != out:
                old.unlink(missing_ok=True)
        return state

    def _read_local(self, latest: int, allow_wait_s: float) -> tuple[int, dict[str, torch.Tensor]] | None:
        path = self.run.version_dir(latest) / "model.safetensors"
        deadline = time.monotonic() + allow_wait_s
        while True:
            try:
                return latest, load_file(str(path))
            except (FileNotFoundError, OSError):
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
                newer = self.run.latest_version()
                if newer is not None and newer != latest:
                    latest, path = newer, self.run.version_dir(newer) / "model.safetensors"

    def refresh(self, allow_wait_s: float = 5.0) -> int | None:
        latest = self.run.latest_version()
        if latest is None or latest == self.version:
            return latest
        if self.cfg.shardcast.enabled and latest >= 1:
            state = self._fetch(latest)
            got = (latest, state) if state is not None else None
        elif self.cfg.shardcast.enabled:  # version 0 is the base model, already loaded at start-up
            self.version = max(self.version, 0)
            return self.version
        else:
            got = self._read_local(latest, allow_wait_s)
        if got is None:
            return self.version if self.version >= 0 else None
        latest, state = got
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
    holder = PolicyHolder(run, cfg, worker_id)
    gen = torch.Generator().manual_seed(task_seed(worker_id, 0, 0, cfg.seed) % (2**31))
    metrics = MetricsWriter(run.metrics / f"worker-{worker_id}.jsonl")
    counter = 0
    throughput: float | None = None
    seqs = cfg.workers.prompts_per_batch * cfg.group_size
    batches = 0
    try:
        while not run.is_done():
            latest = holder.refresh()
            if holder.last_fetch is not None:
                metrics.write(worker=worker_id, event="fetch", **holder.last_fetch)
                holder.last_fetch = None
            if latest is None or holder.version < 0:
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
