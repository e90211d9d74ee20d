"""`swarmrl toploc calibrate` and `swarmrl toploc verify` end to end on a tiny model."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from swarmrl.cli import app
from swarmrl.contract import Rollout
from swarmrl.inference.sampler import SamplingParams, generate
from swarmrl.models import ModelInitConfig, init_model
from swarmrl.rollouts.wire import write_rollouts
from swarmrl.toploc import build_proofs

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("toploc") / "tiny"
    init_model(ModelInitConfig(seed=0), d)
    return d


def test_calibrate_prints_table_and_recommendation(model_dir, tmp_path):
    metrics = tmp_path / "cal.jsonl"
    res = CliRunner().invoke(app, ["toploc", "calibrate", "--model", str(model_dir), "--set", "n_prompts=3",
                                   "--set", "max_new_tokens=34", "--set", "batch_sizes=[1, 2]", "--set", "threads=[1]",
                                   "--set", f"metrics=\"{metrics}\""])
    assert res.exit_code == 0, res.output
    assert "recommended thresholds" in res.output and "another model" in res.output
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    cal = {r["scenario"]: r for r in rows if r["kind"] == "toploc_calibration"}
    assert all(r["toploc_fail_rate"] == 0 for r in cal.values() if r["honest"])
    assert cal["tampered: another model"]["toploc_fail_rate"] == 1.0
    rec = [r for r in rows if r["kind"] == "toploc_recommended"][0]
    assert rec["max_exp_mismatches"] >= 0


def test_calibrate_config_errors_name_the_field(model_dir):
    res = CliRunner().invoke(app, ["toploc", "calibrate", "--model", str(model_dir), "--set", "bogus=1"])
    assert res.exit_code == 2


def test_verify_rollout_file(model_dir, tmp_path):
    from swarmrl.models import load_model, load_tokenizer

    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    prompts = [tok.encode(t, add_special_tokens=False) for t in ["1+1=", "hello there"]]
    out = generate(model, prompts, SamplingParams(max_new_tokens=40), tok.eos_token_id, tok.pad_token_id,
                   capture_hidden=True, generator=torch.Generator().manual_seed(0))
    rows = [Rollout("w", 0, 0, f"t{i}", "mul_add", "g", p, c, lp, 0.0, 0.0, 0.0, None, 1.0, f, 0,
                    build_proofs(h))
            for i, (p, c, lp, f, h) in enumerate(zip(out.prompt_ids, out.completion_ids, out.logprobs, out.finished,
                                                     out.hidden))]
    good = write_rollouts(rows, tmp_path / "good.parquet")
    res = CliRunner().invoke(app, ["toploc", "verify", "--model", str(model_dir), "--rollouts", str(good),
                                   "--set", "max_new_tokens=40"])
    assert res.exit_code == 0, res.output
    assert "2/2 rows passed" in res.output
    rows[1].proofs = [bytes(258)] * len(rows[1].proofs)
    bad = write_rollouts(rows, tmp_path / "bad.parquet")
    res = CliRunner().invoke(app, ["toploc", "verify", "--model", str(model_dir), "--rollouts", str(bad)])
    assert res.exit_code == 1 and "row 1: FAIL" in res.output and "null proof" in res.output


def test_prove_and_check_files(tmp_path):
    from safetensors.torch import save_file

    h = torch.randn(70, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    save_file({"hidden": h}, str(tmp_path / "h.safetensors"))
    r = CliRunner().invoke(app, ["toploc", "prove", "--hidden", str(tmp_path / "h.safetensors"),
                                 "--out", str(tmp_path / "p.txt")])
    assert r.exit_code == 0, r.output
    lines = (tmp_path / "p.txt").read_text().split()
    assert len(lines) == 3 and all(len(x) == 344 for x in lines)
    r = CliRunner().invoke(app, ["toploc", "check", "--hidden", str(tmp_path / "h.safetensors"),
                                 "--proofs", str(tmp_path / "p.txt")])
    assert r.exit_code == 0 and "3/3 chunks passed" in r.output
    (tmp_path / "bad.txt").write_text(lines[0] + "\n@@@@\n" + lines[2] + "\n")
    r = CliRunner().invoke(app, ["toploc", "check", "--hidden", str(tmp_path / "h.safetensors"),
                                 "--proofs", str(tmp_path / "bad.txt"), "--set", "max_exp_mismatches=0"])
    assert r.exit_code == 1 and "chunk 1: FAIL" in r.output and "base64 proof is 4 chars" in r.output
    assert "2/3 chunks passed" in r.output
