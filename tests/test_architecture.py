"""The layout's rules, read from the code: its imports (every import, function-level ones included, and
modules imported by name: a string naming a module of the package, as ``importlib.import_module`` or a preload
list takes it), its module and function lengths."""

import ast
import re
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "swarmrl"
SERVERS = {"fastapi", "starlette", "uvicorn", "aiohttp", "httpx", "sqlalchemy"}
_DOTTED = re.compile(r"^swarmrl(\.[A-Za-z_]\w*)+(:\w+)?$")  # "swarmrl.x.y", or "swarmrl.x.y:attr" (an entry point)


def _is_module(name: str) -> bool:
    """``name`` (``swarmrl.x.y``) is a module of the package: a file x/y.py or a package x/y/."""
    p = PKG.parent.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the project uses absolute imports)"
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.match(node.value):
            name = node.value.split(":")[0]
            if _is_module(name):  # imported by name (a logger named after its module names its own component)
                out.add(name)
    return out


def _component(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if parts[0] == "swarmrl" and len(parts) > 1 else None


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = defaultdict(set)
    for f in PKG.rglob("*.py"):
        src = _component(".".join(f.relative_to(PKG.parent).with_suffix("").parts))
        if src is None:
            continue
        for name in _imports(f):
            dst = _component(name)
            if dst and dst != src and ((PKG / dst).is_dir() or (PKG / f"{dst}.py").is_file()):
                g[src].add(dst)
    return g


def test_no_import_cycle_between_subpackages():
    g = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)


def test_the_import_reader_sees_function_level_imports_and_imports_by_name(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import importlib\n\n\ndef run():\n    from swarmrl.cli import app\n    return app\n\n\n"
                 "def load():\n    return importlib.import_module('swarmrl.cli')\n")
    assert {"swarmrl.cli", "swarmrl.cli.app"} <= _imports(f)
    f.write_text("def load():\n    return __import__('importlib').import_module('swarmrl.cli')\n")
    assert "swarmrl.cli" in _imports(f)


def test_nothing_imports_the_cli_and_the_contract_stays_pure():
    g = _graph()
    assert not [src for src, dsts in g.items() if "cli" in dsts and src not in ("cli", "__main__")]
    assert g["contract"] <= {"envs", "config"}, g["contract"]


def test_the_math_imports_no_server():
    ours = {"swarmrl.protocol", "swarmrl.shardcast", "swarmrl.job", "swarmrl.swarm", "swarmrl.cli"}
    for rel in ("rl/train_step.py", "rollouts/packing.py", "toploc/proof.py", "toploc/verify.py", "diloco/outer.py",
                *(str(p.relative_to(PKG)) for p in (PKG / "rl" / "losses").rglob("*.py")),
                *(str(p.relative_to(PKG)) for p in (PKG / "contract").glob("*.py"))):
        names = _imports(PKG / rel)
        bad = {n for n in names if n.split(".")[0] in SERVERS or any(n.startswith(o) for o in ours)}
        assert not bad, (rel, bad)


def test_the_rollout_wire_format_sits_below_the_trainer_and_the_protocol():
    """The validator and the orchestrator read rollouts through ``rollouts``, never through trainer code; the
    wire format and the packing import only the contract (and their array libraries), no server."""
    g = _graph()
    assert "rl" not in g["protocol"], g["protocol"]
    assert g["rollouts"] <= {"contract", "utils"}, g["rollouts"]
    for f in (PKG / "rollouts").glob("*.py"):
        bad = {n for n in _imports(f) if n.split(".")[0] in SERVERS}
        assert not bad, (f.name, bad)


def test_no_module_over_500_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_no_function_over_100_lines():
    """Every function (methods and nested functions included) fits on a screen or two: a longer one is split into
    named steps."""
    long = {}
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 100:
                    long[f"{p.relative_to(PKG)}:{node.lineno} {node.name}"] = n
    for where, n in sorted(long.items(), key=lambda kv: -kv[1]):
        print(f"{n} lines: {where}")
    assert not long, long
