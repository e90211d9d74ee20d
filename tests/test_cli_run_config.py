"""One config for every command: ``swarmrl eval``, ``sft`` and ``filter`` take the run config of ``swarmrl run``
(configs/run.toml, configs/smollm2.toml) and read its task, params (answer rule and prompt included), chat template
and answer length from it; --set and the commands' own options still win, and each command's own config files
still work. A model directory that is not there is said to be missing (exit 2), not looked up as a hub repo id."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from swarmrl.cli import app
from swarmrl.config import load_config
from swarmrl.eval.config import EvalConfig
from swarmrl.job.config import RunConfig
from swarmrl.sft.config import SFTConfig

REPO = Path(__file__).resolve().parents[1]
RUN_CONFIGS = ["configs/run.toml", "configs/smollm2.toml", "configs/smollm2_chain_sum.toml", "configs/calc.toml"]


def _print_config(*argv: str) -> dict:
    r = CliRunner().invoke(app, [*argv, "--print-config"])
    assert r.exit_code == 0, r.output
    return tomllib.loads(r.stdout)


@pytest.mark.parametrize("path", RUN_CONFIGS)
def test_eval_reads_the_run_configs_task_template_and_answer_length(path):
    run = load_config(RunConfig, REPO / path)
    cfg = EvalConfig.model_validate(_print_config("eval", "-c", str(REPO / path), "--model", "some/model"))
    assert cfg.task == run.rl.contract.task and cfg.chat_template == run.rl.contract.chat_template
    assert cfg.max_new_tokens == run.rl.eval.max_new_tokens and cfg.n == run.final_eval_n
    assert cfg.model == "some/model"
    # no --model: the run's initial model, i.e. the model before the run
    assert _print_config("eval", "-c", str(REPO / path))["model"] == run.rl.model


def test_the_chat_models_question_and_answer_rule_come_along_and_set_still_wins():
    cfg = _print_config("eval", "-c", str(REPO / "configs/smollm2.toml"), "--set", "task.params.digits=2",
                        "--n", "5")
    params = cfg["task"]["params"]
    assert params["answer"] == "last_number" and params["prompt"].startswith("What is")
    assert params["digits"] == 2 and cfg["n"] == 5 and cfg["chat_template"] is True


@pytest.mark.parametrize("path", RUN_CONFIGS)
def test_sft_reads_the_run_configs_warm_start(path):
    run = load_config(RunConfig, REPO / path)
    cfg = SFTConfig.model_validate(_print_config("sft", "-c", str(REPO / path)))
    want = run.warmstart.sft.model_copy(update={"task": run.rl.contract.task, "chat_template": run.rl.contract.chat_template})
    assert cfg == want
    assert _print_config("sft", "-c", str(REPO / path), "--minutes", "0.5")["minutes"] == 0.5


def test_filter_reads_the_run_configs_model_task_and_sampling():
    run = load_config(RunConfig, REPO / "configs/smollm2.toml")
    cfg = _print_config("filter", "-c", str(REPO / "configs/smollm2.toml"))
    assert cfg["model"] == run.rl.model and cfg["task"] == run.rl.contract.task.model_dump()
    assert cfg["chat_template"] is True and cfg["samples"] == run.rl.contract.group_size
    assert cfg["sampling"] == run.rl.contract.sampling.model_dump()


def test_each_commands_own_config_file_still_works(tmp_path):
    own = tmp_path / "eval.toml"
    own.write_text('model = "m"\nn = 7\n[task]\nname = "add"\nparams = { digits = 3 }\n')
    cfg = _print_config("eval", "-c", str(own))
    assert cfg["n"] == 7 and cfg["task"]["params"] == {"digits": 3}
    own.write_text('minutes = 0.25\n[task]\nname = "add"\n')
    assert _print_config("sft", "-c", str(own))["minutes"] == 0.25
    own.write_text('samples = 3\n[task]\nname = "add"\n')
    assert _print_config("filter", "-c", str(own))["samples"] == 3


def test_a_file_that_mixes_both_shapes_or_a_bad_run_config_is_refused_naming_the_field(tmp_path):
    mixed = tmp_path / "mixed.toml"
    mixed.write_text('n = 3\n[rl]\nsteps = 5\n')
    r = CliRunner().invoke(app, ["eval", "-c", str(mixed), "--print-config"])
    assert r.exit_code == 2 and "rl: unknown field" in r.stderr
    bad = tmp_path / "bad_run.toml"
    bad.write_text('[rl]\nsteps = -1\n')
    r = CliRunner().invoke(app, ["eval", "-c", str(bad), "--print-config"])
    assert r.exit_code == 2 and "rl.steps" in r.stderr


@pytest.mark.parametrize("command", ["eval", "filter", "sft"])
def test_a_missing_model_directory_is_a_usage_error(command, tmp_path):
    r = CliRunner().invoke(app, [command, "--model", "/no/such/dir"])  # refused before anything is loaded or written
    assert r.exit_code == 2, r.output
    assert "model directory /no/such/dir does not exist" in r.stderr and "Repo id" not in r.stderr
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(app, [command, "--model", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "not a Hugging Face model directory (no config.json)" in r.stderr, r.output
