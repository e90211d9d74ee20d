"""One DiLoCo default (the config, the example TOML and the benchmark agree) and a short DiLoCo-default-vs-DDP
comparison (slow)."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from swarmrl.config import load_config
from swarmrl.diloco.config import METHOD_FIELDS, SCENARIO_FIELDS, DilocoConfig

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("diloco_bench", ROOT / "benchmarks" / "diloco" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_the_example_toml_is_the_default():
    cfg = load_config(DilocoConfig, ROOT / "configs" / "diloco.toml")
    d = DilocoConfig()
    differ = {k: (getattr(cfg, k), getattr(d, k)) for k in DilocoConfig.model_fields if getattr(cfg, k) != getattr(d, k)}
    assert not differ, f"configs/diloco.toml differs from DilocoConfig(): {differ}"


def test_fields_are_either_method_or_scenario_and_the_split_is_complete():
    assert not set(METHOD_FIELDS) & set(SCENARIO_FIELDS)
    assert set(METHOD_FIELDS) | set(SCENARIO_FIELDS) <= set(DilocoConfig.model_fields)
    # every knob of the outer step and of the inner optimiser is a method field
    assert {"inner_lr", "warmup_steps", "inner_steps", "wire", "outer_lr", "outer_momentum", "overlap_steps"} <= set(
        METHOD_FIELDS)


@pytest.mark.parametrize("data", ["mul_add", "add5", "add3"])
def test_the_benchmark_runs_the_default_method(tmp_path, data):
    bench = _bench()
    args = argparse.Namespace(out=str(tmp_path), workers=None, steps=None, seed=0, no_hivemind=False, no_w4=False)
    runs = bench.plan(data, args, extras=True)
    d = DilocoConfig()
    names = {p.name for p in runs}
    assert {"ddp fp32", "diloco default", "1 worker, no comm", "W=4 diloco default"} <= names
    for p in runs:
        changed = {k for k in METHOD_FIELDS if getattr(p.cfg, k) != getattr(d, k)}
        if p.cfg.mode == "ddp":
            changed.discard("wire")  # the baseline all-reduces fp32 gradients, not int8 pseudo-gradients
        assert changed == set(p.varies), (p.name, changed)
        if p.name in ("diloco default", "diloco hivemind"):
            assert not p.varies and p.cfg.mode == "diloco"
            assert p.cfg.hivemind == d.hivemind
        # the scenario: only the data (and, for W=4 and the lone worker, the workers) differ from the default
        scen = {k for k in SCENARIO_FIELDS if getattr(p.cfg, k) != getattr(d, k)}
        assert scen <= {"task", "workers"}, (p.name, scen)
    assert runs[0].cfg.task == bench.DATA[data]


def test_the_second_data_set_is_other_text():
    from swarmrl.diloco.data import PackedCorpus
    from swarmrl.models import build_char_tokenizer

    bench, tok = _bench(), build_char_tokenizer()
    texts = {name: tok.decode(PackedCorpus(t.build(), tok, seq_len=64).train_batch(0, 0, 8).view(-1).tolist())
             for name, t in bench.DATA.items()}
    assert "*" in texts["mul_add"] and "*" not in texts["add5"]
    # 5-digit operands: most lines of add5 carry numbers of 5 digits, which mul_add (factors <= 19, addends
    # <= 99, results <= 460) never has
    assert any(len(n) == 5 for line in texts["add5"].split("\n") for n in line.replace("=", "+").split("+"))


# A short run of the default: DilocoConfig() with only total_steps changed (scenario), 300 inner steps of 2 workers,
# 6 outer rounds, on mul_add. Measured (benchmarks/diloco/RESULTS.md, "The slow test"): DDP 1.4699, DiLoCo 1.4658
# (-0.28%); bytes 199.8x, TCP 198.5x. The bound (2%) holds with room at this length, so it is kept. It is
# a guard against a default that stops converging like DDP, not evidence that averaging helps: one worker alone is
# within it too (1.4894 with AdamW only, 1.4653 with DiLoCo's outer step). That the workers averaged is checked
# by their identical parameters after every round.
SHORT_STEPS = 300
SHORT_GAP = 0.02


@pytest.mark.slow
def test_default_diloco_is_close_to_ddp_for_a_hundredth_of_the_bytes(tmp_path):
    from swarmrl.diloco import run

    ddp = run(DilocoConfig(mode="ddp", total_steps=SHORT_STEPS, out=str(tmp_path / "ddp")))
    dl = run(DilocoConfig(total_steps=SHORT_STEPS, out=str(tmp_path / "diloco")))
    assert ddp["identical_params"] and dl["identical_params"]
    assert dl["sync_calls_per_worker"] == SHORT_STEPS // DilocoConfig().inner_steps
    # bytes handed to the collectives and bytes the kernel counted on the workers' TCP connections
    assert ddp["bytes_sent_per_worker"] / dl["bytes_sent_per_worker"] >= 100
    if sys.platform.startswith("linux"):  # the kernel counters (swarmrl.diloco.traffic)
        assert ddp["tcp_bytes_sent_per_worker"] >= ddp["bytes_sent_per_worker"]  # a W=2 ring sends it all once
        assert ddp["tcp_bytes_sent_per_worker"] / dl["tcp_bytes_sent_per_worker"] >= 100
    gap = dl["final_eval_loss"] / ddp["final_eval_loss"] - 1
    assert gap <= SHORT_GAP, (gap, dl["final_eval_loss"], ddp["final_eval_loss"])
    assert dl["final_eval_loss"] < dl["evals"][0]["eval_loss"] - 1.0  # it did learn
