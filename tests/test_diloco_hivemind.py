"""DiLoCo over hivemind's DHT averaging (elastic groups) with real worker processes on 127.0.0.1.

hivemind is an optional extra (``pip install 'swarmrl[hivemind]'``); without it these tests skip.
"""

import json
import time

import pytest
import torch

from swarmrl.diloco.comm import HIVEMIND_MISSING, hivemind_available
from swarmrl.diloco.config import DilocoConfig, HivemindConfig
from swarmrl.diloco.launch import free_port, start_worker, stop_all, wait_all
from swarmrl.utils.metrics import read_metrics

torch.set_num_threads(1)
pytestmark = pytest.mark.skipif(not hivemind_available(), reason=HIVEMIND_MISSING)


def _cfg(out, **kw) -> DilocoConfig:
    hm = kw.pop("hivemind", {})
    base = dict(out=str(out), backend="hivemind", workers=2, total_steps=12, inner_steps=3, warmup_steps=2,
                batch_size=4, seq_len=32, eval_seqs=4, timeout_s=240, save_final_params=True,
                hivemind=HivemindConfig(**{"matchmaking_time": 1.5, "round_timeout": 15.0, **hm}))
    base.update(kw)
    return DilocoConfig(**base)


def _rounds(out, rank):
    return [r for r in read_metrics(out / f"worker{rank}.jsonl") if "round" in r and "final" not in r and "event" not in r]


def test_two_hivemind_workers_average_each_round(tmp_path):
    from swarmrl.diloco import run

    s = run(_cfg(tmp_path / "run", wire="fp16"))
    out = tmp_path / "run"
    r0, r1 = _rounds(out, 0), _rounds(out, 1)
    assert [r["round"] for r in r0] == [1, 2, 3, 4] == [r["round"] for r in r1]
    assert all(r["group_size"] == 2 for r in r0 + r1)
    # hivemind hands each peer local + fp16(mean - local): equal up to fp16 rounding of the delta,
    # while without averaging the two workers would differ by a whole inner round of updates
    p0, p1 = (torch.load(out / f"worker{k}.params.pt") for k in (0, 1))
    assert (p0 - p1).abs().max() < 1e-3 * p0.abs().max()
    w = [json.loads((out / f"worker{k}.summary.json").read_text()) for k in (0, 1)]
    assert w[0]["final_train_loss"] != w[1]["final_train_loss"]  # they trained on different data
    assert s["bytes_sent_per_worker"] == 4 * s["params"] * 2
    assert s["final_eval_loss"] < s["evals"][0]["eval_loss"]


@pytest.mark.slow
def test_worker_leaves_and_another_joins_without_stalling(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    port = free_port()
    # A runs 10 rounds; B leaves after 2; C joins after B has left, loads A's state and trains on. Full-precision
    # averages (the default wire is int8: test_hivemind_int8_averages_with_codebook_bytes covers that), so the
    # peers' parameters after their last common round differ by float rounding only
    common = dict(total_steps=30, inner_steps=3, wire="fp32")
    a = _cfg(out, **common, hivemind={"round_timeout": 6.0})
    b = _cfg(out, **common, hivemind={"round_timeout": 6.0, "leave_after_rounds": 2})
    c = _cfg(out, **common, hivemind={"round_timeout": 6.0, "join": True})
    procs = {0: start_worker(a, 0, 2, port), 1: start_worker(b, 1, 2, port)}
    try:
        deadline = time.monotonic() + 120
        while procs[1].poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert procs[1].poll() == 0, (out / "worker1.stderr.log").read_text()[-2000:]
        procs[2] = start_worker(c, 2, 2, port)
        wait_all(procs, out, timeout_s=240)
    finally:
        stop_all(list(procs.values()))
    ra, rb, rc = _rounds(out, 0), _rounds(out, 1), _rounds(out, 2)
    # B averaged with A and left after 2 rounds; A finished every round (it never stalled)
    assert [r["round"] for r in rb] == [1, 2]
    assert json.loads((out / "worker1.summary.json").read_text())["left"] is True
    assert [r["round"] for r in ra] == list(range(1, 11))
    assert ra[0]["group_size"] == 2
    # C loaded the state A published after some round k (A's anchor digest at that round)
    joined = json.loads((out / "worker2.summary.json").read_text())["joined_from"]
    a_digest = {r["round"]: r["digest"] for r in ra}
    assert joined["round"] >= 2 and joined["digest"] == a_digest[joined["round"]]
    # after joining, A and C averaged together in at least one round
    assert any(r["group_size"] == 2 for r in rc)
    assert any(r["group_size"] == 2 for r in ra if r["round"] > joined["round"])
    pa, pc = torch.load(out / "worker0.params.pt"), torch.load(out / "worker2.params.pt")
    assert (pa - pc).abs().max() < 1e-2 * pa.abs().max()


def test_hivemind_int8_averages_with_codebook_bytes(tmp_path):
    from swarmrl.diloco import run

    s = run(_cfg(tmp_path / "run", wire="int8"))
    out = tmp_path / "run"
    r0, r1 = _rounds(out, 0), _rounds(out, 1)
    assert [r["round"] for r in r0] == [1, 2, 3, 4] == [r["round"] for r in r1]
    assert all(r["group_size"] == 2 for r in r0 + r1)
    p0, p1 = (torch.load(out / f"worker{k}.params.pt") for k in (0, 1))
    assert (p0 - p1).abs().max() < 1e-2 * p0.abs().max()  # 8-bit deltas: close, not bit-equal
    # 4 rounds of one 8-bit code per parameter plus, per part (one per peer here), a length and a codebook
    assert s["bytes_sent_per_worker"] == 4 * (s["params"] + 2 * (8 + 256 * 4))
    assert s["final_eval_loss"] < s["evals"][0]["eval_loss"]
