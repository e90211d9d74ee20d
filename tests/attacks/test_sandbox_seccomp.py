"""The code sandbox's seccomp filter: a program that reaches native code (modelled with the audit hook off: the
hook is not a boundary on its own) and calls a system call it never needs (sockets, ptrace, mounts, new
namespaces, kexec, bpf, keys, perf events...) is killed at that call, gets reward 0, and the sandbox reports
the denied call. Each program prints the right answer after the call, so without the filter it would score 1."""

from __future__ import annotations

import os

import pytest

from swarmrl.envs.base import Task
from swarmrl.envs.code import CodeEnv
from swarmrl.envs.sandbox import SandboxLimits, isolation_level, run_program

pytestmark = [pytest.mark.skipif(isolation_level() != "namespaces", reason="no namespaces here"),
              pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="filter for x86_64/aarch64")]

ARM = os.uname().machine == "aarch64"
TASK = Task(task_id="add", env="code", prompt="add two numbers", task_type="verifiable_code",
            verification_info={"test_cases": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 7\n", "output": "12\n"}]})
ANSWER = "print(sum(map(int, input().split())))\n"

# (x86_64 number, aarch64 number, arguments): harmless arguments; each call would return (not crash) unfiltered
CALLS = {
    "socket(AF_INET)": (41, 198, (2, 1, 0)),
    "ptrace(TRACEME)": (101, 117, (0, 0, 0, 0)),
    "unshare(NEWUSER)": (272, 97, (0x10000000,)),
    "clone(NEWNET)": (56, 220, (0x40000000 | 17, 0, 0, 0, 0)),
    "mount": (165, 40, (0, 0, 0, 0, 0)),
    "setns": (308, 268, (-1, 0)),
    "bpf": (321, 280, (0, 0, 0)),
    "keyctl": (250, 219, (0, 0, 0, 0, 0)),
    "perf_event_open": (298, 241, (0, 0, -1, -1, 0)),
    "kexec_load": (246, 104, (0, 0, 0, 0)),
    "io_uring_setup": (425, 425, (1, 0)),
}


def _program(call: str) -> str:
    x86, arm, args = CALLS[call]
    nr = arm if ARM else x86
    return ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"libc.syscall({nr}, *{args!r})\n" + ANSWER)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_denied_syscall_gets_zero_reward_and_is_reported(call):
    env = CodeEnv(audit_hook=False, isolation="namespaces")
    assert env.verify(TASK, ANSWER) == 1.0  # the test is not vacuous: the plain answer passes
    assert env.verify(TASK, _program(call)) == 0.0
    run = run_program(_program(call), [{"input": "1 2\n"}], "stdio", SandboxLimits(audit_hook=False), "namespaces")
    r = run.results[0]
    assert run.error is None and run.seccomp
    assert r.status == "signal" and r.code == 31 and r.denied_syscall and not r.completed
    assert "seccomp" in r.stderr and r.stdout == ""


def test_ordinary_programs_still_run_under_the_filter():
    """Threads (glibc tries clone3, gets ENOSYS, falls back to clone), fork, the usual stdlib, user lookups."""
    progs = [
        "import threading\nout = []\nt = threading.Thread(target=lambda: out.append(1))\nt.start(); t.join()\n" + ANSWER,
        "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n" + ANSWER,
        "import random, re, json, heapq, bisect, itertools, functools, collections, fractions, decimal, math\n" + ANSWER,
        # a user lookup: glibc first asks nscd over an AF_UNIX socket, which fails (EACCES) instead of killing
        "import os, pwd\ntry:\n    pwd.getpwuid(os.getuid())\nexcept KeyError:\n    pass\n" + ANSWER,
    ]
    env = CodeEnv(audit_hook=False, isolation="namespaces")
    for p in progs:
        assert env.verify(TASK, p) == 1.0, p
    run = run_program(progs[0], [{"input": "1 2\n"}], "stdio", SandboxLimits(audit_hook=False), "namespaces")
    assert run.seccomp and run.results[0].status == "ok" and not run.results[0].denied_syscall
