"""Hostile outsiders: numbers from outside. NaN and infinities are refused at the boundary (every float column
of a rollout file, every JSON body of the orchestrator, as 422 and never 500), and a trainer step whose loss or
gradient is not finite anyway is skipped and counted, the weights kept and the run going on."""

from __future__ import annotations

import httpx
import pytest
import torch
from protocol_support import make_cfg, rollouts_for, running, write

from attacks._honest import row
from swarmrl.contract import RLContract, Rollout
from swarmrl.envs.config import TaskConfig
from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.signing import generate_key, sign_request
from swarmrl.rl.config import EvalSection, RLConfig
from swarmrl.rollouts.wire import RolloutError, read_rollouts, write_rollouts
from swarmrl.training.checkpoint import read_saved_state
from swarmrl.utils.metrics import read_metrics

FLOATS = ["reward", "task_reward", "length_penalty", "temperature"]
BAD = [float("nan"), float("inf"), float("-inf")]


# ---- rollout files ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", BAD, ids=str)
@pytest.mark.parametrize("column", ["logprobs", *FLOATS])
def test_nonfinite_values_in_files_refused_with_the_column_named(tmp_path, column, value):
    bad = {column: [-0.5, value]} if column == "logprobs" else {column: value}
    p = write_rollouts([row(), row(**bad)], tmp_path / "x.parquet")
    with pytest.raises(RolloutError, match=rf"row 1: .*column '{column}'"):
        read_rollouts(p)


def test_minus_infinity_logprobs_refused_at_upload(tmp_path):
    """-inf passed the old ``lp <= 0`` test: the file went in and the trainer's loss went NaN."""
    cfg, _ = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        a = node.heartbeat().assignments[0]
        rows = rollouts_for(node.node_id, a)
        rows[1].logprobs = [float("-inf")] * len(rows[1].logprobs)
        with pytest.raises(ApiError) as e:
            node.submit(a.assignment_id, write(rows, tmp_path / "inf.parquet"))
        assert e.value.status == 422 and "column 'logprobs'" in e.value.detail, e.value
        assert srv.orch.telemetry.counters["uploads"] == 0


# ---- JSON bodies -----------------------------------------------------------------------------------------
def _post(url: str, key, path: str, body: bytes) -> httpx.Response:  # noqa: ANN001
    headers = sign_request(key, "POST", path, body)
    headers["Content-Type"] = "application/json"
    return httpx.post(url + path, content=body, headers=headers)


@pytest.mark.parametrize("who,path,body,finite", [
    ("new", "/v1/nodes/register", b'{"throughput": NaN, "stake": 100.0}', b'{"throughput": 1, "stake": 100.0}'),
    ("new", "/v1/nodes/register", b'{"throughput": 10.0, "stake": Infinity}', b'{"throughput": 10.0, "stake": 1e3}'),
    ("new", "/v1/nodes/register", b'{"throughput": 10.0, "stake": 100.0, "hardware": {"gpus": [1, -Infinity]}}',
     b'{"throughput": 10.0, "stake": 100.0, "hardware": {"gpus": [1, -1]}}'),
    ("node", "/v1/nodes/heartbeat", b'{"status": {"load": NaN}}', b'{"status": {"load": 0.5}}'),
    ("validator", "/v1/validator/verdicts", b'{"submission_id": NaN, "accepted": true}',
     b'{"submission_id": 1, "accepted": true}'),
    ("trainer", "/v1/trainer/step", b'{"step": Infinity, "policy_version": 0}', b'{"step": 1, "policy_version": 0}'),
    ("trainer", "/v1/trainer/step", b'{"step": 1, "policy_version": -Infinity}', b'{"step": 1, "policy_version": 1}'),
])
def test_nonfinite_json_bodies_get_422_not_500(tmp_path, who, path, body, finite):
    cfg, keys = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        key = {"new": generate_key(), "node": node.key, **keys}[who]
        r = _post(srv.url, key, path, body)
        assert r.status_code == 422, (r.status_code, r.text)
        assert "detail" in r.json()  # a JSON reason (the refused value quoted as a string), not a server error
        if who == "new":  # nobody was registered
            assert httpx.get(f"{srv.url}/v1/health").json()["nodes_active"] == 1
        # the orchestrator is unharmed: the same call with finite numbers goes through (404: no submission 1)
        ok = _post(srv.url, key, path, finite)
        assert ok.status_code in ((404,) if who == "validator" else (200,)), (ok.status_code, ok.text)


# ---- the trainer's guard ---------------------------------------------------------------------------------
def _group(reward0: float) -> list[Rollout]:
    return [row(step=0, policy_version=0, reward=reward0, prompt_ids=[5, 6, 7], completion_ids=[8, 9],
                logprobs=[-1.0, -1.0], group_id="g"),
            row(step=0, policy_version=0, reward=0.0, prompt_ids=[5, 6, 7], completion_ids=[9, 8],
                logprobs=[-1.0, -1.0], group_id="g")]


def test_nonfinite_step_is_skipped_counted_and_the_run_goes_on(tmp_path, tiny_model_dir, monkeypatch):
    from swarmrl.rl.trainer import Batch, Trainer  # noqa: PLC0415  # lazy: torch

    cfg = RLConfig(run_dir=str(tmp_path / "run"), model=str(tiny_model_dir), contract=RLContract(task=TaskConfig(name="add"), async_level=0, group_size=2, filter_ties=False), steps=2,
                   keep_versions=3, prompts_per_step=1,
                   eval=EvalSection(every_steps=0, n=2, max_new_tokens=2))
    t = Trainer(cfg)
    # step 0's group has a NaN reward (its advantages, and so the loss, are NaN); step 1's is honest
    batches = {0: Batch([_group(float("nan"))], ["bad"], 0.0), 1: Batch([_group(1.0)], ["good"], 0.0)}
    monkeypatch.setattr(t, "collect_batch", lambda step, deadline: batches[step])
    assert t.run_loop() == 2  # no FloatingPointError: the run finishes

    def weights(v: int) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file  # noqa: PLC0415  # lazy: only this test reads checkpoints

        return load_file(t.run.version_dir(v) / "model.safetensors")

    w0, w1, w2 = weights(0), weights(1), weights(2)
    assert all(torch.isfinite(x).all() for x in w1.values())
    # the skipped step changed nothing: version 1 is version 0's weights as published (their bfloat16 cast; version 0,
    # the base, is stored as it is)
    assert all(torch.equal(w0[k].to(w1[k].dtype), w1[k]) for k in w0)
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)  # the next one trained
    rows = {r["step"]: r for r in read_metrics(t.run.metrics / "trainer.jsonl") if "reward" in r}
    assert (rows[0]["nonfinite_skipped"], rows[0]["nonfinite_total"]) == (1, 1)
    assert (rows[1]["nonfinite_skipped"], rows[1]["nonfinite_total"]) == (0, 1)
    assert read_saved_state(t.run.version_dir(2))["trainer"]["nonfinite_total"] == 1
