"""The aggregator as a process (``python -m swarmrl.diloco.trust.aggregator``): it announces its URL in a ready
file once it serves, answers the API, and dies with the process that started it. And the round machinery over
HTTP: a round whose judging is under way refuses late uploads with 409 while the server keeps answering; a round
times out with the members that uploaded, the missing one unpunished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
from diloco_trust_support import join, ledger, result, swarm, tiny_cfg, upload
from protocol_support import make_cfg, running

from swarmrl.diloco.trust.calibration import honest_rounds
from swarmrl.protocol.signing import node_id_for, public_key_hex, save_private_key

PARENT = """
import subprocess, sys, time
from swarmrl.utils.procs import child_env
import os
p = subprocess.Popen([sys.executable, "-m", "swarmrl.diloco.trust.aggregator"] + sys.argv[1:],
                     env=child_env(os.environ), start_new_session=True)
print(p.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_aggregator_process_serves_announces_and_dies_with_its_parent(tmp_path):
    ocfg, keys = make_cfg(tmp_path, min_stake=10.0)
    with running(ocfg) as orch:
        cfg = tiny_cfg()
        (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
        save_private_key(keys["validator"], tmp_path / "agg.pem")
        ready = tmp_path / "ready.json"
        parent = subprocess.Popen([sys.executable, "-c", PARENT, "--config", str(tmp_path / "cfg.json"), "--key",
                                   str(tmp_path / "agg.pem"), "--orchestrator", orch.url, "--port", "0",
                                   "--ready-file", str(ready), "--run-id", "proc-run"],
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            child = int(parent.stdout.readline())
            deadline = time.monotonic() + 60
            while not ready.is_file():
                assert time.monotonic() < deadline and _alive(child), "the aggregator did not come up"
                time.sleep(0.1)
            url = json.loads(ready.read_text())["url"]
            run = httpx.get(f"{url}/v1/diloco/run").json()
            assert run["run_id"] == "proc-run" and run["round"] == 0 and run["numel"] == 18752
            assert run["aggregate"] == "judged" and run["members"] == []
        finally:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        survived = _alive(child)
        if survived:
            os.kill(child, signal.SIGKILL)  # leave nothing behind when failing
        assert not survived, "the aggregator outlived its parent"


def test_a_round_being_judged_refuses_late_uploads_and_the_server_keeps_answering(tmp_path):
    cfg = tiny_cfg()
    pgs = next(honest_rounds(cfg, 3, 1)).pgs
    with swarm(tmp_path, cfg.model_copy(update={"workers": 3}), n_workers=3) as s:
        for k in s.workers:
            assert join(s, k).status_code == 200
        judging, release = threading.Event(), threading.Event()
        score = s.rounds.loss_for

        def slow_loss_for(seed: int, round_no: int):  # noqa: ANN202
            judging.set()
            release.wait(60)
            return score(seed, round_no)
        s.rounds.loss_for = slow_loss_for
        for k, pg in zip(s.workers[:2], pgs):
            assert upload(s, k, pg).status_code == 202
        closing = threading.Thread(target=s.rounds.close)  # what the round timeout does
        closing.start()
        try:
            assert judging.wait(30)
            run = s.http.get("/v1/diloco/run").json()  # the event loop is free while a round is judged
            assert run["round"] == 0 and len(run["pending"]) == 2
            late = upload(s, s.workers[2], pgs[2], round_no=0)
            assert late.status_code == 409 and "closed" in late.json()["detail"]
            early = upload(s, s.workers[2], pgs[2], round_no=1)
            assert early.status_code == 409 and "not open" in early.json()["detail"]
            assert s.http.get("/v1/diloco/rounds/0/result").status_code == 204
        finally:
            release.set()
            closing.join(60)
        res = result(s, 0)
        assert sorted(res.accepted) == sorted(node_id_for(public_key_hex(k)) for k in s.workers[:2])
        assert s.http.get("/v1/diloco/run").json()["round"] == 1
        assert upload(s, s.workers[2], pgs[2]).status_code == 202  # round 1 is open to it


def test_a_round_times_out_with_the_uploads_it_has_and_nobody_missing_is_punished(tmp_path):
    cfg = tiny_cfg(round_timeout_s=0.5)
    pgs = next(honest_rounds(cfg, 3, 1)).pgs
    with swarm(tmp_path, cfg.model_copy(update={"workers": 3}), n_workers=3) as s:
        for k in s.workers:
            assert join(s, k).status_code == 200
        for k, pg in zip(s.workers[:2], pgs):
            assert upload(s, k, pg).status_code == 202
        res = result(s, 0)
        assert len(res.accepted) == 2 and res.rejected == []
        missing = ledger(s, s.workers[2])
        assert missing["status"] == "active" and [e["kind"] for e in missing["entries"]] == ["stake"]
