"""Cheating nodes, for demos and tests: each is an honest ``SwarmNode`` with one step replaced, and each is
caught by a named check of the validator or the orchestrator.

================  ===========================================================  ======================
kind              what it does                                                 caught by
================  ===========================================================  ======================
random_model      samples from a freshly initialised model, not the policy     logprobs / toploc
edit_tokens       replaces wrong completions with correct answers              logprobs / toploc
late_edit_tokens  honest for its first honest_first uploads, then edit_tokens  sampled logprobs/toploc,
                                                                               audits (challenge)
edit_env_turn     multi-turn rows: appends a hint to an environment turn (a     rewards (replay)
                  row without one gets an environment turn spliced in)
forge_tool_result multi-turn rows: the tool's replies say the task's answer    rewards (replay)
                  (a row without one gets a forged reply spliced in)
forge_rewards     claims reward 1 for every completion                         rewards
replay            uploads another node's rollouts as its own                   schema (seed)
stale_policy      never updates: keeps sampling with policy version 0          policy
own_tasks         answers tasks of its own choosing                            tasks
malformed         uploads bytes that are not a rollout file                    upload refused (422)
oversized         uploads a file over the size limit                           upload refused (413)
wrong_key         signs its upload with a key other than the registered one    upload refused (401)
bomb              uploads a few-KB file of legal rows that decode to 2 GiB     upload refused (413)
flood             honest, and floods registrations of fresh (sybil) keys       registration refused (403
                  that heartbeat once and go idle                              no deposit, 429 per address)
idle_connections  works honestly, and holds many half-sent connections to the  held: honest latency
                  orchestrator and the weight relays from hundreds of          kept (connection caps,
                  addresses (slowloris)                                        reserve, deadlines)
================  ===========================================================  ======================
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from swarmrl.attacks.bomb import write_bomb
from swarmrl.attacks.config import ADVERSARY_KINDS, AdversaryConfig
from swarmrl.attacks.slowloris import HoldReport, IdleHolder, loopback_sources, raise_own_nofile
from swarmrl.contract import Rollout, assigned_tasks, score_completion
from swarmrl.envs import Environment, Task
from swarmrl.envs.multiturn import segments
from swarmrl.inference.backend import InferenceBackend, OursBackend
from swarmrl.inference.prompts import decode_completion, encode_reply
from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.schemas import AssignmentSpec, HeartbeatReply, SubmitReply
from swarmrl.protocol.signing import H_KEY, generate_key, sign_request
from swarmrl.rl.config import RLConfig
from swarmrl.rollouts.wire import RolloutError, read_rollouts
from swarmrl.rundir import RunLayout
from swarmrl.swarm.node import SwarmNode, seed_of
from swarmrl.utils.metrics import MetricsWriter

log = logging.getLogger("swarmrl.attacks.adversaries")


class RandomModel(SwarmNode):
    """Samples from a freshly initialised model of the policy's architecture, claiming the assigned version."""

    def __init__(self, cfg: AdversaryConfig, client=None) -> None:  # noqa: ANN001
        super().__init__(cfg, client)
        torch.manual_seed(seed_of(self.node_id))
        config = self.policy.model.config if self.policy.model is not None else AutoConfig.from_pretrained(self.rl.model)
        self.random = OursBackend(AutoModelForCausalLM.from_config(config).eval(), self.tokenizer.eos_token_id,
                                  self.tokenizer.pad_token_id, self.gen)

    def backend_for(self, version: int) -> InferenceBackend:
        return self.random


def _rescore(node: SwarmNode, rows: list[Rollout], tasks: list[Task], env: Environment,
             a: AssignmentSpec) -> list[Rollout]:
    """Honest scores for tampered rows (whole text; the model's tokens for a budget): the reward re-check alone
    then finds nothing wrong with the claimed numbers."""
    by_id = {t.task_id: t for t in tasks}
    for r in rows:
        ids = r.completion_ids
        model_ids = [t for t, m in zip(ids, r.model_mask()) if m]
        s = score_completion(env, by_id[r.task_id], decode_completion(node.tokenizer, ids), model_ids, r.finished,
                             a.budget())
        r.task_reward, r.length_penalty, r.reward = s.task_reward, s.length_penalty, s.reward
    return rows


