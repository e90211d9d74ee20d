"""Rules the test suite keeps about itself: no unit test asserts how fast something ran (the machines are shared
and noisy; a test asserts order and effect, and benchmarks/ time things)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}


def _reads_clock(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in CLOCKS:
                return True
    return False


def _elapsed(node: ast.AST, names: set[str]) -> bool:
    """``node`` is a time taken: ``clock() - t0``, or a name assigned one."""
    if isinstance(node, ast.Name):
        return node.id in names
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _reads_clock(node.left)


def wall_clock_upper_bounds(source: str) -> list[int]:
    """Lines of ``assert``s that bound a time taken from above (``assert clock() - t0 < 2.0``, ``took < 20``);
    lower bounds (a rate limit holds) and deadlines (``clock() < end``) are not that."""
    tree = ast.parse(source)
    names = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _elapsed(n.value, set())
             for t in n.targets if isinstance(t, ast.Name)}
    lines = []
    for a in ast.walk(tree):
        if not isinstance(a, ast.Assert):
            continue
        for c in ast.walk(a.test):
            if not isinstance(c, ast.Compare):
                continue
            sides = [c.left, *c.comparators]
            for i, op in enumerate(c.ops):
                below = (isinstance(op, (ast.Lt, ast.LtE)) and _elapsed(sides[i], names)) or \
                        (isinstance(op, (ast.Gt, ast.GtE)) and _elapsed(sides[i + 1], names))
                if below:
                    lines.append(a.lineno)
    return sorted(set(lines))


def test_no_unit_test_asserts_a_wall_clock_upper_bound():
    found = {str(p.relative_to(TESTS)): got for p in sorted(TESTS.rglob("*.py"))
             if (got := wall_clock_upper_bounds(p.read_text()))}
    assert not found, found


def test_the_reader_finds_upper_bounds_and_leaves_deadlines_and_lower_bounds():
    src = """
import time
def f():
    t0 = time.monotonic()
    assert time.monotonic() - t0 < 1.0
    took = time.perf_counter() - t0
    assert took <= 2 and True
    assert 3 > took
    end = time.monotonic() + 5
    assert time.monotonic() < end, "deadline"
    assert time.monotonic() - t0 >= 0.4
    assert len([1]) < 2
"""
    assert wall_clock_upper_bounds(src) == [5, 7, 8]
