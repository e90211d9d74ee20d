"""CLI start-up: `python -m swarmrl --help` against a bare `python -c pass` (the in-run baseline).

    python benchmarks/cli/bench.py [--runs 15] [--python PATH]

Both commands run with the same interpreter, alternating (so load that comes and goes hits both alike), after
one untimed warm-up run of each (page cache, .pyc files). Prints ONE JSON line: medians in seconds of wall
time (``help_s``, ``python_s``) and of child CPU time (``*_cpu_s``, less sensitive to a busy machine than
wall time), their ratio, the minima, the number of modules ``--help`` leaves in ``sys.modules``, which heavy
packages it imported (should be none), the 1-minute load average before and after (noise indicator) and
whether PYTHONDONTWRITEBYTECODE is set (then the repo's own modules are compiled on every start).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "aiohttp", "fastapi", "uvicorn", "sqlalchemy", "pyarrow", "matplotlib")

_PROBE = """
import json, sys
heavy = json.loads(sys.argv[1])
sys.argv = ["swarmrl", "--help"]
from swarmrl.cli import main
try:
    main()
except SystemExit:
    pass
print("\\n@@" + json.dumps({"modules": len(sys.modules), "heavy": [m for m in heavy if m in sys.modules]}))
"""


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run; the command must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="timed runs of each command (default 15)")
    ap.add_argument("--python", default=sys.executable, help="interpreter to start (default: this one)")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    help_cmd = [args.python, "-m", "swarmrl", "--help"]
    base_cmd = [args.python, "-c", "pass"]
    load_before = os.getloadavg()[0]
    timed(help_cmd)
    timed(base_cmd)
    samples: dict[str, list[tuple[float, float]]] = {"help": [], "python": []}
    for _ in range(args.runs):
        samples["help"].append(timed(help_cmd))
        samples["python"].append(timed(base_cmd))
    load_after = os.getloadavg()[0]

    probe = subprocess.run([args.python, "-c", _PROBE, json.dumps(HEAVY)], cwd=ROOT, capture_output=True, text=True,
                           check=True)
    info = json.loads(probe.stdout.rsplit("\n@@", 1)[-1])

    def med(name: str, i: int) -> float:
        return statistics.median(s[i] for s in samples[name])

    help_s, python_s = med("help", 0), med("python", 0)
    print(json.dumps({
        "help_s": round(help_s, 4),
        "python_s": round(python_s, 4),
        "help_over_python": round(help_s / python_s, 2),
        "help_cpu_s": round(med("help", 1), 4),
        "python_cpu_s": round(med("python", 1), 4),
        "help_min_s": round(min(s[0] for s in samples["help"]), 4),
        "python_min_s": round(min(s[0] for s in samples["python"]), 4),
        "runs": args.runs,
        "help_modules": info["modules"],
        "help_heavy_imports": info["heavy"],
        "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
        "cpus": os.cpu_count(),
        # set: no .pyc is written, so sources without one (the repo's own) are compiled on every start
        "dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
        "python": args.python,
    }))


if __name__ == "__main__":
    main()
