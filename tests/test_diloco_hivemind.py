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
    # measured all-reduce messages: per round, half the vector out as a part and the delta of the half this
    # peer reduces back, fp16 each (2 bytes a value), plus the messages' other fields (dtype, shape, group id,
    # weight: ~50 bytes a round measured)
    assert 4 * s["params"] * 2 <= s["bytes_sent_per_worker"] <= 4 * (s["params"] * 2 + 128)
    assert s["final_eval_loss"] < s["evals"][0]["eval_loss"]
    # overlap_steps = "auto": a round costs at least the 1.5 s of matchmaking, far more than 3 inner steps, so
    # every round ran in the background from the first (tau = H), decided without a blocking round
    assert s["overlap_steps_per_worker"] == [3, 3] and s["overlap_decision"]["comm_s"] == 1.5
    assert s["overlap_decision"]["share"] > DilocoConfig().overlap_auto_share


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
    # C resumed the lr schedule at the swarm's step without torch's warning about stepping it first
    assert "lr_scheduler.step()" not in (out / "worker2.stderr.log").read_text()


def test_hivemind_int8_averages_with_codebook_bytes(tmp_path):
    from swarmrl.diloco import run

    s = run(_cfg(tmp_path / "run", wire="int8"))
    out = tmp_path / "run"
    r0, r1 = _rounds(out, 0), _rounds(out, 1)
    assert [r["round"] for r in r0] == [1, 2, 3, 4] == [r["round"] for r in r1]
    assert all(r["group_size"] == 2 for r in r0 + r1)
    p0, p1 = (torch.load(out / f"worker{k}.params.pt") for k in (0, 1))
    assert (p0 - p1).abs().max() < 1e-2 * p0.abs().max()  # 8-bit deltas: close, not bit-equal
    # measured all-reduce messages: 4 rounds of one 8-bit code per parameter (this peer's parts out, the deltas of
    # the part it reduces back: one or two messages, as hivemind splits the vector) plus, per message, hivemind's
    # codebook (an int64 length and 256 fp32 values) and the other fields
    codebook = 8 + 256 * 4
    assert 4 * (s["params"] + codebook) <= s["bytes_sent_per_worker"] <= 4 * (s["params"] + 2 * codebook + 128)
    # the kernel's count of the workers' TCP traffic in training holds those bytes (libp2p's framing and
    # encryption, matchmaking and the DHT on top): at least the messages, and not the fp32 vector
    assert s["bytes_sent_per_worker"] <= s["tcp_bytes_sent_per_worker"] < 4 * s["params"] * 4
    assert s["final_eval_loss"] < s["evals"][0]["eval_loss"]


def test_the_averager_registers_its_counted_all_reduce_as_a_stream():
    """hivemind reads the handler's type hints: a hint it does not see as a stream would register
    ``rpc_aggregate_part`` as a unary call, and every all-reduce would stall."""
    import threading

    from swarmrl.diloco._hivemind import AllReduceTraffic, averager_class

    cls = averager_class(AllReduceTraffic(), None, threading.Lock())
    cls._collect_rpc_handlers()
    h = {r.method_name: r for r in cls._rpc_handlers}["rpc_aggregate_part"]
    assert h.stream_input and h.stream_output
    assert cls.__name__ == "_Averager"  # the handlers' names on the wire: every peer must use the same


def test_int8_codec_round_trips_through_hiveminds_deserializer():
    """hivemind deserializes an 8-bit part by its compression type, whoever sent it: with swarmrl's codec
    registered, a part comes back as the 8-bit rounding of what was sent (hivemind 1.1.12's own raises a
    TypeError under NumPy 2 and the reducer drops every part)."""
    from hivemind.compression import CompressionInfo, deserialize_torch_tensor

    from swarmrl.diloco._hivemind import Uniform8Bit

    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    back = deserialize_torch_tensor(Uniform8Bit().compress(x, CompressionInfo.from_tensor(x)))
    assert back.shape == x.shape and back.dtype == torch.float32
    inside = x.abs() < 2.9  # the codec's range is +-3 sigma over 256 levels; the tails share an end bucket
    assert float((back - x)[inside].abs().max()) < 6 * float(x.std()) / 256


