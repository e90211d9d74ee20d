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


def test_paired_gap_and_its_standard_error_agree_with_a_jackknife():
    import random

    paired_gap = _bench().paired_gap
    base = [1.0, 2.0, 4.0]
    gap, se = paired_gap(base, [1.03 * b for b in base])  # the same ratio on every sequence: no doubt about it
    assert abs(gap - 0.03) < 1e-12 and se < 1e-12
    rng = random.Random(0)
    base = [rng.uniform(0.5, 3.0) for _ in range(400)]
    run = [b * 1.02 + rng.gauss(0, 0.05) for b in base]
    gap, se = paired_gap(base, run)
    n = len(base)
    loo = [(sum(run) - run[i]) / (sum(base) - base[i]) - 1 for i in range(n)]  # leave one sequence out
    mean = sum(loo) / n
    jack = ((n - 1) / n * sum((x - mean) ** 2 for x in loo)) ** 0.5
    assert abs(gap - (sum(run) / sum(base) - 1)) < 1e-12
    assert 0.9 < se / jack < 1.1, (se, jack)
    with pytest.raises(ValueError):
        paired_gap(base, run[:-1])


def test_fields_are_either_method_or_scenario_and_the_split_is_complete():
    assert not set(METHOD_FIELDS) & set(SCENARIO_FIELDS)
    assert set(METHOD_FIELDS) | set(SCENARIO_FIELDS) <= set(DilocoConfig.model_fields)
    # every knob of the outer step and of the inner optimiser is a method field
    assert {"inner_lr", "warmup_steps", "inner_steps", "wire", "outer_lr", "outer_momentum", "overlap_steps"} <= set(
        METHOD_FIELDS)


@pytest.mark.parametrize("data", ["stdlib", "mul_add", "add5", "add3"])
def test_the_benchmark_runs_the_default_method(tmp_path, data):
    bench = _bench()
    args = argparse.Namespace(out=str(tmp_path), workers=None, steps=None, seed=0, no_hivemind=False, no_w4=False,
                              overlap=True, key_rows=False)
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
        assert scen <= {"data", "task", "workers"}, (p.name, scen)
        assert p.cfg.data == ("stdlib" if data == "stdlib" else "task")
        if data != "stdlib":
            assert p.cfg.task == bench.TASKS[data]
    if data == "stdlib":
        assert not {k for k in SCENARIO_FIELDS if getattr(runs[0].cfg, k) != getattr(d, k)}  # the default itself


def test_the_second_data_set_is_other_text():
    from swarmrl.diloco.data import PackedCorpus
    from swarmrl.models import build_char_tokenizer

    bench, tok = _bench(), build_char_tokenizer()
    texts = {name: tok.decode(PackedCorpus(t.build(), tok, seq_len=64).train_batch(0, 0, 8).view(-1).tolist())
             for name, t in bench.TASKS.items()}
    assert "*" in texts["mul_add"] and "*" not in texts["add5"]
    # 5-digit operands: most lines of add5 carry numbers of 5 digits, which mul_add (factors <= 19, addends
    # <= 99, results <= 460) never has
    assert any(len(n) == 5 for line in texts["add5"].split("\n") for n in line.replace("=", "+").split("+"))


# The default itself (DilocoConfig(): the stdlib corpus, 2 workers x 3200 inner steps, 100 rounds of H = 32, 256
# held-out windows), against DDP and one worker alone (AdamW only): the scenario of benchmarks/diloco/RESULTS.md, where
# collaboration matters. Measured there (held-out, seed 0): DDP 1.2630, DiLoCo 1.2813 (+1.45%, se 0.27), one AdamW
# worker 1.3390 (+6.01%; DiLoCo keeps 76% of what the second worker gives DDP), 127.9x fewer bytes; seeds 1 and 2
# give +1.24% and +1.42%. It asserts the 2% (GAP_BOUND), which the previous defaults miss (H = 50: +2.20% and
# +2.26% with seeds 1 and 2; +2.51% at 1600 steps, +4.03% at 800), and that DiLoCo keeps at least MIN_CLOSED of the
# gap between one worker alone and DDP (H = 50, seed 0: 69.9%; 64% at 1600 steps, 48% at 800). It also fails if the
# bytes are not >= 100x fewer, or if the scenario stops showing that the data of 2 workers matter (the lone worker
# within LONE_MARGIN of DDP). About 15 minutes here (3 runs of 3200 steps).
GAP_BOUND = 0.02
MIN_CLOSED = 0.7
LONE_MARGIN = 0.05


@pytest.mark.slow
@pytest.mark.timeout(3600)  # three 3200-step runs: ~15 min here, past the suite's 600 s per test
def test_default_diloco_keeps_what_ddp_gains_over_one_worker_for_a_hundredth_of_the_bytes(tmp_path):
    from swarmrl.diloco import run

    d = DilocoConfig()
    ddp = run(DilocoConfig(mode="ddp", out=str(tmp_path / "ddp")))
    dl = run(DilocoConfig(out=str(tmp_path / "diloco")))
    lone = run(DilocoConfig(mode="ddp", workers=1, out=str(tmp_path / "lone")))
    assert ddp["identical_params"] and dl["identical_params"]
    assert dl["sync_calls_per_worker"] == d.total_steps // d.inner_steps
    assert dl["data"]["source"] == "stdlib" and dl["data"]["digest"] == ddp["data"]["digest"]
    # bytes handed to the collectives and bytes the kernel counted on the workers' TCP connections
    assert ddp["bytes_sent_per_worker"] / dl["bytes_sent_per_worker"] >= 100
    if sys.platform.startswith("linux"):  # the kernel counters (swarmrl.diloco.traffic)
        assert ddp["tcp_bytes_sent_per_worker"] >= ddp["bytes_sent_per_worker"]  # a W=2 ring sends it all once
        assert ddp["tcp_bytes_sent_per_worker"] / dl["tcp_bytes_sent_per_worker"] >= 100
    gap = dl["final_eval_loss"] / ddp["final_eval_loss"] - 1
    assert gap <= GAP_BOUND, (gap, dl["final_eval_loss"], ddp["final_eval_loss"])
    lone_gap = lone["final_eval_loss"] / ddp["final_eval_loss"] - 1
    assert lone_gap >= LONE_MARGIN, (lone_gap, lone["final_eval_loss"], ddp["final_eval_loss"])
    closed = (lone["final_eval_loss"] - dl["final_eval_loss"]) / (lone["final_eval_loss"] - ddp["final_eval_loss"])
    assert closed >= MIN_CLOSED, (closed, lone["final_eval_loss"], dl["final_eval_loss"], ddp["final_eval_loss"])
    assert dl["final_eval_loss"] < dl["evals"][0]["eval_loss"] - 2.0  # it did learn (from ~5.3 nats a byte)
