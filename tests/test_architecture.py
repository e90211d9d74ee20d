"""The layout's rules, read from the code: its imports (every import, function-level ones included, and
modules imported by name: a string naming a module of the package, as ``importlib.import_module`` or a preload
list takes it), its module and function lengths, and how its classes are put together (no mixins; the
orchestrator's services use each other's public members only)."""

import ast
import re
import sys
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
                *(f"diloco/trust/{m}.py" for m in ("judge", "wire", "scoring", "calibration", "rounds")),
                *(str(p.relative_to(PKG)) for p in (PKG / "rl" / "losses").rglob("*.py")),
                *(str(p.relative_to(PKG)) for p in (PKG / "contract").glob("*.py"))):
        names = _imports(PKG / rel)
        bad = {n for n in names if n.split(".")[0] in SERVERS or any(n.startswith(o) for o in ours)}
        assert not bad, (rel, bad)


def test_the_rollout_wire_format_sits_below_the_trainer_and_the_protocol():
    """The validator and the orchestrator read rollouts through ``rollouts``, never through trainer code; the
    wire format, its limits and the packing import only the contract and the config system (and their array
    libraries), no server."""
    g = _graph()
    assert "rl" not in g["protocol"], g["protocol"]
    assert g["rollouts"] <= {"contract", "utils", "config"}, g["rollouts"]
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


def _mixins(pkg: Path) -> list[str]:
    """Classes named ``*Mixin`` anywhere in ``pkg``, and classes of the orchestrator that inherit from several
    classes (a service is composed of the pieces it is given, not assembled from bases)."""
    found: list[tuple[str, int, str]] = []
    for f in sorted(pkg.rglob("*.py")):
        orchestrator = f.relative_to(pkg).parts[:2] == ("protocol", "orchestrator")
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.ClassDef) and (node.name.endswith("Mixin") or (orchestrator and len(node.bases) > 1)):
                found.append((str(f.relative_to(pkg)), node.lineno, f"{node.name}({', '.join(map(ast.unparse, node.bases))})"))
    return [f"{f}:{line} {what}" for f, line, what in sorted(found)]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_privates(cls: ast.ClassDef) -> set[str]:
    """The private names a class defines itself: its methods, class attributes given a value (any annotated one
    in a dataclass), and attributes its methods assign on ``self`` / ``cls``. A bare annotation elsewhere only
    declares a member it expects from somewhere else (as a mixin declares its host's)."""
    dataclass = any("dataclass" in ast.unparse(d) for d in cls.decorator_list)
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and (node.value or dataclass):
            names.add(node.target.id)
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for x in ast.walk(target):
                if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id in ("self", "cls"):
                    names.add(x.attr)
    return {n for n in names if _private(n)}


def _private_reaches(root: Path) -> list[str]:
    """Every use of another object's private member in the modules under ``root``: an attribute ``x._name`` (or
    ``getattr(x, "_name")``, ``setattr``, ``hasattr``) whose ``x`` is not ``self`` or ``cls``, and a
    ``self._name`` the class does not define itself (borrowed from another class: a mixin's host or sibling, a
    base). Dunder names are the language's, not private. No exceptions: what one piece needs of another is a
    public method or attribute."""
    def own(x: ast.expr) -> bool:
        return isinstance(x, ast.Name) and x.id in ("self", "cls")

    found: list[tuple[str, int, int, str]] = []
    for f in sorted(root.rglob("*.py")):
        tree = ast.parse(f.read_text(), str(f))
        borrowed: set[int] = set()  # ids of self._x nodes whose class does not define _x
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            mine = _own_privates(cls)
            borrowed.update(id(x) for x in ast.walk(cls) if isinstance(x, ast.Attribute) and own(x.value)
                            and _private(x.attr) and x.attr not in mine)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and (not own(node.value) or id(node) in borrowed):
                found.append((str(f.relative_to(root)), node.lineno, node.col_offset, ast.unparse(node)))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                  and _private(node.args[1].value) and not own(node.args[0])):
                found.append((str(f.relative_to(root)), node.lineno, node.col_offset, ast.unparse(node)))
    return [f"{f}:{line} {what}" for f, line, _col, what in sorted(found)]


def test_no_mixins():
    """No class is assembled from mixins: the orchestrator is services composed by ``Orchestrator``, each given the
    pieces it uses (a mixin shares its host's state and reaches the other mixins' private methods)."""
    found = _mixins(PKG)
    assert not found, found


def test_the_orchestrators_parts_use_each_others_public_members_only():
    """No code of the orchestrator reaches into another object's private members (``other._x``): a service that
    needs another's behaviour gets it injected and calls its public API."""
    found = _private_reaches(PKG / "protocol" / "orchestrator")
    assert not found, found


