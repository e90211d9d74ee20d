"""The layout's rules, read from the code's imports (every import, function-level ones included)."""

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "swarmrl"
SERVERS = {"fastapi", "starlette", "uvicorn", "aiohttp", "httpx", "sqlalchemy"}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the project uses absolute imports)"
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
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


def test_nothing_imports_the_cli_and_the_contract_stays_pure():
    g = _graph()
    assert not [src for src, dsts in g.items() if "cli" in dsts and src not in ("cli", "__main__")]
    assert g["contract"] <= {"envs", "config"}, g["contract"]


def test_the_math_imports_no_server():
    ours = {"swarmrl.protocol", "swarmrl.shardcast", "swarmrl.job", "swarmrl.swarm", "swarmrl.cli"}
    for rel in ("rl/loss.py", "rl/train_step.py", "rollouts/packing.py", "toploc/proof.py", "toploc/verify.py",
                "diloco/outer.py", *(str(p.relative_to(PKG)) for p in (PKG / "contract").glob("*.py"))):
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
