"""An internal error of the validator never slashes an honest node.

The shipped ``configs/validator.toml`` used to name ``swarmrl.toploc:verify_rollout`` (the one-row function)
as the batched TOPLOC check: it raised TypeError on ``batch_size`` for every submission and the validator
counted the crash as a failed check, slashing and ejecting every honest node. Now a check that raises is an
internal error: nothing is posted, the submission stays pending and is retried (bounded, with backoff), and a
health counter shows it. The shipped configs all load with their command's config model, and the validator
one accepts honest work made with a real model and rejects a forgery."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from protocol_support import make_cfg, running, write

import swarmrl
from attacks._honest import honest_rows
from swarmrl.config import load_config
from swarmrl.protocol.checks import default_checks
from swarmrl.protocol.client import NodeClient, ValidatorClient
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.signing import generate_key, save_private_key
from swarmrl.protocol.validator import Validator
from swarmrl.utils.metrics import read_metrics

ROOT = Path(swarmrl.__file__).resolve().parents[1]  # the tree under test
CONFIGS = ROOT / "configs"

# configs/validator.toml as shipped before the fix
SHIPPED_BEFORE = """
orchestrator = "http://127.0.0.1:8700"
key = "runs/keys/validator.pem"
model_dir = ""
run_secret = "change-me"
poll_interval_s = 2.0
model_dir_template = ""
toploc_check = "swarmrl.toploc:verify_rollout"
sampling_claim = "swarmrl.toploc.rollout:claim_from_rollout"
sampling_check = ""
require_proofs = false
"""

# every shipped config and the config model of the command that reads it (the class a swarmrl/cli module
# passes to resolve(); checked below against the CLI's source)
CONFIG_MODELS = {
    "calc.toml": ("swarmrl.job.config", "RunConfig"),
    "diloco.toml": ("swarmrl.diloco.config", "DilocoConfig"),
    "orchestrator.toml": ("swarmrl.protocol.config", "OrchestratorConfig"),
    "quickstart.toml": ("swarmrl.job.config", "RunConfig"),
    "run.toml": ("swarmrl.job.config", "RunConfig"),
    "smollm2.toml": ("swarmrl.job.config", "RunConfig"),
    "smollm2_chain_sum.toml": ("swarmrl.job.config", "RunConfig"),
    "smollm2_lora.toml": ("swarmrl.job.config", "RunConfig"),
    "shardcast_fetch.toml": ("swarmrl.shardcast.config", "FetchConfig"),
    "shardcast_relay.toml": ("swarmrl.shardcast.config", "RelayConfig"),
    "toploc_calibrate.toml": ("swarmrl.toploc.calibrate", "CalibrateConfig"),
    "validator.toml": ("swarmrl.protocol.config", "ValidatorConfig"),
}


def test_every_shipped_config_loads_with_its_commands_model():
    import importlib

    from swarmrl.protocol.validator import config_problems

    assert sorted(p.name for p in CONFIGS.glob("*.toml")) == sorted(CONFIG_MODELS), "a shipped config without a model"
    cli_src = "\n".join(p.read_text() for p in (ROOT / "swarmrl" / "cli").glob("*.py"))
    for name, (mod, cls) in CONFIG_MODELS.items():
        assert re.search(rf"resolve\(\s*(\w+ if \w+ else )?{cls}\b", cli_src), f"no CLI command resolves {cls}"
        model = getattr(importlib.import_module(mod), cls)
        cfg = load_config(model, CONFIGS / name)
        assert isinstance(cfg, model)
    vcfg = load_config(ValidatorConfig, CONFIGS / "validator.toml")
    # shipped without a model: refused until one is named (or cheap_checks_only says the model checks may not run)
    (problem,) = config_problems(vcfg)
    assert problem.startswith("no model_dir")
    assert config_problems(vcfg.model_copy(update={"model_dir": str(CONFIGS)})) == []  # any existing dir: no more


def test_the_old_shipped_validator_config_is_refused_at_startup(tmp_path):
    from swarmrl.protocol.validator import config_problems

    (tmp_path / "v.toml").write_text(SHIPPED_BEFORE)
    problems = config_problems(load_config(ValidatorConfig, tmp_path / "v.toml"))
    assert len(problems) == 2 and problems[0].startswith("toploc_check = 'swarmrl.toploc:verify_rollout'"), problems
    assert problems[1].startswith("no model_dir")  # and it had no model either
    assert "batch_size" in problems[0]
    from typer.testing import CliRunner

    from swarmrl.cli import app

    r = CliRunner().invoke(app, ["validator", "run", "-c", str(tmp_path / "v.toml")])
    assert r.exit_code == 2 and "toploc_check" in r.output and "batch_size" in r.output, r.output


def _validator(toml: Path, srv, keys, tmp: Path, model_dir: Path, *extra: str,  # noqa: ANN001
               checks_of: Path | None = None) -> Validator:
    """The validator of ``toml``; with ``checks_of``, running the checks of that config instead (what a config
    refused at startup would do at run time: the validator itself is built from a sound one)."""
    key = tmp / "validator.pem"
    if not key.exists():
        save_private_key(keys["validator"], key)
    sets = [f"orchestrator={json.dumps(srv.url)}", f"key={json.dumps(str(key))}",
            f"model_dir={json.dumps(str(model_dir))}", 'run_secret="test-secret"',
            f"work_dir={json.dumps(str(tmp / 'val'))}", *extra]
    checks = None if checks_of is None else default_checks(load_config(ValidatorConfig, checks_of, sets))
    return Validator(load_config(ValidatorConfig, toml, sets), checks=checks)


def _node(srv) -> NodeClient:  # noqa: ANN001
    n = NodeClient(srv.url, generate_key())
    n.register(throughput=10.0, stake=200.0)
    return n


@pytest.fixture()
def swarm(tmp_path):
    cfg, keys = make_cfg(tmp_path, tasks_per_node=2, contract={"group_size": 2}, slash_fraction=0.5)
    with running(cfg, run_sweeper=False) as srv:
        yield srv, keys, tmp_path


def test_shipped_validator_config_accepts_honest_work_and_rejects_forgery(swarm, tiny_model_dir):
    srv, keys, tmp = swarm
    val = _validator(CONFIGS / "validator.toml", srv, keys, tmp, tiny_model_dir)
    honest, forger, editor = _node(srv), _node(srv), _node(srv)
    a = honest.heartbeat().assignments[0]
    sid = honest.submit(a.assignment_id, write(honest_rows(tiny_model_dir, honest.node_id, a, seed=1),
                                               tmp / "h.parquet")).submission_id
    [(got, v)] = val.run_once()
    assert got == sid and v.accepted, v.reason
    ran = {c.name for c in v.checks if not c.skipped}
    assert ran >= {"schema", "seed", "tasks", "policy", "proofs", "replay", "logprobs", "toploc", "sampling", "rewards"}, v.checks
    assert honest.ledger().credits_locked > 0
    # forged rewards: every answer claimed right
    b = forger.heartbeat().assignments[0]
    rows = honest_rows(tiny_model_dir, forger.node_id, b, seed=2)
    for r in rows:
        r.reward, r.task_reward = r.reward + 1.0 - r.task_reward, 1.0
    forger.submit(b.assignment_id, write(rows, tmp / "f.parquet"))
    # tokens edited after sampling (a "better" answer spliced in), proofs and logprobs kept
    c = editor.heartbeat().assignments[0]
    rows = honest_rows(tiny_model_dir, editor.node_id, c, seed=3)
    rows[0].completion_ids = [(t + 7) % 200 + 3 for t in rows[0].completion_ids[:-1]] + rows[0].completion_ids[-1:]
    editor.submit(c.assignment_id, write(rows, tmp / "e.parquet"))
    verdicts = dict(val.run_once())
    assert len(verdicts) == 2 and not any(v.accepted for v in verdicts.values())
    reasons = sorted(v.reason.split(":")[0] for v in verdicts.values())
    assert reasons[0] in ("logprobs", "toploc", "sampling") and reasons[1] == "rewards", reasons
    assert forger.ledger().status == "ejected" and editor.ledger().status == "ejected"
    assert honest.ledger().status == "active"
    assert val.internal_errors == 0


def _honest_submissions(srv, tmp: Path, model_dir: Path, n: int, seed: int) -> tuple[list[NodeClient], list[int]]:  # noqa: ANN001
    nodes, sids = [_node(srv) for _ in range(n)], []
    for i, node in enumerate(nodes):
        a = node.heartbeat().assignments[0]
        rows = honest_rows(model_dir, node.node_id, a, seed=seed + i)
        sids.append(node.submit(a.assignment_id, write(rows, tmp / f"h{seed + i}.parquet")).submission_id)
    return nodes, sids


def test_old_shipped_config_never_slashes(swarm, tiny_model_dir):
    """The config that slashed every honest node (TypeError on batch_size in the TOPLOC check): now nothing is
    posted, the submissions stay pending, no stake is lost; the health counter shows it."""
    srv, keys, tmp = swarm
    (tmp / "old.toml").write_text(SHIPPED_BEFORE)
    with pytest.raises(ValueError, match="toploc_check.*batch_size"):  # refused at startup now
        _validator(tmp / "old.toml", srv, keys, tmp, tiny_model_dir)
    val = _validator(CONFIGS / "validator.toml", srv, keys, tmp, tiny_model_dir, checks_of=tmp / "old.toml")
    nodes, sids = _honest_submissions(srv, tmp, tiny_model_dir, 3, seed=10)
    assert val.run_once() == []  # nothing posted
    for n, sid in zip(nodes, sids):
        assert n.submission(sid).status == "pending"
        bal = n.ledger()
        assert bal.status == "active" and bal.stake == 200.0
    assert val.internal_errors == 3
    rows = read_metrics(tmp / "val" / "metrics.jsonl")
    assert [r["event"] for r in rows] == ["internal_error"] * 3 and rows[-1]["validator_internal_errors"] == 3
    assert all("toploc" in r["error"] and "TypeError" in r["error"] and "batch_size" in r["error"] for r in rows)


def test_internal_errors_are_retried_with_backoff_then_left_pending(swarm, tiny_model_dir):
    srv, keys, tmp = swarm
    (tmp / "old.toml").write_text(SHIPPED_BEFORE)
    val = _validator(CONFIGS / "validator.toml", srv, keys, tmp, tiny_model_dir, "internal_error_retries=2",
                     "internal_error_backoff_s=30.0", "internal_error_backoff_max_s=45.0", checks_of=tmp / "old.toml")
    now = [1000.0]
    val._clock = lambda: now[0]
    nodes, sids = _honest_submissions(srv, tmp, tiny_model_dir, 2, seed=20)
    assert val.run_once() == [] and val.internal_errors == 2
    assert val.run_once() == [] and val.internal_errors == 2  # inside the backoff: not judged again
    now[0] += 30.0
    assert val.run_once() == [] and val.internal_errors == 4  # retried once the backoff passed
    now[0] += 44.0
    assert val.run_once() == [] and val.internal_errors == 4  # the backoff doubled (capped at 45 s)
    now[0] += 1.0
    assert val.run_once() == [] and val.internal_errors == 6  # third attempt: the 2 retries are spent
    assert val.left_pending == sorted(sids)
    now[0] += 10_000.0
    assert val.run_once() == [] and val.internal_errors == 6  # given up: left pending, never rejected
    for n, sid in zip(nodes, sids):
        assert n.submission(sid).status == "pending" and n.ledger().status == "active"
    rows = [r for r in read_metrics(tmp / "val" / "metrics.jsonl") if r.get("event") == "internal_error"]
    assert len(rows) == 6 and rows[-1]["validator_internal_errors"] == 6
    assert [r["retry_in_s"] for r in rows if r["submission_id"] == sids[0]] == [30.0, 45.0, None]
    assert val.health()["validator_internal_errors"] == 6 and val.health()["left_pending"] == sorted(sids)
    # the fixed config judges the very same submissions: accepted
    good = _validator(CONFIGS / "validator.toml", srv, keys, tmp, tiny_model_dir)
    assert sorted((s, v.accepted) for s, v in good.run_once()) == [(s, True) for s in sorted(sids)]
    assert val.run_once() == [] and val.left_pending == []  # decided elsewhere: forgotten


def test_a_crashing_check_is_retried_then_judged(swarm, tiny_model_dir):
    """A check that raises (OOM, a bug) defers the submission; once it works, the verdict is posted."""
    srv, keys, tmp = swarm
    val = _validator(CONFIGS / "validator.toml", srv, keys, tmp, tiny_model_dir, "internal_error_backoff_s=0.0")
    calls = []

    def flaky(ctx):  # noqa: ANN001
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory")
        return True, "fine"

    val.checks = val.checks[:2] + [("flaky", flaky)] + val.checks[2:]
    n = _node(srv)
    a = n.heartbeat().assignments[0]
    sid = n.submit(a.assignment_id, write(honest_rows(tiny_model_dir, n.node_id, a, seed=5), tmp / "h.parquet")
                   ).submission_id
    assert val.run_once() == [] and val.internal_errors == 1 and n.submission(sid).status == "pending"
    [(got, v)] = val.run_once()
    assert got == sid and v.accepted, v.reason
    assert len(calls) == 2 and n.submission(sid).status == "accepted"


class _CorruptingClient(ValidatorClient):
    """The file arrives damaged (a storage or transfer fault on our side: the orchestrator checked the node's
    signed hash when it took the upload)."""

    def fetch_file(self, submission_id: int, out, inline=None, max_bytes: int = 256 << 20) -> str:  # noqa: ANN001
        sha = super().fetch_file(submission_id, out, inline, max_bytes)
        data = bytearray(Path(out).read_bytes())
        data[len(data) // 2] ^= 0xFF
        Path(out).write_bytes(bytes(data))
        return "0" * 64 if sha != "0" * 64 else "1" * 64


def test_a_damaged_download_is_not_the_nodes_fault(swarm, tiny_model_dir):
    srv, keys, tmp = swarm
    cfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp / "val"), model_dir=str(tiny_model_dir))
    val = Validator(cfg, client=_CorruptingClient(srv.url, keys["validator"]))
    n = _node(srv)
    a = n.heartbeat().assignments[0]
    sid = n.submit(a.assignment_id, write(honest_rows(tiny_model_dir, n.node_id, a, seed=6), tmp / "h.parquet")
                   ).submission_id
    assert val.run_once() == []
    assert n.submission(sid).status == "pending" and n.ledger().status == "active"
    assert val.internal_errors == 1


def test_hostile_rows_are_findings_not_crashes(swarm, tiny_model_dir):
    """Token ids past the vocabulary and over-long rows are found by explicit validation (a reason naming the
    row), before any model runs; a crash would now be an internal error and let the cheat go unpunished."""
    srv, keys, tmp = swarm
    val = _validator(CONFIGS / "validator.toml", srv, keys, tmp, tiny_model_dir)
    cheat = _node(srv)
    a = cheat.heartbeat().assignments[0]
    rows = honest_rows(tiny_model_dir, cheat.node_id, a, seed=7)
    rows[1].completion_ids = rows[1].completion_ids[:-1] + [1_000_000]
    cheat.submit(a.assignment_id, write(rows, tmp / "x.parquet"))
    [(_, v)] = val.run_once()
    assert not v.accepted and v.reason.startswith("schema: row 1: token id 1000000 outside"), v.reason
    assert val.internal_errors == 0 and cheat.ledger().status == "ejected"


def test_a_sandbox_that_does_not_start_is_an_internal_error(monkeypatch):
    """The code verifier's own failure (the sandbox launcher died) gives 0 to workers, but raises in the
    validator (strict), so it cannot read as a wrong answer."""
    from swarmrl.envs import VerifierUnavailable, make_env
    from swarmrl.envs import code as code_mod
    from swarmrl.envs.sandbox import _error_run

    env = make_env("code")
    task = env.sample(0, 1)[0]
    monkeypatch.setattr(code_mod, "run_program", lambda program, cases, *a, **k: _error_run(
        "namespaces", len(cases), "sandbox failed (rc=125): sandbox launcher: unshare: Operation not permitted",
        internal=True))
    assert env.verify(task, "print(1)") == 0.0
    env.strict = True
    with pytest.raises(VerifierUnavailable, match="unshare"):
        env.verify(task, "print(1)")
    # the program's own fault stays a 0 even when strict
    monkeypatch.setattr(code_mod, "run_program", lambda program, cases, *a, **k: _error_run(
        "namespaces", len(cases), "program too large or not text"))
    assert env.verify(task, "print(1)") == 0.0
