"""Shared helpers for the protocol tests: real uvicorn servers on ephemeral loopback ports, keys,
and honest/forged rollout files for an assignment."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from swarmrl.contract import Rollout
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.db import Database
from swarmrl.protocol.orchestrator import Orchestrator, create_app
from swarmrl.protocol.schemas import AssignmentSpec
from swarmrl.protocol.signing import generate_key, public_key_hex
from swarmrl.rollouts.wire import write_rollouts

DB_ENV = "SWARMRL_TEST_DATABASE_URL"


def database_url(tmp: Path) -> str:
    """SQLite file under ``tmp`` unless SWARMRL_TEST_DATABASE_URL names a server (then wiped first)."""
    url = os.environ.get(DB_ENV, "")
    if not url:
        return ""
    db = Database(url)
    db.drop_all()
    db.dispose()
    return url


# the protocol tests' contract: groups of 2, thinking budgets on (a node's tier from its throughput)
CONTRACT = {"group_size": 2, "budget": {"enabled": True, "tiers": [64, 128, 256], "step_time_s": 60.0}}


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def make_cfg(tmp: Path, contract: dict | None = None, **kw) -> tuple[OrchestratorConfig, dict]:
    """A config with validator, trainer and stake authority keys (returned by role). Nodes declare their own stake
    here (``self_declared_stake``) so the tests of everything else need no deposits; tests/attacks/test_sybils.py
    runs the deposit model (``self_declared_stake=False``). ``contract``: changes to ``CONTRACT``."""
    validator, trainer, authority = generate_key(), generate_key(), generate_key()
    base = dict(data_dir=str(tmp / "orch"), database_url=database_url(tmp), run_secret="test-secret",
                validator_keys=[public_key_hex(validator)], trainer_keys=[public_key_hex(trainer)],
                tasks_per_node=3, heartbeat_interval_s=10.0, sweep_interval_s=0.1,
                rate_limit_per_s=1000.0, rate_limit_burst=1000, heartbeats_per_interval=10_000,
                contract=_merged(CONTRACT, contract or {}),
                stake_authority_keys=[public_key_hex(authority)], self_declared_stake=True)
    base.update(kw)
    return OrchestratorConfig(**base), {"validator": validator, "trainer": trainer, "authority": authority}


class ThreadedApp:
    """An ASGI app under uvicorn on a free loopback port, in a thread of this process (``start`` sets ``url``)."""

    def __init__(self, app) -> None:  # noqa: ANN001
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self):  # noqa: ANN201  # the subclass
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class Server(ThreadedApp):
    def __init__(self, cfg: OrchestratorConfig, run_sweeper: bool = True) -> None:
        self.orch = Orchestrator(cfg)
        super().__init__(create_app(cfg, self.orch, run_sweeper=run_sweeper))

    def stop(self) -> None:
        super().stop()
        self.orch.db.dispose()


@contextmanager
def running(cfg: OrchestratorConfig, run_sweeper: bool = True) -> Iterator[Server]:
    s = Server(cfg, run_sweeper).start()
    try:
        yield s
    finally:
        s.stop()


_TOK = None


def fake_model(version: int) -> str:
    """A stand-in policy for checks that fake the model too (tests hand it in as ``Validator(model_loader=...)``)."""
    return f"model-v{version}"


def model_free_checks(vcfg) -> list:  # noqa: ANN001
    """The validator's default checks less those that run the model: what a test without a model can judge
    (a ``Validator`` built with the defaults and no model refuses to start)."""
    from swarmrl.protocol.checks import default_checks
    from swarmrl.protocol.spot_checks import SAMPLED_CHECKS

    return [(name, check) for name, check in default_checks(vcfg) if name not in SAMPLED_CHECKS]


def tokenizer():
    global _TOK
    if _TOK is None:
        from swarmrl.models import build_char_tokenizer

        _TOK = build_char_tokenizer()
    return _TOK


def rollouts_for(node_id: str, a: AssignmentSpec, *, correct: bool = True, forge_rewards: bool = False,
                 policy_version: int | None = None, tasks: list[tuple[str, str, int]] | None = None,
                 bare_prompt: bool = False, length_penalty: float | None = None) -> list[Rollout]:
    """Rows answering assignment ``a``: correct answers (or wrong ones), honest rewards unless forged.
    ``tasks`` overrides the tasks answered (task_id, prompt, answer) to model a node choosing its own. Under a
    thinking budget the prompt states it (unless ``bare_prompt``) and the length penalty is the assigned one
    (unless ``length_penalty`` forges another)."""
    from swarmrl.contract import format_prompt
    from swarmrl.envs import make_env

    tok = tokenizer()
    env = make_env(a.contract.task.name, **a.contract.task.params)
    if tasks is None:
        tasks = [(t.task_id, t.prompt, t.verification_info["answer"]) for t in env.sample(a.seed, len(a.tasks))]
    rows = []
    for gi, (task_id, prompt, answer) in enumerate(tasks):
        for k in range(a.contract.group_size):
            text = str(answer) if correct else str(answer + 1)
            comp = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
            reward = 1.0 if correct else 0.0
            if forge_rewards:
                reward = 1.0
            pen = 0.0 if a.target_length is None else a.contract.budget.penalty * abs(a.target_length - (len(comp) - 1))
            pen = pen if length_penalty is None else length_penalty
            shown = prompt if bare_prompt or a.target_length is None else \
                format_prompt(prompt, a.budget())
            rows.append(Rollout(worker_id=node_id, step=a.step,
                                policy_version=a.policy_version if policy_version is None else policy_version,
                                task_id=task_id, env=a.contract.task.name, group_id=f"{a.assignment_id}-{gi}",
                                prompt_ids=tok.encode(shown, add_special_tokens=False), completion_ids=comp,
                                logprobs=[-0.1] * len(comp), reward=reward - pen, task_reward=reward, length_penalty=pen,
                                target_length=a.target_length, temperature=1.0, finished=True,
                                seed=a.seed, proofs=[]))
    return rows


def write(rows: list[Rollout], path: Path) -> Path:
    return write_rollouts(rows, path)


def join_worker(orch: Orchestrator, now: float):  # noqa: ANN201  # a Principal
    """A fresh key registered as a worker straight through the service (stake 100, self-declared)."""
    from swarmrl.protocol.orchestrator.errors import Principal
    from swarmrl.protocol.schemas import RegisterRequest
    from swarmrl.protocol.signing import node_id_for

    pub = public_key_hex(generate_key())
    p = Principal(node_id_for(pub), pub, "worker", "0" * 64)
    orch.membership.register(p, RegisterRequest(throughput=10.0, stake=100.0), now=now)
    return p