class EditTokens(SwarmNode):
    """Swaps wrong completions for the task's demonstration (a correct answer) and re-scores them honestly, so
    the rewards check passes; only the tokens no longer come from the policy."""

    def tamper(self, rows: list[Rollout], tasks: list[Task], env: Environment, rl: RLConfig,
               a: AssignmentSpec) -> list[Rollout]:
        by_id = {t.task_id: t for t in tasks}
        eos = self.tokenizer.eos_token_id
        for r in rows:
            t = by_id[r.task_id]
            if r.task_reward >= 1.0 or not t.demonstration:
                continue
            ids = list(self.tokenizer(t.demonstration, add_special_tokens=False)["input_ids"])
            ids = ids[: a.contract.sampling.max_new_tokens - 1] + [eos]
            lp = list(r.logprobs) + [r.logprobs[-1] if r.logprobs else -1.0] * len(ids)
            r.completion_ids, r.logprobs, r.finished, r.completion_mask = ids, lp[: len(ids)], True, None
        return _rescore(self, rows, tasks, env, a)


class EditEnvTurn(SwarmNode):
    """Multi-turn rows: edits the environment's side of the trajectory (the model's tokens are its own), then
    re-scores honestly. ``edit``: the new text of one environment turn (``old``: its text, None where the row has
    no environment turn: one is spliced in before the model's last token)."""

    def edit(self, old: str | None, task: Task) -> str:
        return (old or "") + f" (hint: the answer is {task.verification_info.get('answer', '?')})"

    def tamper(self, rows: list[Rollout], tasks: list[Task], env: Environment, rl: RLConfig,
               a: AssignmentSpec) -> list[Rollout]:
        by_id = {t.task_id: t for t in tasks}
        for r in rows:
            self._edit_row(r, by_id[r.task_id])
        return _rescore(self, rows, tasks, env, a)

    def _edit_row(self, r: Rollout, task: Task) -> None:
        ids, lp, mask = list(r.completion_ids), list(r.logprobs), r.model_mask()
        env_segs = [s for s in segments(mask) if not s.model]
        if env_segs:
            seg = env_segs[0]
            new = encode_reply(self.tokenizer, self.edit(decode_completion(self.tokenizer, ids[seg.start: seg.end]),
                                                          task))
            start, end = seg.start, seg.end
        else:  # no tool call: a forged environment turn before the model's last token
            new = encode_reply(self.tokenizer, self.edit(None, task))
            start = end = max(0, len(ids) - 1)
        r.completion_ids = ids[:start] + new + ids[end:]
        r.logprobs = lp[:start] + [0.0] * len(new) + lp[end:]
        r.completion_mask = mask[:start] + [0] * len(new) + mask[end:]


class ForgeToolResult(EditEnvTurn):
    """Multi-turn rows: the tool's reply claims the task's answer (``<result>answer</result>``), so the model
    copies a right value it never computed; re-scored honestly."""

    def edit(self, old: str | None, task: Task) -> str:
        return f"<result>{task.verification_info.get('answer', 0)}</result>"


class LateEditTokens(EditTokens):
    """Works honestly for its first ``honest_first`` submissions (past the validator's ``full_check_first``, which
    are always checked in full), then edits tokens like ``edit_tokens``: against sampled validation only the
    secret per-submission draw and the audits of accepted work can catch it."""

    def tamper(self, rows: list[Rollout], tasks: list[Task], env: Environment, rl: RLConfig,
               a: AssignmentSpec) -> list[Rollout]:
        if self.stats["submitted"] < self.cfg.honest_first:
            return rows
        return super().tamper(rows, tasks, env, rl, a)


class ForgeRewards(SwarmNode):
    """Claims task reward 1 for every completion."""

    def tamper(self, rows: list[Rollout], tasks: list[Task], env: Environment, rl: RLConfig,
               a: AssignmentSpec) -> list[Rollout]:
        for r in rows:
            r.task_reward, r.reward = 1.0, 1.0 - r.length_penalty
        return rows


class Replay(SwarmNode):
    """Uploads another node's most recent rollout file, relabelled as its own (worker id and step)."""

    def tamper(self, rows: list[Rollout], tasks: list[Task], env: Environment, rl: RLConfig,
               a: AssignmentSpec) -> list[Rollout]:
        root = Path(self.cfg.replay_from or Path(self.rl.run_dir) / "nodes")
        files = sorted((p for p in root.glob("*/*.parquet") if p.parent.name != self.node_id),
                       key=lambda p: p.stat().st_mtime, reverse=True)
        for f in files[:5]:
            try:
                stolen = read_rollouts(f)
            except (RolloutError, OSError):
                continue
            for r in stolen:
                r.worker_id, r.step = self.node_id, a.step
            return stolen
        return rows


