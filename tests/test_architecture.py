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


def _dotted(node: ast.AST) -> str:
    """``torch.optim.AdamW`` for the expression ``torch.optim.AdamW`` (the called name of a call)."""
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


_OPTIMIZER_CALL = re.compile(r"(^|\.)(optim\.[A-Z]\w*|lr_scheduler\.\w+|AdamW|Adam|SGD|LambdaLR)$")
BUILT_BY_BUILDERS = ("rl/trainer.py", "sft/train.py", "diloco/worker.py")


def optimizer_constructions(pkg: Path = PKG) -> list[str]:
    """Every torch optimizer or learning-rate scheduler constructed, and every warm-up rule written (a function
    or lambda on a ``warmup`` name), outside ``swarmrl/training/``."""
    found = []
    for p in sorted(pkg.rglob("*.py")):
        rel = p.relative_to(pkg)
        if rel.parts[0] == "training":
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Call) and _OPTIMIZER_CALL.search(_dotted(node.func)):
                found.append(f"{rel}:{node.lineno} {_dotted(node.func)}(")
            elif isinstance(node, (ast.FunctionDef, ast.Lambda)) and (
                    "warmup" in getattr(node, "name", "") or (isinstance(node, ast.Lambda) and any(
                        "warmup" in (getattr(n, "id", "") or getattr(n, "attr", "")) for n in ast.walk(node.body)))):
                found.append(f"{rel}:{node.lineno} a warm-up rule")
    return found


def test_optimizers_and_schedules_are_built_by_the_shared_builders():
    """The RL trainer, SFT and DiLoCo build their AdamW and learning-rate schedule through ``swarmrl.training``
    (``build_optimizer``, ``build_scheduler``, the one warm-up rule): no module outside it constructs a torch
    optimizer or scheduler or writes a warm-up of its own."""
    assert not optimizer_constructions(), optimizer_constructions()
    for rel in BUILT_BY_BUILDERS:
        names = _imports(PKG / rel)
        assert {"swarmrl.training.optim.build_optimizer", "swarmrl.training.schedule.build_scheduler"} <= names, rel


def test_the_training_builders_sit_below_the_commands():
    g = _graph()
    assert g["training"] <= {"config", "utils", "models", "eval", "rundir", "policy"}, g["training"]
    assert {"training"} <= g["rl"] & g["sft"] & g["diloco"]


RANK_ONLY_PARTS = {"source", "recorder", "evaluator", "versions", "publishers", "metrics", "tracker"}


def rank_branches(path: Path) -> tuple[list[int], list[int]]:
    """Lines of ``path`` that test the rank (a comparison with ``rank``, a ``lead`` flag), and lines that check a
    rank-0-only part (``source``, ``metrics``, ``tracker``, ...) for None."""
    ranks, nones = set(), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name) and node.id == "lead":
            ranks.add(node.lineno)
        if not isinstance(node, ast.Compare):
            continue
        leaves = {getattr(x, "id", None) or getattr(x, "attr", None) for x in (node.left, *node.comparators)}
        if "rank" in leaves:
            ranks.add(node.lineno)
        if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and leaves & RANK_ONLY_PARTS:
            nones.add(node.lineno)
    return sorted(ranks), sorted(nones)


def test_the_rl_trainer_loop_has_no_rank_branches():
    """What rank 0 alone does is done by rank-aware parts (``rl.parts``: a do-nothing one on the other ranks) and
    the collectives by the parallel strategy (``training.parallel``): the trainer compares no rank and checks no
    part for None (before: 13 rank tests, 6 None checks)."""
    ranks, nones = rank_branches(PKG / "rl" / "trainer.py")
    assert not ranks and not nones, (ranks, nones)
