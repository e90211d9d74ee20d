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
                seq_len=32, eval_seqs=4, timeout_s=240, save_final_params=True,
                overlap_steps=0)  # blocking unless a test says otherwise ("auto" depends on timing)
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
    assert s["bytes_sent_per_worker"] <= s["tcp_bytes_sent_per_worker"] <= 1.05 * s["bytes_sent_per_worker"]


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
    cfg.data, cfg.task.name = "task", "no_such_task"
    with pytest.raises(WorkerFailed, match="worker 0"):
        run(cfg)


def test_int8_workers_identical_and_bytes_counted(tmp_path):
    from swarmrl.diloco.outer import wire_bytes

    cfg = _tiny(tmp_path, wire="int8", int8_chunk=4096)
    s = run(cfg)
    out = tmp_path / "run"
    logs = [[r for r in read_metrics(out / f"worker{k}.jsonl") if "round" in r and "final" not in r] for k in (0, 1)]
    assert [r["round"] for r in logs[0]] == [1, 2, 3]
    assert all(a["digest"] == b["digest"] for a, b in zip(*logs))  # both dequantize the same int8 sum
    assert s["identical_params"] and s["sync_calls_per_worker"] == 3
    # per round: one int8 code per parameter plus one fp32 scale per 4096-element chunk
    assert s["bytes_sent_per_worker"] == 3 * wire_bytes(s["params"], "int8", 4096)
    assert s["bytes_sent_per_worker"] == 3 * (s["params"] + 4 * -(-s["params"] // 4096))
    # what the kernel counted on each worker's TCP connections during training: a 2-worker all-reduce sends every
    # handed byte once (half in the reduce-scatter, half in the all-gather), plus gloo's headers
    assert s["bytes_sent_per_worker"] <= s["tcp_bytes_sent_per_worker"] <= 1.05 * s["bytes_sent_per_worker"]
    assert s["final_eval_loss"] < s["evals"][0]["eval_loss"]


def test_overlapped_outer_step_keeps_anchors_identical(tmp_path):
    # the all-reduce of each round lands 2 inner steps later; the last round is waited for at the end
    cfg = _tiny(tmp_path, wire="int8", overlap_steps=2)
    s = run(cfg)
    out = tmp_path / "run"
    logs = [[r for r in read_metrics(out / f"worker{k}.jsonl") if "round" in r and "final" not in r] for k in (0, 1)]
    assert [r["round"] for r in logs[0]] == [1, 2, 3] == [r["round"] for r in logs[1]]
    assert [r["step"] for r in logs[0]] == [6, 10, 12]  # rounds sent at 4 and 8 land 2 steps later
    assert all(a["digest"] == b["digest"] for a, b in zip(*logs))  # identical anchors every round
    assert s["identical_params"]  # after the final (blocking) round both hold the anchor
    assert s["final_eval_loss"] < s["evals"][0]["eval_loss"]


def test_auto_overlap_blocks_when_the_all_reduce_is_cheap(tmp_path):
    # "auto" times an all-reduce of the pseudo-gradient's size at set-up; here it must exceed 99% of a round's
    # compute to turn overlap on, which 16 inner steps on loopback never let it: every round blocks
    s = run(_tiny(tmp_path, overlap_steps="auto", overlap_auto_share=0.99, total_steps=32, inner_steps=16))
    assert s["overlap_steps_per_worker"] == [0, 0]
    d = s["overlap_decision"]
    assert d["overlap_steps"] == 0 and 0 < d["comm_s"] and d["share"] < 0.99 and d["inner_step_s"] > 0
    logs = [r for r in read_metrics(tmp_path / "run" / "worker0.jsonl") if "round" in r and "final" not in r]
    assert [(r["round"], r["step"]) for r in logs if "event" not in r] == [(1, 16), (2, 32)]  # none delayed
    assert s["identical_params"]


def test_auto_overlap_turns_on_when_the_all_reduce_is_slow_and_the_group_agrees(tmp_path):
    # with a share no all-reduce stays under, the first outer sync decides to overlap: every worker takes the
    # group's largest tau (>= 1) and rounds of max(H, tau) steps, and each round lands tau steps after it was sent
    s = run(_tiny(tmp_path, overlap_steps="auto", overlap_auto_share=1e-9, total_steps=16, inner_steps=4))
    taus = s["overlap_steps_per_worker"]
    assert len(set(taus)) == 1 and taus[0] >= 1, taus
    tau = taus[0]
    out = tmp_path / "run"
    w = [json.loads((out / f"worker{k}.summary.json").read_text()) for k in (0, 1)]
    h = w[0]["round_steps"]
    assert h == w[1]["round_steps"] == max(4, tau)
    for k in (0, 1):
        ev = [r for r in read_metrics(out / f"worker{k}.jsonl") if r.get("event") == "overlap"]
        assert len(ev) == 1 and ev[0]["overlap_steps"] == tau and ev[0]["own_choice"] <= tau and ev[0]["step"] == 4
        assert ev[0]["round_steps"] == h
    logs = [[r for r in read_metrics(out / f"worker{k}.jsonl") if "round" in r and "final" not in r and "event" not in r]
            for k in (0, 1)]
    sent = list(range(4, 16, h)) + [16]  # the first round at H, then every h steps, the last one at the end
    assert [r["round"] for r in logs[0]] == list(range(1, len(sent) + 1)) == [r["round"] for r in logs[1]]
    # each landed tau steps after it was sent, or at the end (the last one is waited for there)
    assert [r["step"] for r in logs[0]] == [min(t + tau, 16) for t in sent[:-1]] + [16]
    assert all(a["digest"] == b["digest"] for a, b in zip(*logs))  # identical anchors every round
    assert s["identical_params"] and s["final_eval_loss"] < s["evals"][0]["eval_loss"]


def test_ddp_baseline_defaults_to_fp32_wire():
    assert DilocoConfig().wire == "int8"  # the DiLoCo default: int8 pseudo-gradients
    assert DilocoConfig(mode="ddp").wire == "fp32"
    assert DilocoConfig(mode="ddp", wire="fp16").wire == "fp16"  # an explicit choice is kept


def test_config_rejects_overlap_longer_than_a_round():
    with pytest.raises(ConfigError, match="overlap_steps"):
        load_config(DilocoConfig, overrides=["inner_steps=4", "overlap_steps=5"])


_AVG_SCRIPT = """
import sys, torch
from swarmrl.diloco.comm import TorchDistributedAverager
rank, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
g = torch.Generator().manual_seed(rank)
x = torch.randn(5000, generator=g) * (10.0 ** -rank)  # different magnitudes per worker
x[:100] *= 1e-3  # a quiet first chunk keeps its own scale
av = TorchDistributedAverager(rank, 2, "127.0.0.1", port, wire="int8", int8_chunk=100, error_feedback=True)
first = av.average(x).tensor
second = av.average(torch.zeros(5000)).tensor  # only the carried residuals are sent now
torch.save({"x": x, "first": first, "second": second, "bytes": av.bytes_sent}, f"{out}/avg{rank}.pt")
av.close()
"""


def test_torch_int8_average_is_the_mean_within_half_a_step(tmp_path):
    import os
    import subprocess
    import sys

    from swarmrl.utils.procs import free_port

    port = free_port("127.0.0.1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", _AVG_SCRIPT, str(r), str(port), str(tmp_path)], env=env)
             for r in (0, 1)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    a, b = (torch.load(tmp_path / f"avg{r}.pt") for r in (0, 1))
    assert torch.equal(a["first"], b["first"]) and torch.equal(a["second"], b["second"])
    exact = (a["x"] + b["x"]) / 2
    amax = torch.maximum(a["x"].abs(), b["x"].abs()).view(50, 100).amax(1)
    half_step = (amax / 63 / 2).repeat_interleave(100)
    assert bool(((a["first"] - exact).abs() <= half_step * (1 + 1e-5)).all())
    # the quiet chunk keeps its own scale: far finer than one scale for the whole vector would give
    assert float((a["first"][:100] - exact[:100]).abs().max()) < 0.01 * float(amax.max()) / 126
    # error feedback: the residual goes out next round, so the two rounds together are closer to the truth
    two = a["first"] + a["second"]
    assert float((two - exact).abs().max()) < float((a["first"] - exact).abs().max())
    assert a["bytes"] == 2 * (5000 + 4 * 50)