class OtherTemperature(SwarmNode):
    """Samples at a temperature of its own (``own_temperature``), as a node whose own config overrode the run's
    would: its rows say so, and the validator refuses them for it."""

    def generate(self, a: AssignmentSpec) -> tuple[Path, dict]:
        sampling = a.contract.sampling.model_copy(update={"temperature": self.cfg.own_temperature})
        return super().generate(a.model_copy(update={"contract": a.contract.model_copy(update={"sampling": sampling})}))


class StalePolicy(SwarmNode):
    """Never updates: samples with policy version 0 whatever the assignment says."""

    def version_for(self, a: AssignmentSpec) -> int:
        return 0


class OwnTasks(SwarmNode):
    """Answers easy, self-chosen tasks (another seed's) under the assigned seed's name."""

    def tasks_for(self, a: AssignmentSpec, expected: list[Task]) -> list[Task]:
        return assigned_tasks(a.contract.task.name, a.contract.task.params, a.seed + 1, len(a.tasks))


class Malformed(SwarmNode):
    """Uploads bytes that are not a rollout file."""

    def generate(self, a: AssignmentSpec) -> tuple[Path, dict]:
        path = self.work / f"a{a.assignment_id:08d}.parquet"
        path.write_bytes(b"PAR1 this is not a rollout file" + os.urandom(256))
        return path, {}


class Oversized(SwarmNode):
    """Uploads a file over the orchestrator's size limit."""

    def generate(self, a: AssignmentSpec) -> tuple[Path, dict]:
        path = self.work / f"a{a.assignment_id:08d}.parquet"
        with open(path, "wb") as f:
            f.truncate(self.cfg.oversize_bytes)
        return path, {}

    def after_submit(self, path: Path) -> None:
        path.unlink(missing_ok=True)


class WrongKey(SwarmNode):
    """Claims the registered key in the headers but signs its upload with another one."""

    def upload(self, assignment_id: int, path: Path) -> SubmitReply:
        data = path.read_bytes()
        url = f"/v1/submissions/upload/{int(assignment_id)}"
        headers = sign_request(generate_key(), "PUT", url, data)
        headers[H_KEY] = self.client.public_key
        headers["Content-Type"] = "application/octet-stream"
        r = self.client._check(self.client.http.put(url, content=data, headers=headers))
        return SubmitReply.model_validate_json(r.content)


class Bomb(SwarmNode):
    """Uploads a small file whose rows, each of legal shape and naming this node, step and seed, decode to
    ``bomb_bytes`` (``swarmrl.attacks.bomb``): refused from its metadata before it is decoded."""

    def generate(self, a: AssignmentSpec) -> tuple[Path, dict]:
        path = self.work / f"a{a.assignment_id:08d}.parquet"
        write_bomb(path, self.cfg.bomb_bytes, worker_id=self.node_id, step=a.step, policy_version=a.policy_version,
                   seed=a.seed, env=a.contract.task.name, task_ids=[t.task_id for t in a.tasks] or ["t0"],
                   group_size=a.contract.group_size, group_prefix=str(a.assignment_id))
        return path, {"bytes": path.stat().st_size, "decoded_bytes": self.cfg.bomb_bytes}

    def after_submit(self, path: Path) -> None:
        path.unlink(missing_ok=True)


class Flood(SwarmNode):
    """Does honest work, and from a thread floods the orchestrator with registrations of fresh keys (sybils): a
    burst of ``flood_batch`` every ``flood_interval_s``, each sybil that gets in heartbeats once (taking work in
    demand mode) and goes idle. A burst stops at the first 429 and waits out its Retry-After (so the honest
    nodes sharing its address still get in); nothing it meets stops it or the run."""

    def register(self) -> float:
        tps = super().register()
        if not getattr(self, "_flooding", None):
            self._flooding = threading.Thread(target=self._flood, name="flood", daemon=True)
            self._flooding.start()
        return tps

    def _flood(self) -> None:
        log = MetricsWriter(RunLayout(self.rl.run_dir).role_metrics("flood", self.node_id))
        while not self.stop_file.exists():
            try:
                burst = flood_registrations(self.cfg.orchestrator, self.cfg.flood_batch, stake=self.cfg.stake,
                                            timeout=self.cfg.timeout_s)
            except Exception as e:  # an orchestrator restarting, a closed socket: flood again later
                burst = {"error": repr(e)[:300]}
            log.write(event="flood", **burst)
            time.sleep(max(self.cfg.flood_interval_s, burst.get("retry_after_s", 0.0)))


