"""Per-model TOPLOC thresholds: `swarmrl toploc calibrate` writes the model's calibration file, the validator
(and `toploc verify`) use it for the policy version they check, config values override it, and a corrupt or
hostile file is refused with a reason (an internal error for the validator, never a crash or a slashed node)."""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from swarmrl.cli import app
from swarmrl.contract import RLContract, Rollout
from swarmrl.inference.sampler import generate
from swarmrl.models import load_model, load_tokenizer
from swarmrl.protocol.checks import toploc_check
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.validator import Validator, config_problems, judge
from swarmrl.rollouts.wire import write_rollouts
from swarmrl.toploc.proof import build_proofs
from swarmrl.toploc.recommend import recommend
from swarmrl.toploc.thresholds_file import (
    CALIBRATION_FILE,
    MAX_CALIBRATION_BYTES,
    CalibrationError,
    read_calibration,
    toploc_settings,
)

torch.set_num_threads(1)
STRICT = {"max_exp_mismatches": 0, "max_mant_err_mean": 0.0, "max_mant_err_median": 0.0}


@pytest.fixture(scope="module")
def calibrated(tiny_model_dir, tmp_path_factory):
    """A copy of the tiny model with a calibration file made by the CLI (default location)."""
    d = tmp_path_factory.mktemp("cal") / "model"
    shutil.copytree(tiny_model_dir, d)
    res = CliRunner().invoke(app, ["toploc", "calibrate", "--model", str(d), "--set", "n_prompts=3",
                                   "--set", "max_new_tokens=34", "--set", "batch_sizes=[1, 3]", "--set", "threads=[1]",
                                   "--set", "weight_tampering=false"])
    assert res.exit_code == 0, res.output
    assert f"written to {d / CALIBRATION_FILE}" in res.output.replace("\n", "")
    return d


def _strict_file(d, **thresholds) -> None:
    p = d / CALIBRATION_FILE
    cal = json.loads(p.read_text())
    cal["thresholds"] = {**cal["thresholds"], **(thresholds or STRICT)}
    p.write_text(json.dumps(cal))


def test_calibrate_writes_a_file_the_verifiers_accept(calibrated):
    cal = read_calibration(calibrated, chunk=32, k=128)
    assert cal is not None and cal.separable
    rec = cal.figures["recommendation"]
    assert rec["edits"] > 0 and rec["edits_passing"] == 0 and rec["honest_failing"] == 0
    assert cal.model.arch["hidden_size"] == 64 and cal.proof.k == 128 and cal.sampling["max_logprob_diff"] > 0
    names = {s["scenario"]: s for s in cal.figures["scenarios"]}
    assert names["tampered: one-token edit, second-to-last token"]["toploc_fail_rate_recommended"] == 1.0
    assert all(s["toploc_fail_rate_recommended"] == 0 for s in names.values() if s["honest"])
    with pytest.raises(CalibrationError, match="k = 128; proofs here use k = 64"):
        read_calibration(calibrated, k=64)


def test_calibrate_out_and_no_write(calibrated, tmp_path):
    out = tmp_path / "th.json"
    res = CliRunner().invoke(app, ["toploc", "calibrate", "--model", str(calibrated), "--out", str(out), "--no-write",
                                   "--set", "n_prompts=2", "--set", "max_new_tokens=8", "--set", "batch_sizes=[1]",
                                   "--set", "threads=[1]", "--set", "weight_tampering=false"])
    assert res.exit_code == 0 and "not written" in res.output and not out.exists(), res.output


def test_recommend_tightens_until_edits_fail_and_reports_overlap():
    honest = [[(0, 0.0, 0.0)]] * 4
    edits = [[(1, 0.85, 0.0)], [(2, 0.37, 0.0)], [(5, 0.0, 0.0)], [(40, 12.0, 9.0)]]
    r = recommend(honest, edits, margin=2.0)
    assert r.edits_passing_margin == 2 and r.edits_passing == 0 and r.separable and r.honest_failing == 0
    # one exponent mismatch allowed, and the edit only the mean catches (1, 0.85) is split halfway from honest
    assert r.thresholds.max_exp_mismatches == 1 and r.thresholds.max_mant_err_mean == pytest.approx(0.425)
    r = recommend(honest, [*edits, [(0, 0.0, 0.0)]], margin=2.0)  # an edit identical to honest: no separation
    assert not r.separable and r.edits_passing == 1 and "overlap" in r.note


