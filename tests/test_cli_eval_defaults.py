"""`swarmrl eval --model` inside a run dir (or an sft output) defaults to the task the run recorded; --task and
--set still win, and the command says which task it used and where from."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from swarmrl.cli import app
from swarmrl.config import dump_config
from swarmrl.contract import RLContract
from swarmrl.envs.config import TaskConfig
from swarmrl.rl.config import RLConfig


@pytest.fixture
def run_dir(tmp_path):
    """A run dir as `swarmrl run` leaves it: rl.toml (2-digit addition), policy/v000003, final_model (no weights
    needed for --print-config)."""
    root = tmp_path / "run"
    (root / "policy" / "v000003").mkdir(parents=True)
    (root / "policy" / "LATEST").write_text("3")
    (root / "final_model").mkdir()
    (root / "final_model" / "config.json").write_text("{}")
    rl = RLConfig(run_dir=str(root), contract=RLContract(task=TaskConfig(name="add", params={"digits": 2}), chat_template=False))
    rl.eval.max_new_tokens = 6
    (root / "rl.toml").write_text(dump_config(rl))
    return root


def _eval(*argv: str):  # noqa: ANN202
    r = CliRunner().invoke(app, ["eval", *argv, "--print-config"])
    assert r.exit_code == 0, r.output
    return r.stdout, r.stderr


@pytest.mark.parametrize("where", ["final_model", "policy/v000003", "."])
def test_eval_defaults_to_the_runs_task(run_dir, where):
    out, err = _eval("--model", str(run_dir / where))
    assert 'name = "add"' in out and "digits = 2" in out and "max_new_tokens = 6" in out
    assert f'model = "{run_dir / ("final_model" if where == "." else where)}"' in out  # a run dir: its final model
    assert f'eval: task add {{"digits": 2}} from {run_dir / "rl.toml"}' in err


def test_explicit_task_and_params_win(run_dir):
    out, err = _eval("--model", str(run_dir / "final_model"), "--set", "task.params.digits=3")
    assert 'name = "add"' in out and "digits = 3" in out
    assert 'task add {"digits": 3} as given' in err and "records add" in err
    out, err = _eval("--model", str(run_dir / "final_model"), "--task", "mul_add")
    assert 'name = "mul_add"' in out and "digits" not in out and "as given" in err
    out, err = _eval("--model", str(run_dir / "final_model"), "--task", "add")  # same task: the run's params
    assert "digits = 2" in out and "--task/--set agree" in err
    out, _ = _eval("--model", str(run_dir / "final_model"), "--set", "max_new_tokens=9")
    assert "max_new_tokens = 9" in out


def test_no_record_keeps_the_defaults(tmp_path):
    out, err = _eval("--model", str(tmp_path / "some_model"))
    assert 'name = "mul_add"' in out and "no run or sft output" in err


def test_an_sft_output_records_its_task(tmp_path):
    (tmp_path / "sft" / "model").mkdir(parents=True)
    (tmp_path / "sft" / "summary.json").write_text(json.dumps({"task": {"name": "add", "params": {"digits": 2}},
                                                               "chat_template": False}))
    out, err = _eval("--model", str(tmp_path / "sft" / "model"))
    assert "digits = 2" in out and str(tmp_path / "sft" / "summary.json") in err


def test_eval_runs_on_the_recorded_task(run_dir, tiny_model_dir):
    shutil.rmtree(run_dir / "final_model")
    shutil.copytree(tiny_model_dir, run_dir / "final_model")
    r = CliRunner().invoke(app, ["eval", "--model", str(run_dir), "--n", "4"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["task"] == "add" and res["n"] == 4 and res["model"] == str(run_dir / "final_model")
    assert "eval: task add" in r.stderr


def test_eval_takes_the_runs_token_limits_an_older_run_dir_naming_one(run_dir):
    out, _ = _eval("--model", str(run_dir / "final_model"))
    assert "max_new_tokens = 6" in out and "max_trajectory_tokens = 6" in out  # as the run's rl.toml records them
    old = (run_dir / "rl.toml").read_text()
    old = "\n".join(x for x in old.splitlines() if not x.startswith(("max_trajectory_tokens", "max_turn_tokens")))
    (run_dir / "rl.toml").write_text(old.replace("max_new_tokens = 6", "max_new_tokens = 12"))
    out, _ = _eval("--model", str(run_dir / "final_model"))  # a run from before the names: one limit for all
    assert all(f"{k} = 12" in out for k in ("max_new_tokens", "max_trajectory_tokens", "max_turn_tokens")), out
    out, _ = _eval("--model", str(run_dir / "final_model"), "--set", "max_trajectory_tokens=40")
    assert "max_new_tokens = 12" in out and "max_trajectory_tokens = 40" in out