_HM_AVG_SCRIPT = """
import json, sys, time, torch
from pathlib import Path
from swarmrl.diloco.comm import HivemindAverager
rank, out, n = int(sys.argv[1]), Path(sys.argv[2]), 50_000
peers = [] if rank == 0 else json.loads((out / "peers.json").read_text())
av = HivemindAverager(n, peers, wire="int8", target_group_size=2, matchmaking_time=2.0, round_timeout=30.0)
if rank == 0:
    (out / "peers.json.tmp").write_text(json.dumps(av.visible_maddrs()))
    (out / "peers.json.tmp").replace(out / "peers.json")
xs = [torch.randn(n, generator=torch.Generator().manual_seed(10 * rank + r)) for r in range(2)]
res = [av.average(x, r) for r, x in enumerate(xs)]
time.sleep(2)  # the last delta this peer sends as a reducer is counted when it goes out
torch.save({"x": xs, "avg": [r.tensor for r in res], "group": [r.group_size for r in res], "sent": av.bytes_sent,
            "refused": av.refused_rounds, "solo": av.solo_rounds}, out / f"avg{rank}.pt")
av.close()
"""


def test_hivemind_int8_average_is_the_mean_and_its_bytes_are_counted(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", _HM_AVG_SCRIPT, "0", str(tmp_path)], env=env)]
    deadline = time.monotonic() + 60
    while not (tmp_path / "peers.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    procs.append(subprocess.Popen([sys.executable, "-c", _HM_AVG_SCRIPT, "1", str(tmp_path)], env=env))
    try:
        assert [p.wait(timeout=180) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    a, b = (torch.load(tmp_path / f"avg{r}.pt") for r in (0, 1))
    assert a["group"] == b["group"] == [2, 2] and a["refused"] == b["refused"] == a["solo"] == b["solo"] == 0
    for r in range(2):
        mean, half = (a["x"][r] + b["x"][r]) / 2, (a["x"][r] - b["x"][r]) / 2
        for peer in (a, b):
            # within a few percent of the half-difference a peer moves; without averaging the error would be 100%
            assert float((peer["avg"][r] - mean).abs().mean()) < 0.05 * float(half.abs().mean())
    # per round every 8-bit code crosses once, whichever peer reduces which part (hivemind splits the vector
    # between them), plus a 1032-byte codebook per message and the messages' other fields
    n = 50_000
    for peer in (a, b):
        assert 2 * n <= peer["sent"] <= 2 * (n + 2 * 1032 + 128)
    assert a["sent"] + b["sent"] >= 2 * 2 * (n + 1032)


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from /proc)."""
    import os  # noqa: PLC0415

    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_hivemind_worker_leaves_no_forked_process_behind(tmp_path):
    # hivemind forks its DHT and averager processes; a SIGKILLed worker used to leave them running
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    cfg = _cfg(tmp_path, workers=1, total_steps=100_000, hivemind={"min_group_size": 1})
    p = start_worker(cfg, 0, 1, free_port())
    try:
        deadline, kids = time.monotonic() + 60, set()
        while time.monotonic() < deadline and len(kids) < 2:  # the DHT and the averager are up
            kids = _children(p.pid)
            time.sleep(0.5)
        assert len(kids) >= 2, kids
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 15
        alive = kids
        while time.monotonic() < deadline and alive:
            alive = {k for k in kids if os.path.exists(f"/proc/{k}") and
                     open(f"/proc/{k}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"}
            time.sleep(0.3)
        assert not alive, f"forked processes outlived their killed worker: {alive}"
    finally:
        stop_all([p])