CONTRACT = RLContract(sampling={"max_new_tokens": 20})  # what the rows below are sampled under


def _rows(model_dir, noise: float = 0.0) -> list[Rollout]:
    """Honest rows of the model; ``noise`` scales the committed states (another honest kernel's rounding)."""
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("1+1=", "hello there", "12*3+4=")]
    out = generate(model, prompts, CONTRACT.sampling, tok.eos_token_id, tok.pad_token_id,
                   capture_hidden=True, generator=torch.Generator().manual_seed(0))
    return [Rollout("n", 0, 0, f"t{i}", "mul_add", f"g{i}", p, c, lp, 0.0, 0.0, 0.0, None, 1.0, f, 0,
                    build_proofs(h.float() * (1 + noise)))
            for i, (p, c, lp, f, h) in enumerate(zip(out.prompt_ids, out.completion_ids, out.logprobs, out.finished,
                                                     out.hidden))]


def _validator(model_dir, tmp_path, **cfg_kw) -> Validator:
    cfg = ValidatorConfig(model_dir=str(model_dir), work_dir=str(tmp_path / "v"), logprob_rows=0, **cfg_kw)
    return Validator(cfg, client=object(), checks=[("toploc", toploc_check(cfg))])


def _judge(model_dir, tmp_path, rows, val: Validator | None = None, **cfg_kw):
    val = val or _validator(model_dir, tmp_path, **cfg_kw)
    cfg = val.cfg
    path = write_rollouts(rows, tmp_path / "r.parquet")
    item = SimpleNamespace(submission=SimpleNamespace(submission_id=1),
                           assignment=SimpleNamespace(contract=CONTRACT))
    return judge(path, item, cfg, val.checks, val.tokenizer, val.load_model, val.vocab_size, val._toploc_settings)


