"""docs/protocol.md's quick start, run as written (issue 39): the operator's commands in one directory, the
contributor's in another, ``URL``, ``KEY`` and ``PUBLIC_KEY`` filled in from what the commands before them print;
the joined node's work must be accepted (credits in its ledger)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from swarmrl.utils.procs import child_env, stop_process

ROOT = Path(__file__).resolve().parent.parent
CONTRIBUTOR = ("swarmrl node keygen", "swarmrl node join")  # run in the contributor's directory
LONG_RUNNING = ("swarmrl run", "swarmrl node join")


def quickstart_commands() -> list[str]:
    text = (ROOT / "docs" / "protocol.md").read_text()
    section = text[text.index("## Quick start"):]
    block = section[section.index("```bash") + len("```bash"):]
    block = block[: block.index("```")]
    lines = [ln.split("  #")[0].strip() for ln in block.replace("\\\n", " ").splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def _argv(cmd: str, values: dict[str, str]) -> list[str]:
    argv = shlex.split(cmd)
    assert argv[0] == "swarmrl", cmd
    return [sys.executable, "-m", "swarmrl", *[values.get(a, a) for a in argv[1:]]]


def test_the_quick_start_has_the_commands_this_test_knows():
    cmds = quickstart_commands()
    assert [c.split(" --")[0].split(" -c")[0] for c in cmds] == [
        "swarmrl model init", "swarmrl run", "swarmrl node keygen", "swarmrl orchestrator deposit",
        "swarmrl node join URL"]


@pytest.mark.timeout(420)
def test_the_quick_start_runs_as_written_and_the_joined_node_earns_credit(tmp_path):
    operator, contributor = tmp_path / "operator", tmp_path / "contributor"
    operator.mkdir()
    contributor.mkdir()
    (operator / "configs").symlink_to(ROOT / "configs")
    env = child_env({**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})  # they die with the test
    values: dict[str, str] = {}
    procs: list[subprocess.Popen] = []
    node_id = ""
    try:
        for cmd in quickstart_commands():
            cwd = contributor if cmd.startswith(CONTRIBUTOR) else operator
            argv = _argv(cmd, values)
            if cmd.startswith(LONG_RUNNING):
                log = cwd / f"{len(procs)}.log"
                procs.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=log.open("w"),
                                              stderr=subprocess.STDOUT, start_new_session=True))
                if cmd.startswith("swarmrl run"):  # the join line
                    deadline = time.monotonic() + 180
                    while "KEY" not in values:
                        assert time.monotonic() < deadline and procs[-1].poll() is None, log.read_text()[-3000:]
                        m = re.search(r"swarmrl node join (\S+) --run-key ([0-9a-f]{64})", log.read_text())
                        if m:
                            values.update(URL=m.group(1), KEY=m.group(2))
                        time.sleep(0.5)
                continue
            r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (cmd, r.stderr[-2000:])
            if cmd.startswith("swarmrl node keygen"):
                out = json.loads(r.stdout)
                values["PUBLIC_KEY"], node_id = out["public_key"], out["node_id"]
        credited, deadline = 0.0, time.monotonic() + 240
        while credited <= 0:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [(p.args[3:5], (Path(p.args[0]).name)) for p in procs]
            time.sleep(1.0)
            r = httpx.get(f"{values['URL']}/v1/nodes/{node_id}/ledger", timeout=10)
            if r.status_code == 200:
                credited = r.json()["credits_locked"] + r.json()["credits_unlocked"]
    finally:
        for p in reversed(procs):
            stop_process(p, term_s=60)