def test_the_class_readers_see_mixins_and_private_reaches(tmp_path):
    pkg = tmp_path / "swarmrl"
    (pkg / "protocol" / "orchestrator").mkdir(parents=True)
    (pkg / "rl").mkdir()
    (pkg / "rl" / "a.py").write_text("class StatsMixin:\n    pass\n\n\nclass Fine(Base):\n    pass\n")
    (pkg / "protocol" / "orchestrator" / "s.py").write_text(
        "class Service(A, B):\n    _y = 1\n\n    def __init__(self):\n        self._x = 0\n\n"
        "    def run(self, other):\n        self._x, self._y, self._run(), other.__dict__\n"
        "        other._state(1)\n        getattr(other, '_z')\n        self.db._lock\n        self._verify()\n\n"
        "    def _run(self):\n        pass\n\n\nclass HostMixin:\n    _verify: object\n")
    assert [m.split(" ", 1)[1] for m in _mixins(pkg)] == ["Service(A, B)", "HostMixin()", "StatsMixin()"]
    assert [r.split(" ", 1)[1] for r in _private_reaches(pkg / "protocol" / "orchestrator")] == [
        "other._state", "getattr(other, '_z')", "self.db._lock", "self._verify"]


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
    assert g["training"] <= {"config", "utils", "models", "eval", "rundir"}, g["training"]
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


MAX_PARAMETERS = 10  # a public function, method or constructor of this many parameters at most (self/cls not counted)


def _wide_functions(pkg: Path, limit: int) -> dict[str, int]:
    """Public functions, methods and constructors of public classes over ``limit`` parameters. The CLI is left out:
    a typer command's parameters are its options, documented by ``--help``."""
    wide = {}
    for p in sorted(pkg.rglob("*.py")):
        rel = p.relative_to(pkg)
        if rel.parts[0] == "cli":
            continue

        def visit(body: list, owner: str | None) -> None:
            for node in body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    visit(node.body, node.name)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        not node.name.startswith("_") or (owner and node.name == "__init__")):
                    a = node.args
                    n = sum(1 for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls"))
                    if n > limit:
                        wide[f"{rel}:{node.lineno} {owner + '.' if owner else ''}{node.name}"] = n

        visit(ast.parse(p.read_text(), str(p)).body, None)
    return wide


def test_no_public_function_over_the_parameter_budget():
    """A wide signature is a set of values that travel together without a name: such a set is a frozen option
    object (``FetchOptions``, ``TokenLimits``, ``Samples`` / ``RowOrigin``, ``WholeBatch`` / ``Passes``, ...)."""
    wide = _wide_functions(PKG, MAX_PARAMETERS)
    assert not wide, wide


def test_the_parameter_reader_sees_methods_and_constructors_but_not_privates(tmp_path):
    f = tmp_path / "pkg" / "m.py"
    f.parent.mkdir()
    args = ", ".join(f"a{i}" for i in range(MAX_PARAMETERS + 1))
    f.write_text(f"def wide({args}):\n    pass\n\n\ndef _wide({args}):\n    pass\n\n\n"
                 f"class C:\n    def __init__(self, {args}):\n        pass\n\n    def m(self, {args}):\n        pass\n\n"
                 f"    def fine(self, a0):\n        pass\n\n\nclass _P:\n    def m(self, {args}):\n        pass\n")
    assert sorted(k.split(" ")[1] for k in _wide_functions(f.parent, MAX_PARAMETERS)) == ["C.__init__", "C.m", "wide"]


ARCHITECTURE_DOC = PKG.parent / "docs" / "architecture.md"


def _documented_layers() -> dict[str, int]:
    """The floors drawn in docs/architecture.md (the fenced block after ``<!-- layers``): package -> floor."""
    text = ARCHITECTURE_DOC.read_text()
    block = text[text.index("<!-- layers"):]
    block = block[block.index("```") + 3:]
    block = block[block.index("\n") + 1: block.index("```")]
    floors: dict[str, int] = {}
    for line in block.splitlines():
        left = line.split("|")[0].split()
        if left and left[0].isdigit():
            for name in left[1:]:
                floors[name] = int(left[0])
    return floors


def test_the_layers_drawn_in_the_docs_are_the_code_s():
    """Every subpackage stands on a floor of the picture, and every import between subpackages goes to a lower
    floor: the picture is the code's, and a change that imports upward (or adds a package) updates it."""
    floors = _documented_layers()
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()} | {"config"}
    assert packages <= set(floors), f"not drawn: {sorted(packages - set(floors))}"
    assert set(floors) <= packages, f"drawn but not in the code: {sorted(set(floors) - packages)}"
    upward = [f"{src} (floor {floors[src]}) -> {dst} (floor {floors[dst]})"
              for src, dsts in _graph().items() if src in floors for dst in dsts if floors[dst] >= floors[src]]
    assert not upward, upward


def test_the_layer_reader_reads_the_picture(tmp_path, monkeypatch):
    doc = tmp_path / "architecture.md"
    doc.write_text("x\n<!-- layers -->\n```\n2  rl  sft      | a\n                 | more\n1  config | b\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ARCHITECTURE_DOC", doc)
    assert _documented_layers() == {"rl": 2, "sft": 2, "config": 1}
