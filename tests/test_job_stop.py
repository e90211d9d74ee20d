"""Stopping ``swarmrl run``: every process the launcher started (the roles it spawned, the zygote and the roles
forked from it, the relays) stops when the launcher is stopped (SIGTERM, SIGINT) or dies (SIGKILL: the roles'
parent-death signal), and a stopped run resumes with ``fresh = false``.

Processes are tracked by pid and start time (``/proc/PID/stat``), recorded as descendants of the launcher while
it runs, so a pid reused afterwards is not mistaken for a leftover role."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmrl.rundir.writer import RunDir
from swarmrl.utils.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time, state) of ``pid``, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ..., starttime (field 22)
    return int(fields[1]), int(fields[19]), fields[0]


def descendants(root: int) -> dict[int, int]:
    """Every live process under ``root`` (children, grandchildren, ...), pid -> start time."""
    kids: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None and st[2] != "Z":
            kids.setdefault(st[0], []).append(int(d))
            starts[int(d)] = st[1]
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out[c] = starts[c]
                todo.append(c)
    return out


def still_running(procs: dict[int, int]) -> dict[int, str]:
    """The processes of ``procs`` still running (a zombie has stopped), pid -> command line."""
    alive = {}
    for pid, start in procs.items():
        st = _stat(pid)
        if st is not None and st[1] == start and st[2] != "Z":
            try:
                alive[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
    return alive


def wait_gone(procs: dict[int, int], timeout_s: float) -> dict[int, str]:
    deadline = time.monotonic() + timeout_s
    while (left := still_running(procs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_all(procs: dict[int, int]) -> None:
    for pid in still_running(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# A launcher in miniature: a relay spawned by the supervisor and one forked from the zygote (relays serve until
# signalled and start in a second), stopped as ``launch`` stops its roles.
_MINI_LAUNCHER = """
import signal, sys, time
# Ctrl-C's exception even if this process was started with SIGINT ignored (what a background job of a
# non-interactive shell inherits, pytest's children included): the test is about the cleanup, not the shell
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
from swarmrl.job.derive import RoleSpec
from swarmrl.job.launch import stop_on_sigterm
from swarmrl.job.supervisor import Supervisor, role_env
from swarmrl.job.zygote import Zygote
from swarmrl.protocol.signing import generate_key, public_key_hex
from swarmrl.utils.procs import stop_process

tmp, key = Path(sys.argv[1]), public_key_hex(generate_key())
relay = lambda name: ["shardcast", "relay", "--upstream", "http://127.0.0.1:9", "--dir", str(tmp / name),
                      "--port", "0", "--origin-pubkey", key]
with stop_on_sigterm():
    zygote = Zygote(["json"], tmp / "zygote.log")
    sup = Supervisor(tmp / "logs", lambda m: None, zygote=zygote)
    forked = None
    try:
        sup.start(RoleSpec("plain", relay("plain"), restart="never"))
        forked = zygote.spawn(relay("forked"), sup.log("forked"), role_env())
        while True:
            time.sleep(1)
    finally:
        sup.stop_all()
        if forked is not None:
            stop_process(forked)
        zygote.close()
        print("stopped every role", flush=True)
"""


def _mini_launcher(tmp_path: Path, seen: dict[int, int]) -> subprocess.Popen:
    launcher = subprocess.Popen([sys.executable, "-c", _MINI_LAUNCHER, str(tmp_path)], cwd=REPO, env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen[launcher.pid] = _stat(launcher.pid)[1]
    logs = [tmp_path / "logs" / "plain.log", tmp_path / "logs" / "forked.log"]
    deadline = time.monotonic() + 120
    while launcher.poll() is None and time.monotonic() < deadline and not all(
            f.is_file() and "relay serving" in f.read_text() for f in logs):
        seen.update(descendants(launcher.pid))
        time.sleep(0.1)
    assert launcher.poll() is None, launcher.communicate()[0]
    assert all("relay serving" in f.read_text() for f in logs), [f.read_text() for f in logs if f.is_file()]
    seen.update(descendants(launcher.pid))
    roles = still_running({p: s for p, s in seen.items() if p != launcher.pid})
    assert sum("swarmrl shardcast relay" in c for c in roles.values()) == 2, roles
    assert sum("swarmrl.job.zygote" in c for c in roles.values()) == 1, roles
    return launcher


def test_a_launcher_that_dies_takes_its_spawned_and_forked_roles_and_the_zygote_with_it(tmp_path, started):
    launcher = _mini_launcher(tmp_path, started)
    os.kill(launcher.pid, signal.SIGKILL)  # no handler, no finally: only the roles' parent-death signal is left
    out = launcher.communicate(timeout=60)[0]
    assert "stopped every role" not in out
    left = wait_gone({p: s for p, s in started.items() if p != launcher.pid}, 60)
    assert not left, f"still running after the launcher died: {left}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_and_sigint_stop_the_launcher_through_its_cleanup(tmp_path, started, sig):
    launcher = _mini_launcher(tmp_path, started)
    os.kill(launcher.pid, sig)
    out = launcher.communicate(timeout=120)[0]
    # the signal became an exception (SystemExit, KeyboardInterrupt): the roles were stopped in order
    assert "stopped every role" in out, out
    if sig == signal.SIGTERM:
        assert launcher.returncode == 128 + signal.SIGTERM, out
    assert not wait_gone({p: s for p, s in started.items() if p != launcher.pid}, 60)


def _steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir / "metrics" / "trainer.jsonl") if "reward" in r]


def _run_cmd(model: Path, run_dir: Path, steps: int, *extra: str, flags: tuple[str, ...] = ("--local",)) -> list[str]:
    """A tiny ``swarmrl run --local`` of the main config: two workers (forked from the zygote), the trainer
    (SHARDCAST origin) and a relay (spawned), no warm start, no evaluations during the run. Without ``--local``
    in ``flags``, the swarm: orchestrator, trainer, adapter, validator, relay and two nodes."""
    sets = [f'rl.model="{model}"', f'rl.run_dir="{run_dir}"', f"rl.steps={steps}", "rl.prompts_per_step=4",
            "rl.contract.group_size=2", "rl.workers.num=2", "rl.workers.prompts_per_batch=2", "rl.eval.every_steps=0",
            "rl.contract.async_level=1", "rl.keep_versions=2", "rl.contract.filter_ties=false", "warmstart.enabled=false", "final_eval_n=16", *extra]
    return [sys.executable, "-m", "swarmrl", "run", "--config", "configs/run.toml",
            *[a for s in sets for a in ("--set", s)], *flags]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(":"))


@pytest.fixture
def started():
    """Everything a test's launchers started; whatever is left running at the end is killed."""
    seen: dict[int, int] = {}
    yield seen
    kill_all(seen)


