import pytest
from typer.testing import CliRunner

from swarmrl.cli import app
from swarmrl.config import ConfigError, dump_config, load_config, parse_override
from swarmrl.job import RunConfig
from swarmrl.rl.config import RLConfig


def test_toml_and_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[contract]\nasync_level = 1\n[optim]\nlr = 3e-4\n[contract.task]\nname = "add"\nparams = {digits = 2}\n')
    cfg = load_config(RLConfig, p, ["optim.lr=1e-3", "loss.normalization=sequence", "run_dir=/tmp/x"])
    assert cfg.contract.async_level == 1 and cfg.optim.lr == 1e-3 and cfg.contract.task.params == {"digits": 2}
    assert cfg.loss.normalization == "sequence" and cfg.run_dir == "/tmp/x"


def test_dump_round_trips():
    cfg = load_config(RunConfig, None, ["rl.steps=7", "rl.loss.delta=5.0", "rl.contract.task.params.digits=4"])
    p = dump_config(cfg)
    import tomllib

    again = RunConfig.model_validate(tomllib.loads(p))
    assert again == cfg


@pytest.mark.parametrize("overrides,field", [
    (["contract.async_level=-1"], "contract.async_level"),
    (["async_level=1"], "async_level -> contract.async_level"),
    (["optim.lr=fast"], "optim.lr"),
    (["optim.lrr=1"], "optim.lrr: unknown field"),
    (["loss.normalization=avg"], "loss.normalization"),
    (["contract.sampling.top_p=2"], "contract.sampling.top_p"),
    (["sampling.top_p=0.5"], "sampling -> contract.sampling"),
])
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as e:
        load_config(RLConfig, None, overrides)
    assert field in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(RLConfig, tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(RLConfig, bad)
    bad.write_text("[workers]\nnum = 'two'\n")
    with pytest.raises(ConfigError, match="workers.num"):
        load_config(RLConfig, bad)


def test_override_syntax():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=hello world") == (["a"], "hello world")
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("novalue")
    with pytest.raises(ConfigError, match="dotted field"):
        parse_override("a..b=1")


def test_cli_print_config_and_error_exit_code():
    r = CliRunner().invoke(app, ["eval", "--print-config", "--set", "n=7", "--task", "add"])
    assert r.exit_code == 0 and "n = 7" in r.output and 'name = "add"' in r.output
    r = CliRunner().invoke(app, ["run", "--print-config", "--set", "rl.steps=0"])
    assert r.exit_code == 2 and "rl.steps" in r.output
    for cmd in (["run"], ["sft"], ["rl", "trainer"], ["model", "init", "--out", "x"]):
        r = CliRunner().invoke(app, [*cmd, "--print-config"])
        assert r.exit_code == 0, (cmd, r.output)
