"""The swarm node: an untrusted inference worker behind the orchestrator.

It registers (with a measured throughput), heartbeats, and answers each assignment: loads the
assigned policy version from its ``PolicySource``, rebuilds the seeded tasks, samples
``group_size`` completions per task with ``rollout_batch`` (assigned seed, step, version, thinking
budget), writes the parquet file and uploads it signed.

``adversary`` turns the node into a cheater (for demos and tests; each is caught by a named check):

==============  ===========================================================  ======================
kind            what it does                                                 caught by
==============  ===========================================================  ======================
random_model    samples from a freshly initialised model, not the policy     logprobs / toploc
edit_tokens     replaces wrong completions with correct answers              logprobs / toploc
forge_rewards   claims reward 1 for every completion                         rewards
replay          uploads another node's rollouts as its own                   schema (seed)
stale_policy    never updates: keeps sampling with policy version 0          policy
own_tasks       answers tasks of its own choosing                            tasks
malformed       uploads bytes that are not a rollout file                    upload refused (422)
oversized       uploads a file over the size limit                           upload refused (413)
wrong_key       signs its upload with a key other than the registered one    upload refused (401)
==============  ===========================================================  ======================
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from swarmrl.protocol.config import NodeConfig
from swarmrl.protocol.schemas import AssignmentSpec, HeartbeatReply

log = logging.getLogger("swarmrl.swarm.node")

Adversary = Literal["", "random_model", "edit_tokens", "forge_rewards", "replay", "stale_policy", "own_tasks",
                    "malformed", "oversized", "wrong_key"]
ADVERSARIES: tuple[str, ...] = ("random_model", "edit_tokens", "forge_rewards", "replay", "stale_policy", "own_tasks",
                                "malformed", "oversized", "wrong_key")


class SwarmNodeConfig(NodeConfig):
    rl_config: str = ""  # RL config TOML (model, task, sampling, chat template); "" = membership only
    # where policy versions come from (see swarm.policy.make_policy_source): "" = the SHARDCAST servers and key the
    # orchestrator's heartbeats announce (the RL config's run_dir until it announces any); "shardcast:PUBKEY" =
    # announced servers, pinned manifest key; "shardcast:PUBKEY@URL,..." = fixed servers; a path = a run dir
    policy_source: str = ""
    work_dir: str = ""  # rollout files before upload ("" = <run_dir>/nodes/<node_id>)
    stop_file: str = ""  # exit once this file exists ("" = <run_dir>/DONE)
    threads: int = Field(1, ge=1)
    policy_timeout_s: float = Field(120.0, gt=0)
    adversary: Adversary = ""
    replay_from: str = ""  # replay adversary: dir whose */*.parquet it steals ("" = <run_dir>/nodes)
    oversize_bytes: int = Field(5 << 20, gt=0)


def measure_throughput(model, tokenizer, cfg, n: int = 8) -> float:  # noqa: ANN001
    """Generation tokens/s on a short batch (what the orchestrator sizes thinking budgets with)."""
    from swarmrl.inference.prompts import encode_prompt
    from swarmrl.inference.sampler import generate

    prompts = [encode_prompt(tokenizer, "1+1=", cfg.chat_template)] * n
    t0 = time.perf_counter()
    out = generate(model, prompts, cfg.sampling, tokenizer.eos_token_id, tokenizer.pad_token_id,
                   generator=torch.Generator().manual_seed(0))
    dt = time.perf_counter() - t0
    return round(sum(len(c) for c in out.completion_ids) / max(dt, 1e-6), 1)


class SwarmNode:
    """Answers assignments (``handle`` is the ``run_node`` handler; it uploads itself and returns None)."""

    def __init__(self, cfg: SwarmNodeConfig, client=None) -> None:  # noqa: ANN001
        from swarmrl.config import load_config
        from swarmrl.models.io import load_tokenizer
        from swarmrl.protocol.client import NodeClient
        from swarmrl.rl.config import RLConfig
        from swarmrl.swarm.policy import PolicyModel, make_policy_source
        from swarmrl.utils.metrics import MetricsWriter

        self.cfg = cfg
        self.rl: RLConfig = load_config(RLConfig, cfg.rl_config, [])
        torch.set_num_threads(cfg.threads)
        self.client = client or NodeClient(cfg.orchestrator, cfg.key, timeout=cfg.timeout_s)
        self.node_id = self.client.node_id
        run_dir = Path(self.rl.run_dir)
        self.work = Path(cfg.work_dir or run_dir / "nodes" / self.node_id)
        self.work.mkdir(parents=True, exist_ok=True)
        self.stop_file = Path(cfg.stop_file or run_dir / "DONE")
        self.tokenizer = load_tokenizer(self.rl.model)
        self.policy = PolicyModel(make_policy_source(cfg.policy_source, self.work / "policy", self.rl.model,
                                                     fallback_run_dir=run_dir), self.rl.model)
        if cfg.adversary == "random_model":
            from transformers import AutoModelForCausalLM

            torch.manual_seed(int.from_bytes(hashlib.blake2b(self.node_id.encode(), digest_size=4).digest(), "big"))
            self.policy.model = AutoModelForCausalLM.from_config(self.policy.model.config).eval()
        seed = int.from_bytes(hashlib.blake2b(f"gen|{self.node_id}".encode(), digest_size=4).digest(), "big")
        self.gen = torch.Generator().manual_seed(seed)
        self.envs: dict[str, object] = {}
        self.metrics = MetricsWriter(Path(self.rl.run_dir) / "metrics" / f"node-{self.node_id}.jsonl")
        self.stats = {"assignments": 0, "submitted": 0, "refused": 0, "skipped": 0}

    # ---- membership ----------------------------------------------------------------------------
    def register(self) -> float:
        from swarmrl.protocol.node import ensure_registered

        tps = self.cfg.throughput or measure_throughput(self.policy.model, self.tokenizer, self.rl)
        ensure_registered(self.client, tps, self.cfg.stake,
                          {"cpu_threads": self.cfg.threads, "os_cpus": os.cpu_count(), "device": "cpu"})
        return tps

    def run(self, stop: threading.Event | None = None) -> int:
        """Heartbeat and work until the stop file appears; returns 0, or 3 when ejected/refused."""
        from swarmrl.protocol.client import ApiError
        from swarmrl.protocol.node import run_node
        from swarmrl.swarm.policy import AnnouncedPolicySource

        stop = stop or threading.Event()
        stop_file = self.stop_file

        def on_reply(reply: HeartbeatReply) -> None:
            if isinstance(self.policy.source, AnnouncedPolicySource):
                self.policy.source.update(reply.weight_relays, reply.weight_pubkey)
            if stop_file.exists():
                stop.set()

        import httpx

        try:
            while not stop.is_set():
                try:
                    self.register()
                    run_node(self.client, handler=self.handle, stop=stop, on_reply=on_reply)
                except httpx.HTTPError as e:  # orchestrator restarting: keep the identity, come back
                    log.warning("orchestrator unreachable (%s); retrying", e)
                    stop.wait(1.0)
        except ApiError as e:
            log.error("node %s stopped by the orchestrator: %s", self.node_id, e)
            self.metrics.write(event="stopped", status=e.status, reason=e.detail[:300])
            return 3
        finally:
            self.metrics.close()
        return 0

    # ---- work ----------------------------------------------------------------------------------
    def _env(self, name: str, params: dict):  # noqa: ANN202
        from swarmrl.envs import make_env

        key = f"{name}|{sorted(params.items())}"
        if key not in self.envs:
            self.envs[key] = make_env(name, **params)
        return self.envs[key]

    def handle(self, a: AssignmentSpec, reply: HeartbeatReply) -> None:
        from swarmrl.protocol.client import ApiError
        from swarmrl.swarm.policy import PolicyUnavailable

        self.stats["assignments"] += 1
        if a.step < reply.step:  # the trainer is past this step: the work would be of no use
            self.stats["skipped"] += 1
            return None
        t0 = time.perf_counter()
        try:
            path, info = self.generate(a)
        except PolicyUnavailable as e:
            log.warning("assignment %d skipped: %s", a.assignment_id, e)
            self.stats["skipped"] += 1
            self.metrics.write(event="skipped", assignment=a.assignment_id, step=a.step, reason=str(e)[:300])
            return None
        gen_s = time.perf_counter() - t0
        row = {"event": "assignment", "assignment": a.assignment_id, "step": a.step,
               "policy_version": a.policy_version, "gen_s": round(gen_s, 4), **info}
        try:
            rep = self.submit(a, path)
            self.stats["submitted"] += 1
            row.update(submitted=True, submission_id=rep.submission_id)
            log.info("assignment %d (step %d): submission %d", a.assignment_id, a.step, rep.submission_id)
        except ApiError as e:
            self.stats["refused"] += 1
            row.update(submitted=False, refused_status=e.status, refused=e.detail[:300])
            log.warning("assignment %d: upload refused: %s", a.assignment_id, e)
            if e.status == 403:  # ejected
                self.metrics.write(**row)
                raise
        finally:
            if self.cfg.adversary == "oversized":
                path.unlink(missing_ok=True)
        self.metrics.write(**row)
        return None

    def generate(self, a: AssignmentSpec) -> tuple[Path, dict]:
        from swarmrl.protocol.assignment import assigned_tasks
        from swarmrl.rl.rollouts import write_rollouts
        from swarmrl.rl.worker import rollout_batch

        adv = self.cfg.adversary
        path = self.work / f"a{a.assignment_id:08d}.parquet"
        if adv == "malformed":
            path.write_bytes(b"PAR1 this is not a rollout file" + os.urandom(256))
            return path, {}
        if adv == "oversized":
            with open(path, "wb") as f:
                f.truncate(self.cfg.oversize_bytes)
            return path, {}
        tasks = assigned_tasks(a.env, a.env_params, a.seed, len(a.tasks))
        if [t.task_id for t in tasks] != [t.task_id for t in a.tasks]:
            raise ValueError(f"assignment {a.assignment_id}: tasks do not match their seed (orchestrator bug?)")
        if adv == "own_tasks":  # easy, self-chosen tasks under the assigned seed's name
            tasks = assigned_tasks(a.env, a.env_params, a.seed + 1, len(a.tasks))
        version = a.policy_version
        if adv == "stale_policy":
            version = 0
        if adv == "random_model":
            model = self.policy.model
        else:
            model = self.policy.load(version, self.cfg.policy_timeout_s)
        env = self._env(a.env, a.env_params)
        rl = self.rl.model_copy(update={"group_size": a.group_size})
        if a.target_length is not None:  # the assignment says how the budget is stated and scored
            rl = rl.model_copy(update={"budget": rl.budget.model_copy(update={
                "prompt_format": a.budget_prompt_format or rl.budget.prompt_format, "penalty": a.budget_penalty})})
        targets = [a.target_length] if a.target_length is not None else None
        res = rollout_batch(model, self.tokenizer, env, tasks, rl, worker_id=self.node_id, step=a.step,
                            policy_version=version, seed=a.seed, targets=targets, generator=self.gen,
                            proofs=rl.workers.proofs)
        rows = res.rows
        if adv == "edit_tokens":
            rows = self._edit_tokens(rows, tasks, env, rl)
        elif adv == "forge_rewards":
            for r in rows:
                r.task_reward, r.reward = 1.0, 1.0 - r.length_penalty
        elif adv == "replay":
            stolen = self._steal(a)
            if stolen is not None:
                rows = stolen
        write_rollouts(rows, path)
        return path, {"tokens": res.tokens, "tokens_per_s": round(res.tokens / max(res.seconds, 1e-9), 1),
                      "informative": res.informative, "groups": len(tasks), "reward": res.reward_mean}

    def _edit_tokens(self, rows, tasks, env, rl):  # noqa: ANN001, ANN202
        """Swap wrong completions for the task's demonstration (a correct answer) and re-score honestly, so
        the rewards check passes; only the tokens no longer come from the policy."""
        from swarmrl.rl.advantages import group_advantages

        by_id = {t.task_id: t for t in tasks}
        for r in rows:
            t = by_id[r.task_id]
            if r.task_reward >= 1.0 or not t.demonstration:
                continue
            ids = list(self.tokenizer(t.demonstration, add_special_tokens=False)["input_ids"])
            ids = ids[: rl.sampling.max_new_tokens - 1] + [self.tokenizer.eos_token_id]
            lp = list(r.logprobs) + [r.logprobs[-1] if r.logprobs else -1.0] * len(ids)
            r.completion_ids, r.logprobs, r.finished = ids, lp[: len(ids)], True
            from swarmrl.inference.prompts import decode_completion

            r.task_reward = float(env.verify(t, decode_completion(self.tokenizer, ids)))
            r.reward = r.task_reward - r.length_penalty
        groups: dict[str, list] = {}
        for r in rows:
            groups.setdefault(r.group_id, []).append(r)
        for g in groups.values():
            for r, adv in zip(g, group_advantages([x.reward for x in g], use_std=rl.loss.use_std)):
                r.advantage = adv
        return rows

    def _steal(self, a: AssignmentSpec):  # noqa: ANN202
        """Another node's most recent rollout file, relabelled as ours (worker id and step)."""
        from swarmrl.rl.rollouts import RolloutError, read_rollouts

        root = Path(self.cfg.replay_from or Path(self.rl.run_dir) / "nodes")
        files = sorted((p for p in root.glob("*/*.parquet") if p.parent.name != self.node_id),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        for f in files[:5]:
            try:
                rows = read_rollouts(f)
            except (RolloutError, OSError):
                continue
            for r in rows:
                r.worker_id, r.step = self.node_id, a.step
            return rows
        return None

    def submit(self, a: AssignmentSpec, path: Path, attempts: int = 30):  # noqa: ANN201
        """Upload; retried while the orchestrator is unreachable (a restart loses nothing, so neither may we)."""
        import httpx

        for i in range(attempts):
            try:
                if self.cfg.adversary == "wrong_key":
                    return self._submit_wrong_key(a.assignment_id, path)
                return self.client.submit(a.assignment_id, path)
            except httpx.TransportError as e:
                if i == attempts - 1:
                    raise
                log.warning("upload of assignment %d failed (%s); retrying", a.assignment_id, e)
                time.sleep(1.0)

    def _submit_wrong_key(self, assignment_id: int, path: Path):  # noqa: ANN202
        """Claim the registered key in the headers but sign with another one."""
        from swarmrl.protocol.schemas import SubmitReply
        from swarmrl.protocol.signing import H_KEY, generate_key, sign_request

        data = path.read_bytes()
        url = f"/v1/submissions/upload/{int(assignment_id)}"
        headers = sign_request(generate_key(), "PUT", url, data)
        headers[H_KEY] = self.client.public_key
        headers["Content-Type"] = "application/octet-stream"
        r = self.client._check(self.client.http.put(url, content=data, headers=headers))
        return SubmitReply.model_validate_json(r.content)


def run_swarm_node(cfg: SwarmNodeConfig) -> int:
    return SwarmNode(cfg).run()


__all__ = ["ADVERSARIES", "SwarmNode", "SwarmNodeConfig", "measure_throughput", "run_swarm_node"]