def test_validator_uses_the_model_dirs_thresholds_and_config_overrides_them(calibrated, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(calibrated, d)
    rows = _rows(d, noise=4e-3)  # states off by about one bf16 ulp: honest noise within the default thresholds
    assert _judge(d, tmp_path, rows, toploc_calibration=False).accepted
    _strict_file(d)  # absurdly strict: not even one ulp
    v = _judge(d, tmp_path, rows)
    assert not v.accepted and v.internal_error is None, v
    assert "exp_mismatches" in v.reason or "mant_err" in v.reason, v.reason
    v = _judge(d, tmp_path, rows, toploc_thresholds={"max_exp_mismatches": 38, "max_mant_err_mean": 10.0,
                                                     "max_mant_err_median": 8.0})
    assert v.accepted, v.reason  # explicit config values win over the file
    st = toploc_settings(d, {"max_exp_mismatches": 5})
    assert st.thresholds.max_exp_mismatches == 5 and st.thresholds.max_mant_err_mean == 0.0  # field by field
    assert "config > calibration file" in st.source


def test_sampling_thresholds_from_the_file(calibrated, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(calibrated, d)
    p = d / CALIBRATION_FILE
    cal = json.loads(p.read_text())
    cal["sampling"] = {"max_logprob_diff": 0.0}  # exact logprobs: honest recomputation differs by ~1e-7
    p.write_text(json.dumps(cal))
    v = _judge(d, tmp_path, _rows(d))
    assert not v.accepted and "claimed logprob differs" in v.reason, v.reason


def _hostile(cal: dict) -> dict[str, object]:
    big = dict(cal, figures={"pad": "x" * (MAX_CALIBRATION_BYTES + 10)})
    deep = "[" * 100_000 + "]" * 100_000
    return {
        "too big": json.dumps(big), "not json": "{thresholds: 1", "nan": json.dumps(cal).replace("0.001", "NaN", 1),
        "not an object": "[1, 2]", "unknown key": json.dumps({**cal, "extra": 1}),
        "bad format": json.dumps({**cal, "format": "v0"}), "missing key": json.dumps({k: v for k, v in cal.items()
                                                                                     if k != "thresholds"}),
        "exp over k": json.dumps({**cal, "thresholds": {**cal["thresholds"], "max_exp_mismatches": 10_000}}),
        "inf mean": json.dumps({**cal, "thresholds": {**cal["thresholds"], "max_mant_err_mean": 1e999}}),
        "negative": json.dumps({**cal, "thresholds": {**cal["thresholds"], "max_mant_err_median": -1}}),
        "other model": json.dumps({**cal, "model": {**cal["model"],
                                                    "arch": {**cal["model"]["arch"], "hidden_size": 9}}}),
        "unknown sampling": json.dumps({**cal, "sampling": {"bogus": 1.0}}),
        "deep": deep, "binary": b"\xff\xfe\x00garbage", "directory": None, "fifo": None,
    }


@pytest.mark.parametrize("kind", ["too big", "not json", "nan", "not an object", "unknown key", "bad format",
                                  "missing key", "exp over k", "inf mean", "negative", "other model",
                                  "unknown sampling", "deep", "binary", "directory", "fifo"])
def test_hostile_calibration_files_are_refused_with_a_reason(calibrated, tmp_path, kind):
    d = tmp_path / "model"
    shutil.copytree(calibrated, d)
    p = d / CALIBRATION_FILE
    content = _hostile(json.loads(p.read_text()))[kind]
    rows = _rows(d)[:1]
    started = _validator(d, tmp_path)  # started while the file was sound; it turns hostile under it
    p.unlink()
    if kind == "directory":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)  # reading it would block forever
    else:
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(CalibrationError) as e:
        read_calibration(d, chunk=32, k=128)
    assert str(p) in str(e.value)
    cfg = ValidatorConfig(model_dir=str(d), work_dir=str(tmp_path / "v"))
    assert any("TOPLOC calibration" in x for x in config_problems(cfg))  # refused at startup
    with pytest.raises(ValueError, match="TOPLOC calibration"):
        Validator(cfg, client=object())  # by the CLI and by the class alike
    if kind in ("nan", "other model", "exp over k"):  # and at run time: an internal error, never a verdict
        v = _judge(d, tmp_path, rows, val=started)
        assert v.internal_error is not None and "CalibrationError" in v.internal_error, v


def test_verify_cli_reads_the_calibration_file(calibrated, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(calibrated, d)
    rows = _rows(d, noise=4e-3)
    f = write_rollouts(rows, tmp_path / "r.parquet")
    args = ["toploc", "verify", "--model", str(d), "--rollouts", str(f), "--set", "max_new_tokens=20"]
    _strict_file(d)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1 and "calibration file" in res.output, res.output
    res = CliRunner().invoke(app, [*args, "--set", "thresholds.max_exp_mismatches=38", "--set",
                                   "thresholds.max_mant_err_mean=10.0", "--set", "thresholds.max_mant_err_median=8"])
    assert res.exit_code == 0 and "config > calibration file" in res.output, res.output
    (d / CALIBRATION_FILE).write_text("{")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "not readable JSON" in res.output, res.output


def test_a_toploc_check_that_cannot_take_thresholds_is_a_config_problem(calibrated, tmp_path, monkeypatch):
    import sys  # noqa: PLC0415  # lazy: only this test registers a module
    import types  # noqa: PLC0415  # lazy: only this test registers a module

    mod = types.ModuleType("fake_toploc_no_thresholds")
    mod.verify = lambda model, items, batch_size=1: [SimpleNamespace(passed=True, reason=None) for _ in items]
    monkeypatch.setitem(sys.modules, "fake_toploc_no_thresholds", mod)
    cfg = ValidatorConfig(model_dir=str(calibrated), work_dir=str(tmp_path / "v"),
                          toploc_check="fake_toploc_no_thresholds:verify")
    assert any("cannot take the thresholds" in p for p in config_problems(cfg))  # refused at startup
    d = tmp_path / "model"  # at run time (a version's dir brings the calibration file): an internal error
    shutil.copytree(calibrated, d)
    (d / CALIBRATION_FILE).rename(tmp_path / "calibration.json")
    started = _validator(d, tmp_path, toploc_check="fake_toploc_no_thresholds:verify")
    (tmp_path / "calibration.json").rename(d / CALIBRATION_FILE)
    v = _judge(d, tmp_path, _rows(d)[:1], val=started)
    assert v.internal_error is not None and "cannot take thresholds" in v.internal_error, v  # never a verdict
    v = _judge(calibrated, tmp_path, _rows(calibrated)[:1], toploc_check="fake_toploc_no_thresholds:verify",
               toploc_calibration=False)
    assert v.accepted, v.reason