LOCAL_ROLES = {"swarmrl rl trainer": 1, "swarmrl rl worker": 2, "swarmrl shardcast relay": 1, "swarmrl.job.zygote": 1}
SWARM_ROLES = {"swarmrl orchestrator serve": 1, "swarmrl rl trainer": 1, "swarmrl rl adapter": 1,
               "swarmrl validator run": 1, "swarmrl shardcast relay": 1, "swarmrl node run": 2}


def _interactive_sigint() -> None:
    """In the launcher's child before it starts: SIGINT as a terminal's Ctrl-C finds it (pytest's children inherit
    it ignored, and Python then never turns it into KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_and_wait_for_roles(cmd: list[str], run_dir: Path, log: Path, seen: dict[int, int],
                              expect: dict[str, int] = LOCAL_ROLES) -> subprocess.Popen:
    with open(log, "wb") as f:
        launcher = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_interactive_sigint)
    seen[launcher.pid] = _stat(launcher.pid)[1]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and launcher.poll() is None:
        seen.update(descendants(launcher.pid))
        # a step trained (a checkpoint to resume from) and the relay started: every role is up
        if len(_steps(run_dir)) >= 1 and (run_dir / "shardcast" / "relays.json").is_file():
            break
        time.sleep(0.2)
    assert launcher.poll() is None, log.read_text()[-3000:]
    assert len(_steps(run_dir)) >= 1, "no trainer step within the time limit"
    time.sleep(1.0)  # the relay's process is up by now (started just before relays.json is written)
    seen.update(descendants(launcher.pid))
    roles = still_running(seen)
    for what, n in expect.items():  # what the launcher must stop
        assert sum(what in c for c in roles.values()) == n, (what, roles)
    return launcher


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_stopping_the_launcher_stops_every_role_and_the_run_resumes(tiny_model_dir, tmp_path, started, sig):
    run_dir = tmp_path / "run"
    launcher = _start_and_wait_for_roles(_run_cmd(tiny_model_dir, run_dir, 1000), run_dir, tmp_path / "run.log",
                                         started)
    os.kill(launcher.pid, sig)  # as systemd, docker stop, Ctrl-C or kill would (SIGKILL: it dies on the spot)
    launcher.wait(timeout=120)
    want = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 130, signal.SIGKILL: -signal.SIGKILL}[sig]
    assert launcher.returncode == want, (launcher.returncode, (tmp_path / "run.log").read_text()[-2000:])
    left = wait_gone({p: s for p, s in started.items() if p != launcher.pid}, 60)
    assert not left, f"still running after {signal.Signals(sig).name} of the launcher: {left}"
    # the stopped run resumes where it stopped: the trainer goes on from its newest checkpoint
    done = RunDir(run_dir).latest_version()
    assert done is not None and done >= 1
    out = subprocess.run(_run_cmd(tiny_model_dir, run_dir, done + 1, "fresh=false", flags=("--json",)),
                         cwd=REPO,
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert RunDir(run_dir).latest_version() == done + 1
    assert max(_steps(run_dir)) == done and json.loads((run_dir / "summary.json").read_text())["steps"] == done + 1


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_stopping_a_swarm_launcher_stops_every_role(tiny_model_dir, tmp_path, started, sig):
    """Swarm mode: the orchestrator, trainer, adapter, validator, relay and both nodes, stopped with the launcher
    (SIGTERM, Ctrl-C) or gone with it (SIGKILL: each role's parent-death signal)."""
    run_dir = tmp_path / "run"
    cmd = _run_cmd(tiny_model_dir, run_dir, 1000, "swarm.full_check_rate=1.0", flags=())
    launcher = _start_and_wait_for_roles(cmd, run_dir, tmp_path / "run.log", started, SWARM_ROLES)
    os.kill(launcher.pid, sig)
    launcher.wait(timeout=120)  # a signal it did not act on (Ctrl-C ignored) would leave it running
    want = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 130, signal.SIGKILL: -signal.SIGKILL}[sig]
    assert launcher.returncode == want, (launcher.returncode, (tmp_path / "run.log").read_text()[-2000:])
    left = wait_gone({p: s for p, s in started.items() if p != launcher.pid}, 60)
    assert not left, f"still running after {signal.Signals(sig).name} of the swarm launcher: {left}"

