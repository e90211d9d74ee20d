"""Verifier cost: the code sandbox against a bare ``python -I -S`` subprocess (the in-run baseline),
and math answer checking (fast path vs the math-verify worker).

    PYTHONPATH=$PWD python benchmarks/envs/bench.py [--reps 20]
"""

from __future__ import annotations

import argparse
import subprocess
import time

from swarmrl.envs.base import Task
from swarmrl.envs.math import MathEnv
from swarmrl.envs.sandbox import SandboxLimits, _python, isolation_level, run_program

PROG = "a, b = map(int, input().split())\nprint(a + b)"


def timed(fn, reps: int) -> float:
    fn()  # warm
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    py = _python()
    lim = SandboxLimits()
    base = timed(lambda: subprocess.run([py, "-I", "-S", "-c", PROG], input=b"1 2\n", capture_output=True,
                                        check=True), args.reps)
    print(f"isolation available: {isolation_level()}")
    print(f"baseline  bare python -I -S subprocess, 1 case : {base * 1e3:7.1f} ms  (1.00x)")
    rows = [("namespaces", 1), ("namespaces", 10), ("fallback", 1), ("fallback", 10)]
    for iso, n in rows:
        if iso == "namespaces" and isolation_level() != "namespaces":
            continue
        cases = [{"input": f"{i} {i}\n"} for i in range(n)]
        t = timed(lambda: run_program(PROG, cases, "stdio", lim, iso), args.reps)
        print(f"sandbox   {iso:10s} {n:2d} case(s) per run        : {t * 1e3:7.1f} ms  "
              f"({t / base:.2f}x baseline; {t / n * 1e3:.1f} ms/case = {t / n / base:.2f}x)")
    env = MathEnv(timeout_s=10)
    task = Task("math:b", "math", "p", {"ground_truth": r"\frac{1}{2}"}, "verifiable_math")
    sym = Task("math:c", "math", "p", {"ground_truth": "x^2+2x+1"}, "verifiable_math")
    fast = timed(lambda: env.verify(task, r"so \boxed{0.5}"), args.reps * 10)
    slow = timed(lambda: env.verify(sym, r"so \boxed{(x+1)^2}"), args.reps)
    print(f"math      numeric fast path                    : {fast * 1e3:7.3f} ms")
    print(f"math      symbolic (math-verify worker)        : {slow * 1e3:7.1f} ms  ({slow / fast:.0f}x fast path)")


if __name__ == "__main__":
    main()
