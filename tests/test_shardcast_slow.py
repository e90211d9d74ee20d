"""Bigger SHARDCAST scenarios (marked slow): a 3-level tree with successive versions, and the real CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _shardcast_util import make_file, same_file, wait_until

from swarmrl.shardcast import FetchOptions, Origin, Relay, fetch_async
from swarmrl.utils.procs import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_three_level_tree_successive_versions(tmp_path):
    o = Origin(tmp_path / "origin", keep=2, shard_size=256 * 1024)
    url = o.serve()
    files = {v: make_file(tmp_path / f"ckpt{v}.bin", 16 * 1024 * 1024 + v, seed=v) for v in (10, 20, 30)}

    async def main():
        r1 = Relay(tmp_path / "r1", [url], o.public_key, keep=2)
        r2 = Relay(tmp_path / "r2", [url], o.public_key, keep=2)
        u1, u2 = await r1.start(), await r2.start()
        r3 = Relay(tmp_path / "r3", [u1, u2], o.public_key, keep=2)
        u3 = await r3.start()
        for v, f in files.items():
            o.publish(f, version=v)
            res = await asyncio.gather(*(fetch_async([u1, u2, u3], tmp_path / f"c{i}_{v}.bin", o.public_key,
                                                     version=v, options=FetchOptions(wait_s=60, parallel=6))
                                         for i in range(6)))
            for r in res:
                assert r.version == v and same_file(r.path, f) and not r.excluded
        await wait_until(lambda: all(30 in r.synced for r in (r1, r2, r3)), timeout=60)
        for d in ("r1", "r2", "r3"):
            assert sorted(p.name for p in (tmp_path / d).glob("v*")) == ["v20", "v30"]
        latest = await fetch_async([u3], tmp_path / "latest.bin", o.public_key)
        assert latest.version == 30
        for r in (r3, r2, r1):
            await r.stop()

    asyncio.run(main())
    o.close()


def test_cli_processes_end_to_end(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cli = [sys.executable, "-m", "swarmrl", "shardcast"]
    key = tmp_path / "o.key"
    subprocess.run(cli + ["keygen", "--out", str(key)], check=True, env=env, capture_output=True)
    po, pr = free_port(), free_port()
    procs = [subprocess.Popen(cli + ["origin", "--dir", str(tmp_path / "o"), "--port", str(po)], env=env),
             subprocess.Popen(cli + ["relay", "--upstream", f"http://127.0.0.1:{po}", "--dir", str(tmp_path / "r"),
                                     "--port", str(pr), "--origin-pubkey", str(key) + ".pub"], env=env)]
    try:
        src = make_file(tmp_path / "model.safetensors", 8 * 1024 * 1024, seed=9)
        subprocess.run(cli + ["publish", "--dir", str(tmp_path / "o"), "--key", str(key), str(src), "--version", "3",
                              "--set", "shard_size=1000000"], check=True, env=env, capture_output=True)
        out = tmp_path / "got.bin"
        deadline = time.time() + 120
        while True:  # the servers need a moment to start (importing the CLI)
            r = subprocess.run(cli + ["fetch", "--server", f"http://127.0.0.1:{pr}", "--origin-pubkey",
                                      str(key) + ".pub", "--out", str(out), "--wait", "30"], env=env,
                               capture_output=True, text=True)
            if r.returncode == 0 or time.time() > deadline:
                break
            time.sleep(1)
        assert r.returncode == 0, r.stderr
        assert same_file(out, src)
        assert (tmp_path / "r" / "distribution.txt").read_text() == (tmp_path / "o" / "distribution.txt").read_text()
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)
