"""What an optional extra's own environment installs, read from pyproject.toml (scripts/setup-vllm.sh and
scripts/setup-verifiers.sh): line 1 torch's pin, then the project's other dependencies, the extra's, and the
named packages of the `dev` extra.

    python scripts/extra_requirements.py EXTRA [DEV_PACKAGE ...]
"""

import re
import sys
import tomllib


def name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()


def main(extra: str, dev: list[str]) -> None:
    with open("pyproject.toml", "rb") as f:
        p = tomllib.load(f)["project"]
    extras = p["optional-dependencies"]
    if extra not in extras:
        sys.exit(f"error: pyproject.toml has no extra {extra!r}")
    torch = [r for r in p["dependencies"] if name(r) == "torch"]
    reqs = [r for r in p["dependencies"] if name(r) != "torch"] + extras[extra]
    reqs += [r for r in extras["dev"] if name(r) in dev]
    print("\n".join(torch + reqs))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
