"""``python -m swarmrl.envs.sandbox_check [--expect LEVEL]``: what this machine gives the code sandbox, as JSON
(isolation level, whether the seccomp filter installs, why namespaces did not work, uid, cpus); with ``--expect``,
exit 1 when that is less than LEVEL with the seccomp filter. CI asserts the level its machines must give
(``.ci/run``): the sandbox fails closed without it, so a machine that lost it would refuse every code task."""

from __future__ import annotations

import argparse
import json
import os
import sys

from swarmrl.envs.sandbox import LEVELS, expectation_problems, sandbox_status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m swarmrl.envs.sandbox_check",
                                 description="Print the code sandbox's isolation on this machine.")
    ap.add_argument("--expect", choices=LEVELS, help="exit 1 unless the isolation is at least this, with seccomp")
    args = ap.parse_args(argv)
    status = sandbox_status()
    print(json.dumps({**status, "uid": os.geteuid(), "cpus": os.cpu_count()}))
    problems = expectation_problems(status, args.expect) if args.expect else []
    for p in problems:
        print(f"error: code sandbox: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
