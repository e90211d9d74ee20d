"""The swarm node: an untrusted inference worker behind the orchestrator.

It registers (with a measured throughput), heartbeats, starts downloading each policy version a heartbeat
announces (in the background: ``swarmrl.policy.prefetch``), and answers each assignment: loads the assigned policy
version, or the newest one it holds inside the async window while the assigned one is still on its way, into the
inference backend it samples with (``BackendPolicy``: ``ours`` or vLLM, the RL config's
``inference`` section unless the node config names its own), rebuilds the seeded tasks, samples ``group_size``
completions per task with ``rollout_batch`` (assigned seed, step, version, thinking budget, chat template),
writes the parquet file and uploads it signed.

Answering an assignment is split into steps a subclass may override (``tasks_for``, ``version_for``,
``backend_for``, ``tamper``, ``upload``): the cheating nodes of ``swarmrl.attacks.adversaries`` are honest nodes
with one step replaced.

Every heartbeat that does not wait (a long poll's time is the orchestrator's hold, not its service) and every
upload is timed into the node's metrics (``{"event": "call", "call": "heartbeat" | "upload", "s", "ok", "time"}``,
``time`` its start): what an attack on the servers is judged by (``swarmrl.job.report``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import torch

from swarmrl.config import load_config
from swarmrl.contract import Rollout, assigned_tasks
from swarmrl.envs import Environment, Task, make_env
from swarmrl.envs.multiturn import is_multiturn
from swarmrl.envs.vf import is_verifiers_env
from swarmrl.generation.batch import BatchOrigin, BatchResult, rollout_batch
from swarmrl.inference.backend import InferenceBackend
from swarmrl.inference.prompts import encode_prompt
from swarmrl.models.bundle import BundleError, bundle_hash
from swarmrl.models.io import load_tokenizer
from swarmrl.policy.holder import BackendPolicy
from swarmrl.policy.prefetch import PrefetchingSource
from swarmrl.policy.sources import AnnouncedPolicySource, PolicyUnavailable, make_policy_source
from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.node import ensure_registered, run_node
from swarmrl.protocol.schemas import AssignmentSpec, HeartbeatReply, SubmitReply
from swarmrl.rl.config import RLConfig
from swarmrl.rollouts.wire import write_rollouts
from swarmrl.rundir import RunLayout
from swarmrl.swarm.config import SwarmNodeConfig
from swarmrl.utils.metrics import MetricsWriter
from swarmrl.utils.threads import set_role_threads

log = logging.getLogger("swarmrl.swarm.node")


def measure_throughput(backend: InferenceBackend, tokenizer, cfg: RLConfig, n: int = 8,  # noqa: ANN001
                       multiturn: bool = False) -> float:
    """Generation tokens/s on a short batch (what the orchestrator sizes thinking budgets with), completions as
    long as the run's rows may be (``multiturn``: a trajectory's limit); fixed seeds, so the backend's own random
    stream is left as it was."""
    prompts = [encode_prompt(tokenizer, "1+1=", cfg.contract.chat_template)] * n
    sampling = cfg.contract.sampling  # the node's copy of the run's contract (no assignment yet)
    params = sampling.model_copy(update={"max_new_tokens": sampling.row_limit(multiturn)})
    t0 = time.perf_counter()
    out = backend.generate(prompts, params, seeds=list(range(n)))
    dt = time.perf_counter() - t0
    return round(sum(len(c) for c in out.completion_ids) / max(dt, 1e-6), 1)


def unserved(e: BaseException) -> bool:
    """A call the server did not serve: no answer (a transport error), or too busy (429, 5xx). A refusal on the
    merits (401, 403, 409, 413, 422, ...) is an answer."""
    if isinstance(e, ApiError):
        return e.status == 429 or e.status >= 500
    return isinstance(e, (httpx.HTTPError, OSError))


def served_base(model_dir: str) -> str | None:
    """The base model identity of ``model_dir`` (the BLAKE3 of its bundle), None when it cannot be bundled (the
    orchestrator then has nothing to compare; the validator's checks still hold the node to the run's model)."""
    try:
        return bundle_hash(model_dir)[0]
    except (BundleError, OSError):
        return None


def seed_of(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")


class SwarmNode:
    """Answers assignments (``handle`` is the ``run_node`` handler; it uploads itself and returns None)."""

    def __init__(self, cfg: SwarmNodeConfig, client: NodeClient | None = None, rl: RLConfig | None = None,
                 base_model: str | None = None) -> None:
        """``rl``: the run settings to work under (a joined node's, from the run's description: ``swarm.join``);
        None: ``cfg.rl_config``'s. ``base_model``: the BLAKE3 of the base model bundle it serves, as the run's
        description names it (None: hashed from the model directory at registration)."""
        self.cfg = cfg
        self.joined = rl is not None  # no run directory of the run's here: nothing falls back to one
        self.rl: RLConfig = rl if rl is not None else load_config(RLConfig, cfg.rl_config, [])
        self.base_model = base_model
        set_role_threads(cfg.threads)
        self.client = client or NodeClient(cfg.orchestrator, cfg.key, timeout=cfg.timeout_s)
        self.node_id = self.client.node_id
        run_dir = Path(self.rl.run_dir)
        self.work = Path(cfg.work_dir or run_dir / "nodes" / self.node_id)
        self.work.mkdir(parents=True, exist_ok=True)
        self.stop_file = Path(cfg.stop_file or RunLayout(run_dir).done_flag)
        self.tokenizer = load_tokenizer(self.rl.model)
        source = make_policy_source(cfg.policy_source, self.work / "policy", self.rl.model,
                                    fallback_run_dir="" if self.joined else run_dir)
        self.announced = source if isinstance(source, AnnouncedPolicySource) else None
        self.prefetcher = PrefetchingSource(source, timeout_s=cfg.policy_timeout_s) if cfg.hold_policy else None
        source = self.prefetcher or source
        self.gen = torch.Generator().manual_seed(seed_of(f"gen|{self.node_id}"))
        self.policy = BackendPolicy(source, self.rl.model, cfg.inference or self.rl.inference,
                                    eos_id=self.tokenizer.eos_token_id, pad_id=self.tokenizer.pad_token_id,
                                    generator=self.gen, seed=seed_of(f"gen|{self.node_id}"))
        self.envs: dict[str, Environment] = {}
        self.metrics = MetricsWriter(RunLayout(run_dir).role_metrics("node", self.node_id))
        self.stats = {"assignments": 0, "submitted": 0, "refused": 0, "skipped": 0}
        beat = self.client.heartbeat

        def heartbeat(status: dict | None = None, wait: float = 0.0) -> HeartbeatReply:
            if wait:
                return beat(status, wait=wait)
            with self.timed("heartbeat"):
                return beat(status, wait=wait)

        self.client.heartbeat = heartbeat  # type: ignore[method-assign]  # the keepalive thread's beats too

    @contextlib.contextmanager
    def timed(self, call: str) -> Iterator[None]:
        """Time one call to the orchestrator into the metrics (thread-safe: keepalive beats come from a thread)."""
        start, t0, ok = time.time(), time.perf_counter(), True
        try:
            yield
        except BaseException as e:
            ok = not unserved(e)
            raise
        finally:
            self.metrics.write(event="call", call=call, s=round(time.perf_counter() - t0, 4), ok=ok, time=start)

    # ---- membership ----------------------------------------------------------------------------
    def register(self) -> float:
        tps = self.cfg.throughput
        if not tps:
            env = self.env(self.rl.contract.task.name, self.rl.contract.task.params)
            tps = measure_throughput(self.policy.backend, self.tokenizer, self.rl,
                                     multiturn=is_multiturn(env) or is_verifiers_env(env))
        if self.base_model is None:
            self.base_model = served_base(self.rl.model)
        ensure_registered(self.client, tps, self.cfg.stake,
                          {"cpu_threads": self.cfg.threads, "os_cpus": os.cpu_count(), "device": "cpu"},
                          base_model=self.base_model, deposit_wait_s=self.cfg.deposit_wait_s,
                          attempts=30 + int(self.cfg.deposit_wait_s))
        return tps

    def run(self, stop: threading.Event | None = None) -> int:
        """Heartbeat and work until the stop file appears; returns 0, or 3 when ejected/refused."""
        stop = stop or threading.Event()
        stop_file = self.stop_file

        def on_reply(reply: HeartbeatReply) -> None:
            if self.announced is not None:
                self.announced.update(reply.weight_relays, reply.weight_pubkey)
            if self.prefetcher is not None and (self.announced is None or self.announced.using_shardcast):
                self.prefetcher.prefetch(reply.policy_version)  # the download starts now, not at the assignment
            if stop_file.exists():
                stop.set()

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
            self.policy.backend.close()
        return 0

    # ---- work ----------------------------------------------------------------------------------
    def env(self, name: str, params: dict) -> Environment:
        key = f"{name}|{sorted(params.items())}"
        if key not in self.envs:
            self.envs[key] = make_env(name, **params)
        return self.envs[key]

    def handle(self, a: AssignmentSpec, reply: HeartbeatReply) -> None:
        self.stats["assignments"] += 1
        if a.step < reply.step:  # the trainer is past this step: the work would be of no use
            self.stats["skipped"] += 1
            return None
        try:  # built (and kept) before sampling: an assignment whose task this node cannot build is declined
            self.env(a.contract.task.name, a.contract.task.params)
        except Exception as e:
            self.decline(a, f"task environment {a.contract.task.name!r} cannot be built here: "
                            f"{type(e).__name__}: {e}")
            return None
        t0 = time.perf_counter()
        try:
            path, info = self.generate(a)
        except PolicyUnavailable as e:
            self.decline(a, f"policy unavailable: {e}")
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
            self.after_submit(path)
        self.metrics.write(**row)
        return None

    def decline(self, a: AssignmentSpec, reason: str) -> None:
        """Skip an assignment this node cannot serve and decline it, so the orchestrator hands it to another node at
        once instead of when it times out. A decline that fails is logged (the work then times out as before), but
        a 403 (this node was ejected) is raised, as an upload's is. The ``skipped`` metrics row says ``declined``."""
        log.warning("assignment %d skipped: %s", a.assignment_id, reason)
        self.stats["skipped"] += 1
        row = {"event": "skipped", "assignment": a.assignment_id, "step": a.step, "reason": reason[:300]}
        try:
            self.client.decline(a.assignment_id, reason)
            row["declined"] = True
        except ApiError as e:
            row.update(declined=False, decline_status=e.status, decline_refused=e.detail[:300])
            log.warning("assignment %d: decline refused: %s", a.assignment_id, e)
            if e.status == 403:  # ejected
                self.metrics.write(**row)
                raise
        except (httpx.HTTPError, OSError) as e:
            row.update(declined=False, decline_refused=str(e)[:300])
            log.warning("assignment %d: decline failed: %s", a.assignment_id, e)
        self.metrics.write(**row)

    def generate(self, a: AssignmentSpec) -> tuple[Path, dict]:
        """Sample and score the assignment's rollouts into ``work/a<id>.parquet``."""
        path = self.work / f"a{a.assignment_id:08d}.parquet"
        expected = assigned_tasks(a.contract.task.name, a.contract.task.params, a.seed, len(a.tasks))
        if [t.task_id for t in expected] != [t.task_id for t in a.tasks]:
            raise ValueError(f"assignment {a.assignment_id}: tasks do not match their seed (orchestrator bug?)")
        tasks = self.tasks_for(a, expected)
        version = self.version_for(a)
        backend = self.backend_for(version)
        # SHARDCAST downloads since the last assignment (background ones too): version, seconds, bytes, end time
        while (fetched := self.policy.source.take_fetch_report()) is not None:
            self.metrics.write(event="fetch", **fetched)
        env = self.env(a.contract.task.name, a.contract.task.params)
        res = rollout_batch(backend, self.tokenizer, env, tasks, contract=a.contract, sampling=a.contract.sampling,
                            origin=BatchOrigin(self.node_id, a.step, version, a.seed), budgets=[a.budget()] * len(tasks),
                            proofs=self.rl.workers.proofs)
        write_rollouts(self.tamper(res.rows, tasks, env, self.rl, a), path)
        return path, {**self.batch_info(res, len(tasks)), "sampled_version": version}

    @staticmethod
    def batch_info(res: BatchResult, groups: int) -> dict:
        return {"tokens": res.tokens, "tokens_per_s": round(res.tokens / max(res.seconds, 1e-9), 1),
                "informative": res.informative, "groups": groups, "reward": res.reward_mean}

    # the steps an adversary may replace ---------------------------------------------------------
    def tasks_for(self, a: AssignmentSpec, expected: list[Task]) -> list[Task]:
        """The tasks to answer: the seeded ones."""
        return expected

    def version_for(self, a: AssignmentSpec) -> int:
        """The policy version to sample with: the assigned one, or (``hold_policy``) when it has not arrived
        within ``hold_grace_s``, the newest version held that the async window lets serve the step (the validator
        and the trainer take any version inside the window; the assigned one goes on downloading)."""
        want, pre = a.policy_version, self.prefetcher
        if pre is None or want == self.policy.version or pre.has(want):
            return want
        pre.prefetch(want)
        if pre.wait_for(want, self.cfg.hold_grace_s):
            return want
        window = a.contract.window()  # a held version newer than the assigned one (reopened work) serves too
        held = pre.newest_held(a.step, lambda v: window.serves(v, a.step))
        return want if held is None else held  # none serves: wait for the assigned one

    def backend_for(self, version: int) -> InferenceBackend:
        """The backend to sample with: the one serving ``version``."""
        return self.policy.load(version, self.cfg.policy_timeout_s)

    def tamper(self, rows: list[Rollout], tasks: list[Task], env: Environment, rl: RLConfig,
               a: AssignmentSpec) -> list[Rollout]:
        """What is written is what was sampled."""
        return rows

    def upload(self, assignment_id: int, path: Path) -> SubmitReply:
        return self.client.submit(assignment_id, path)

    def after_submit(self, path: Path) -> None:
        """Called once the upload is done or refused."""

    def submit(self, a: AssignmentSpec, path: Path, attempts: int = 30) -> SubmitReply:
        """Upload; retried while the orchestrator is unreachable (a restart loses nothing, so neither may we)."""
        for i in range(attempts):
            try:
                with self.timed("upload"):
                    return self.upload(a.assignment_id, path)
            except httpx.TransportError as e:
                if i == attempts - 1:
                    raise
                log.warning("upload of assignment %d failed (%s); retrying", a.assignment_id, e)
                time.sleep(1.0)
        raise AssertionError("unreachable")


def run_swarm_node(cfg: SwarmNodeConfig) -> int:
    return SwarmNode(cfg).run()


__all__ = ["SwarmNode", "SwarmNodeConfig", "measure_throughput", "run_swarm_node", "unserved"]
