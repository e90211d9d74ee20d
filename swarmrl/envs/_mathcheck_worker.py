"""Answer-equivalence worker for the math environment (run as a separate process).

Protocol: one JSON object per stdin line, ``{"gold": str, "pred": str}`` (both already the
*contents* of a ``\\boxed{}``); one JSON line back, ``{"ok": bool}``. The parent enforces a wall
time limit and kills/restarts this process on overrun, and this process caps its own address
space, so a pathological expression (``10^{10^{10}}``, deep nesting) can only cost a restart.
This file imports nothing from swarmrl so it can be run by path.
"""

from __future__ import annotations

import sys

# This file sits next to swarmrl/envs/math.py, which would shadow the stdlib ``math`` module if the
# script's own directory stayed on sys.path (the parent also runs us with -I).
sys.path[:] = [p for p in sys.path if p and not p.rstrip("/").endswith("swarmrl/envs")]

import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

MEM_BYTES = 2 * 1024**3


def _guard():  # noqa: ANN202
    """``_worker_guard.py`` beside this file, loaded by path (this directory is off sys.path, see above)."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("_worker_guard", Path(__file__).resolve().parent / "_worker_guard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


guard = _guard()


# --- sympy fallback: a tiny whitelisted LaTeX -> sympy-syntax rewrite (never eval'd unchecked) ---
_ALLOWED_NAMES = {"sqrt", "pi", "E", "I", "oo", "exp", "log", "sin", "cos", "tan"}
_SAFE = re.compile(r"^[0-9A-Za-z+\-*/().,\s]*$")


def _latex_to_expr(s: str) -> str | None:
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\(left|right|displaystyle|,|;|!|\s)", "", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", " pi ").replace("\\infty", " oo ")
    for _ in range(20):  # \frac{a}{b} -> ((a)/(b)), innermost first
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        new = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", new)
        if new == s:
            break
        s = new
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    if "\\" in s or not _SAFE.match(s.replace("**", "*")) or "__" in s:
        return None
    for name in re.findall(r"[A-Za-z_]+", s):
        if len(name) > 1 and name not in _ALLOWED_NAMES:
            return None
    if len(s) > 200 or s.count("**") > 4:
        return None
    return s


def _sympy_equal(gold: str, pred: str) -> bool:
    import sympy  # noqa: PLC0415  # lazy: sandbox
    from sympy.parsing.sympy_parser import implicit_multiplication, parse_expr, standard_transformations  # noqa: PLC0415  # lazy: sandbox

    g, p = _latex_to_expr(gold), _latex_to_expr(pred)
    if not g or not p:
        return False
    names = {n: sympy.Symbol(n) for n in "abcdfghjklmnopqrstuvwxyz"}
    names.update(pi=sympy.pi, E=sympy.E, I=sympy.I, oo=sympy.oo, sqrt=sympy.sqrt, exp=sympy.exp,
                 log=sympy.log, sin=sympy.sin, cos=sympy.cos, tan=sympy.tan)
    # only what parse_expr's generated code needs; no builtins (the input is also whitelisted above)
    glob = {"__builtins__": {}, **{k: getattr(sympy, k) for k in
                                   ("Integer", "Float", "Rational", "Symbol", "Add", "Mul", "Pow")}, **names}
    tr = standard_transformations + (implicit_multiplication,)
    try:
        ge = parse_expr(g, local_dict=dict(names), global_dict=glob, transformations=tr, evaluate=False)
        pe = parse_expr(p, local_dict=dict(names), global_dict=glob, transformations=tr, evaluate=False)
        return bool(sympy.simplify(ge - pe) == 0)
    except Exception:  # noqa: BLE001
        return False


def equal(gold: str, pred: str) -> bool:
    try:
        from math_verify import parse, verify  # noqa: PLC0415  # lazy: sandbox

        g = parse("\\boxed{" + gold + "}", parsing_timeout=3)
        p = parse("\\boxed{" + pred + "}", parsing_timeout=3)
        if g and p and verify(g, p, timeout_seconds=3):
            return True
    except Exception:  # noqa: BLE001 - any failure falls through to the sympy path
        pass
    return _sympy_equal(gold, pred)


def main() -> None:
    guard.die_with_parent()
    guard.limit_memory(MEM_BYTES)
    try:  # warm the imports before answering the first request
        import math_verify  # noqa: F401, PLC0415  # lazy: sandbox
    except Exception:  # noqa: BLE001
        pass
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            guard.limit_cpu(req.get("cpu_s"))
            ok = equal(str(req["gold"]), str(req["pred"]))
        except MemoryError:
            ok = False
        except Exception:  # noqa: BLE001
            ok = False
        sys.stdout.write(json.dumps({"ok": bool(ok)}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
