"""DiLoCo and the DDP baseline with real worker processes over torch.distributed gloo on 127.0.0.1."""

import json

import pytest
import torch
from typer.testing import CliRunner

from swarmrl.config import ConfigError, load_config
from swarmrl.diloco import DilocoConfig, run
from swarmrl.diloco.launch import WorkerFailed
from swarmrl.utils.metrics import read_metrics

torch.set_num_threads(1)


def _tiny(tmp_path, **kw) -> DilocoConfig:
    base = dict(out=str(tmp_path / "run"), workers=2, total_steps=12, inner_steps=4, warmup_steps=2, batch_size=4,
                seq_len=32, eval_seqs=4, timeout_s=240, save_final_params=True)
    base.update(kw)
    return DilocoConfig(**base)


def test_two_workers_identical_after_every_round_fp16(tmp_path):
    cfg = _tiny(tmp_path, wire="fp16")
    s = run(cfg)
    out = tmp_path / "run"
    logs = [[r for r in read_metrics(out / f"worker{k}.jsonl") if "round" in r and "final" not in r] for k in (0, 1)]
    assert [r["round"] for r in logs[0]] == [1, 2, 3] == [r["round"] for r in logs[1]]
    for a, b in zip(*logs):
        assert a["digest"] == b["digest"] and a["group_size"] == 2
    p0, p1 = (torch.load(out / f"worker{k}.params.pt") for k in (0, 1))
    assert torch.equal(p0, p1)
    # the workers did move apart between syncs (different data), so the equality is the averaging's
    w = [json.loads((out / f"worker{k}.summary.json").read_text()) for k in (0, 1)]
    assert w[0]["final_train_loss"] != w[1]["final_train_loss"]
    # bytes handed to all_reduce: one fp16 vector of all parameters per round
    assert s["identical_params"] and s["sync_calls_per_worker"] == 3
    assert s["bytes_sent_per_worker"] == 3 * s["params"] * 2
    assert s["final_eval_loss"] < s["evals"][0]["eval_loss"]


def test_cli_ddp_baseline_allreduces_every_step(tmp_path):
    from swarmrl.cli import app

    res = CliRunner().invoke(app, ["diloco", "--ddp", "--workers", "2", "--steps", "5", "--out", str(tmp_path / "run"),
                                   "--set", "warmup_steps=1", "--set", "batch_size=4", "--set", "seq_len=32",
                                   "--set", "eval_seqs=4"])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["mode"] == "ddp" and s["identical_params"]
    assert s["sync_calls_per_worker"] == 5
    assert s["bytes_sent_per_worker"] == 5 * s["params"] * 4


def test_config_rejects_ddp_on_hivemind_and_bad_fields(tmp_path):
    with pytest.raises(ConfigError, match="ddp"):
        load_config(DilocoConfig, overrides=['mode="ddp"', 'backend="hivemind"'])
    with pytest.raises(ConfigError, match="inner_steps"):
        load_config(DilocoConfig, overrides=["inner_steps=0"])
    from swarmrl.cli import app

    res = CliRunner().invoke(app, ["diloco", "--set", "wire=\"int4\""])
    assert res.exit_code == 2


def test_failing_worker_is_reported(tmp_path):
    # an unknown task: the worker process exits non-zero before training; the launcher says which
    cfg = _tiny(tmp_path, workers=1)
    cfg.task.name = "no_such_task"
    with pytest.raises(WorkerFailed, match="worker 0"):
        run(cfg)
