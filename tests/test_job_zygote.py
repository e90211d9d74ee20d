"""The launcher's zygote: roles forked from one process that imported their modules once are real processes of
their own (own session, own log, own title, their exit codes and signals reported like Popen's)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from swarmrl.job.zygote import Zygote, fresh_random_state, preload_modules
from swarmrl.protocol.signing import generate_key, public_key_hex


@pytest.fixture
def zygote(tmp_path):
    z = Zygote(["json", "swarmrl.config"], tmp_path / "zygote.log")
    yield z
    z.close()


def test_a_forked_role_runs_the_command_line_and_reports_its_exit_code(zygote, tmp_path):
    ok = zygote.spawn(["rl", "--help"], tmp_path / "ok.log", dict(os.environ))
    assert ok.wait(60) == 0 and "trainer" in (tmp_path / "ok.log").read_text()
    bad = zygote.spawn(["rl", "trainer", "--no-such-option"], tmp_path / "bad.log", dict(os.environ))
    assert bad.wait(60) == 2 and "no-such-option" in (tmp_path / "bad.log").read_text()
    assert bad.poll() == 2 and ok.pid != bad.pid


def test_a_forked_role_is_its_own_session_with_its_own_title_and_dies_by_signal(zygote, tmp_path):
    # a relay serves until signalled, whether or not its upstream answers
    argv = ["shardcast", "relay", "--upstream", "http://127.0.0.1:9", "--dir", str(tmp_path / "relay"), "--port", "0",
            "--origin-pubkey", public_key_hex(generate_key())]
    p = zygote.spawn(argv, tmp_path / "relay.log", dict(os.environ))
    deadline = time.monotonic() + 60
    log = tmp_path / "relay.log"  # made by the child
    while time.monotonic() < deadline and not (log.is_file() and b"relay serving" in log.read_bytes()):
        time.sleep(0.05)
    assert p.poll() is None, log.read_text()
    assert b"-m swarmrl shardcast relay --upstream" in _cmdline(p.pid)  # ps shows the role, not the zygote
    assert os.getpgid(p.pid) == p.pid and os.getsid(p.pid) == p.pid
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(0.1)
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait(60) == -signal.SIGKILL


def _draws_in_children(reseed: bool) -> list[bytes]:
    import numpy as np
    import torch

    np.random.rand(), torch.rand(1)  # both generators made (numpy's lazily) in the parent, as in the zygote
    outs = []
    for _ in range(2):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            if reseed:
                fresh_random_state()
            os.write(w, f"{torch.rand(1).item()} {np.random.rand()}".encode())
            os._exit(0)
        os.close(w)
        outs.append(os.read(r, 200))
        os.close(r)
        os.waitpid(pid, 0)
    return outs


def test_forked_children_draw_different_random_numbers():
    a, b = _draws_in_children(reseed=False)
    assert a == b  # what a plain fork gives: the parent's generator state, twice
    a, b = _draws_in_children(reseed=True)
    assert a != b


def test_a_forked_role_ends_as_an_interpreter_would(tmp_path):
    """A forked role ends with ``os._exit`` (it must not return into the zygote's loop); before that it waits
    for its non-daemon threads and runs its atexit functions, in that order, as a spawned role's interpreter
    does (a node's last upload thread, a checker subprocess closed at exit)."""
    import atexit
    import threading

    from swarmrl.job.zygote import _shut_down

    out = tmp_path / "order.txt"
    pid = os.fork()
    if pid == 0:
        def late() -> None:
            time.sleep(0.3)
            with out.open("a") as f:
                f.write("thread\n")

        atexit._clear()  # not pytest's own exit functions, in this child
        threading.Thread(target=late).start()
        atexit.register(lambda: out.open("a").write("atexit\n"))
        try:
            _shut_down()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert out.read_text().split() == ["thread", "atexit"]


def test_preload_names_the_models_architecture(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    assert preload_modules(tmp_path)[-1] == "transformers.models.qwen2.modeling_qwen2"
    (tmp_path / "config.json").write_text('{"model_type": "../evil"}')
    assert not any("evil" in m for m in preload_modules(tmp_path))
    assert "torch" in preload_modules(None)


def _cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
    except OSError:
        return b""


def test_the_supervisor_forks_torch_roles_and_spawns_the_rest_plainly_even_without_a_zygote(tmp_path):
    import subprocess as sp

    from swarmrl.job.derive import RoleSpec
    from swarmrl.job.supervisor import Supervisor
    from swarmrl.job.zygote import ZygoteChild

    z = Zygote(["json"], tmp_path / "zygote.log")
    said: list[str] = []
    sup = Supervisor(tmp_path / "logs", said.append, zygote=z)
    worker = RoleSpec("w", ["rl", "worker", "--help"], restart="never")
    relay = RoleSpec("r", ["shardcast", "relay", "--help"], restart="never")
    assert sup.forks(worker) and not sup.forks(relay)
    assert isinstance(sup.start(worker), ZygoteChild) and isinstance(sup.start(relay), sp.Popen)
    assert sup.procs["w"].wait(60) == 0 and sup.procs["r"].wait(60) == 0
    z.close()  # gone: the next torch role starts plainly, and the run says so
    assert isinstance(sup.start(RoleSpec("w2", ["rl", "worker", "--help"], restart="never")), sp.Popen)
    assert sup.procs["w2"].wait(60) == 0 and any("zygote" in m for m in said)