def flood_registrations(url: str, n: int, stake: float = 100.0, timeout: float = 30.0) -> dict:
    """Register up to ``n`` fresh keys (heartbeating once with each that gets in); stops at the first 429."""
    out: dict = {"attempted": 0, "registered": 0, "refused": {}, "retry_after_s": 0.0}
    transport = httpx.HTTPTransport()
    try:
        for _ in range(n):
            sybil = NodeClient(url, generate_key(), timeout=timeout, transport=transport)
            out["attempted"] += 1
            try:
                sybil.register(throughput=1000.0, stake=stake, hardware={"gpu": "H100"})
                out["registered"] += 1
                sybil.heartbeat()
            except ApiError as e:
                out["refused"][str(e.status)] = out["refused"].get(str(e.status), 0) + 1
                if e.status == 429:
                    out["retry_after_s"] = e.retry_after or 1.0
                    break
    finally:
        transport.close()
    return out


def idle_sources(cfg: AdversaryConfig) -> list[str] | None:
    """Where an idle_connections node's connections come from: on loopback (one-machine swarms) ``idle_addresses``
    addresses other than the nodes' 127.0.0.1, as a botnet has, each with a few connections per server, so the
    servers' global caps, reserve and deadlines are what meet them, not the per-address cap; elsewhere the node's
    own address (None)."""
    loopback = (urlsplit(cfg.orchestrator).hostname or "").startswith("127.")
    return loopback_sources(cfg.idle_addresses) if loopback else None


class IdleConnections(SwarmNode):
    """Does honest work, and meanwhile (a background thread) holds ``idle_conns`` half-sent connections to the
    orchestrator and to each weight relay its heartbeats name, from ``idle_addresses`` source addresses, in rounds
    of ``idle_round_s`` with rests between them, for as long as it runs. It is judged as an attacker is: by the
    honest nodes' heartbeat and upload latency during its rounds against their latency outside them
    (``job.report``); each round's report and its start and end go to ``metrics/idle-<node>.jsonl``."""

    def __init__(self, cfg: AdversaryConfig, client=None) -> None:  # noqa: ANN001
        super().__init__(cfg, client)
        self.relays: set[str] = set()
        beat = self.client.heartbeat

        def heartbeat(status: dict | None = None, wait: float = 0.0) -> HeartbeatReply:
            reply = beat(status, wait=wait)
            self.relays.update(reply.weight_relays)
            return reply

        self.client.heartbeat = heartbeat  # type: ignore[method-assign]  # learn the relays from every reply
        rounds = MetricsWriter(RunLayout(self.rl.run_dir).role_metrics("idle", self.node_id))
        self.sources = idle_sources(cfg)
        raise_own_nofile(2 * cfg.idle_conns + 1024)  # the orchestrator and a relay, and the node's own files

        def on_round(rep: HoldReport, start: float, end: float) -> None:
            rounds.write(event="idle_round", start=start, end=end, addresses=len(self.sources or ()) or 1,
                         **rep.as_dict())

        self.holder = IdleHolder(lambda: [cfg.orchestrator, *sorted(self.relays)], cfg.idle_conns,
                                 cfg.idle_round_s, cfg.idle_reconnect_per_s, sources=self.sources,
                                 on_round=on_round, delay_s=cfg.idle_delay_s, rest_s=cfg.idle_rest_s)

    def run(self, stop: threading.Event | None = None) -> int:
        self.holder.start()
        try:
            return super().run(stop)
        finally:
            rep = self.holder.stop()
            log.info("idle connections held in %d rounds: %s", self.holder.rounds, rep.as_dict())


ADVERSARIES: dict[str, type[SwarmNode]] = {
    "random_model": RandomModel, "edit_tokens": EditTokens, "forge_rewards": ForgeRewards, "replay": Replay,
    "stale_policy": StalePolicy, "own_tasks": OwnTasks, "malformed": Malformed, "oversized": Oversized,
    "wrong_key": WrongKey, "bomb": Bomb, "flood": Flood, "idle_connections": IdleConnections,
    "late_edit_tokens": LateEditTokens, "edit_env_turn": EditEnvTurn, "forge_tool_result": ForgeToolResult,
    "other_temperature": OtherTemperature,
}
assert tuple(ADVERSARIES) == ADVERSARY_KINDS, "attacks.config.ADVERSARY_KINDS must name every adversary"


def make_adversary(cfg: AdversaryConfig, client=None) -> SwarmNode:  # noqa: ANN001
    """The cheating node ``cfg.adversary`` names (the config validates the name)."""
    return ADVERSARIES[cfg.adversary](cfg, client)


__all__ = ["ADVERSARIES", "flood_registrations", "idle_sources", "make_adversary"]
