"""Programming problems verified by running the completion's program in the sandbox.

Task file records (JSONL or parquet; INTELLECT-2 style): ``prompt``, ``task_type`` (default
``"verifiable_code"``), optional ``task_id``/``problem_id`` and ``solution`` (a correct completion,
used as the SFT demonstration), and ``verification_info`` (a dict or a JSON string of one) holding
any of:

* stdin/stdout tests: ``{"language": "python", "test_cases": [{"input": "1 2\\n", "output": "3\\n"}]}``
  (the program reads stdin and prints; outputs compared line by line ignoring trailing whitespace,
  then token by token with a 1e-6 relative tolerance on numbers);
* call tests: ``{"fn_name": "add", "test_cases": [{"input": [1, 2], "output": 3}]}`` (``input`` is
  the argument list, ``output`` the expected JSON value; either may be a JSON string of it). The
  return value is JSON-encoded inside the sandbox and compared by the host;
* assert tests: ``{"tests": "assert add(1, 2) == 3\\nassert add(0, 0) == 0"}`` (each top-level
  ``assert`` is one test; the other top-level statements, e.g. imports, run before each) or a list of
  such snippets, one test each. Weaker against hostile programs (see ``swarmrl.envs.sandbox``).

``language`` must be ``python`` when given. The completion's program is the last fenced code block
(```python / ```py / ```), an unterminated trailing one, or else the whole text. Reward: the fraction
of tests passed (``all_or_nothing=True``: 1 only if all pass). A failed sandbox gives 0; never raises, except
``VerifierUnavailable`` when ``strict`` and the sandbox itself failed (the validator's setting).

Isolation fails closed (``swarmrl.envs.sandbox``): the env refuses to be built where kernel namespaces are not
available (``isolation = "namespaces"``, the default) or the seccomp filter does not install
(``require_seccomp = true``), with an error saying which; ``isolation = "auto"`` or ``"fallback"`` and
``require_seccomp = false`` (task params) accept the weaker isolation explicitly.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path
from typing import Any

from swarmrl.envs.base import Task, VerifierUnavailable
from swarmrl.envs.datafile import DataFileError, FileEnvironment, Record
from swarmrl.envs.registry import register_env
from swarmrl.envs.sandbox import (
    NO_SECCOMP_MESSAGE,
    CaseResult,
    SandboxLimits,
    no_namespaces_message,
    run_program,
    sandbox_status,
)

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_CODE_PATH = DATA_DIR / "code_sample.jsonl"
MAX_COMPLETION_CHARS = 64 * 1024

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*)$", re.DOTALL)


def extract_program(completion: str) -> str:
    """The last ```python (or ```py, or bare ```) block; an unterminated trailing one; else all text."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(completion)]
    py = [body for lang, body in blocks if lang in ("python", "python3", "py", "")]
    if py:
        return py[-1]
    last_close = completion.rfind("```")
    if last_close != -1:
        m = _OPEN_FENCE.search(completion, last_close)
        if m:
            return m.group(1)
    return completion


def _norm_lines(s: str) -> list[str]:
    lines = [ln.rstrip() for ln in s.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def outputs_match(got: str, want: str) -> bool:
    if _norm_lines(got) == _norm_lines(want):
        return True
    gt, wt = got.split(), want.split()
    if len(gt) != len(wt):
        return False
    for a, b in zip(gt, wt):
        if a == b:
            continue
        try:
            fa, fb = float(a), float(b)
        except ValueError:
            return False
        if not (math.isfinite(fa) and math.isfinite(fb) and math.isclose(fa, fb, rel_tol=1e-6, abs_tol=1e-9)):
            return False
    return True


def _maybe_json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def split_assert_tests(src: str) -> tuple[str, list[str]]:
    """(prelude, tests): each top-level ``assert`` is a test; other statements form the prelude."""
    tree = ast.parse(src)
    prelude, tests = [], []
    for node in tree.body:
        seg = ast.get_source_segment(src, node) or ast.unparse(node)
        (tests if isinstance(node, ast.Assert) else prelude).append(seg)
    return "\n".join(prelude), tests


class CodeEnv(FileEnvironment):
    name = "code"
    default_task_type = "verifiable_code"

    def __init__(self, path: str | Path | None = None, heldout_pct: float = 10.0, all_or_nothing: bool = False,
                 wall_s: float = 5.0, cpu_s: int = 5, mem_mb: int = 512, isolation: str = "namespaces",
                 audit_hook: bool = True, max_completion_chars: int = MAX_COMPLETION_CHARS,
                 require_seccomp: bool = True) -> None:
        if isolation not in ("auto", "namespaces", "fallback", "require_namespaces"):
            raise ValueError("isolation must be namespaces, auto or fallback")
        if isolation == "require_namespaces":  # its former name, when "auto" was the default
            isolation = "namespaces"
        # fail closed, here and now: a worker would otherwise score every program 0 and a validator retry forever,
        # each for a reason in no log line but the sandbox's
        if isolation != "fallback" or require_seccomp:
            status = sandbox_status()
            if isolation == "namespaces" and status["isolation"] != "namespaces":
                raise RuntimeError(no_namespaces_message(status))
            if require_seccomp and not status["seccomp"]:
                raise RuntimeError(NO_SECCOMP_MESSAGE)
        self.isolation = isolation
        self.all_or_nothing = all_or_nothing
        self.max_completion_chars = int(max_completion_chars)
        self.limits = SandboxLimits(wall_s=float(wall_s), cpu_s=int(cpu_s), mem_bytes=int(mem_mb) * 1024**2,
                                    audit_hook=audit_hook, require_seccomp=bool(require_seccomp))
        super().__init__(path or DEFAULT_CODE_PATH, heldout_pct)

    # -- data ------------------------------------------------------------------------------
    def check_record(self, r: Record) -> None:
        try:
            n = sum(len(j["cases"]) for j in self.jobs(r.verification_info))
        except (ValueError, KeyError, TypeError, SyntaxError) as e:
            raise DataFileError(f"{self.path}:{r.line}: bad verification_info: {e}") from None
        if n == 0:
            raise DataFileError(f"{self.path}:{r.line}: verification_info has no tests "
                                "(expected test_cases and/or tests)")

    def jobs(self, vi: dict[str, Any]) -> list[dict[str, Any]]:
        """Sandbox jobs for a task: ``{"mode", "cases", "expected", "prelude"}`` each."""
        lang = vi.get("language", "python")
        if str(lang).lower() not in ("python", "python3", "py"):
            raise ValueError(f"unsupported language {lang!r} (only python)")
        out: list[dict[str, Any]] = []
        tc = vi.get("test_cases")
        if tc is not None:
            tc = _maybe_json(tc)
            if not isinstance(tc, list):
                raise ValueError("test_cases must be a list")
            fn = vi.get("fn_name")
            cases, expected = [], []
            for c in tc:
                if not isinstance(c, dict) or "input" not in c or "output" not in c:
                    raise ValueError("each test case needs input and output")
                if fn:
                    args = _maybe_json(c["input"])
                    if not isinstance(args, list):
                        args = [args]
                    cases.append({"fn_name": str(fn), "args": args})
                    expected.append(_maybe_json(c["output"]))
                else:
                    if not isinstance(c["input"], str) or not isinstance(c["output"], str):
                        raise ValueError("stdin/stdout test input and output must be strings")
                    cases.append({"input": c["input"]})
                    expected.append(c["output"])
            if cases:
                out.append({"mode": "call" if fn else "stdio", "cases": cases, "expected": expected, "prelude": ""})
        tests = vi.get("tests")
        if tests is not None:
            if isinstance(tests, str):
                prelude, snippets = split_assert_tests(tests)
            elif isinstance(tests, list) and all(isinstance(t, str) for t in tests):
                prelude, snippets = "", list(tests)
                for t in snippets:
                    compile(t, "test", "exec")
            else:
                raise ValueError("tests must be a string or a list of strings")
            if snippets:
                out.append({"mode": "function", "cases": [{"test": t} for t in snippets],
                            "expected": [None] * len(snippets), "prelude": prelude})
        total = sum(len(j["cases"]) for j in out)
        if total > self.limits.max_cases:
            raise ValueError(f"{total} tests, over the limit of {self.limits.max_cases}")
        return out

    # -- verification ----------------------------------------------------------------------
    @staticmethod
    def case_passed(mode: str, res: CaseResult, expected: Any) -> bool:
        if res.status != "ok" or not res.completed:
            return False
        if mode == "stdio":
            return not res.stdout_truncated and outputs_match(res.stdout, expected)
        if mode == "call":
            try:
                return res.ret is not None and json.loads(res.ret) == expected
            except ValueError:
                return False
        return True

    def run_tests(self, task: Task, completion: str) -> tuple[int, int]:
        """(passed, total) for ``completion`` on ``task``."""
        program = extract_program(completion[: self.max_completion_chars])
        jobs = self.jobs(task.verification_info)
        passed = total = 0
        for job in jobs:
            total += len(job["cases"])
            run = run_program(program, job["cases"], job["mode"], self.limits, self.isolation, job["prelude"])
            if run.error is not None:
                if run.internal and self.strict:
                    raise VerifierUnavailable(f"code sandbox: {run.error}")
                continue
            passed += sum(self.case_passed(job["mode"], r, e) for r, e in zip(run.results, job["expected"]))
        return passed, total

    def verify(self, task: Task, completion: str) -> float:
        try:
            if not isinstance(completion, str) or len(completion) > self.max_completion_chars:
                return 0.0
            passed, total = self.run_tests(task, completion)
        except VerifierUnavailable:
            raise  # only when strict (the validator): its own failure, not the completion's
        except Exception:  # noqa: BLE001 - a verifier never crashes its caller
            return 0.0
        if total == 0:
            return 0.0
        if self.all_or_nothing:
            return 1.0 if passed == total else 0.0
        return passed / total


@register_env("code")
def _code(path: str | None = None, heldout_pct: float = 10.0, all_or_nothing: bool = False, wall_s: float = 5.0,
          cpu_s: int = 5, mem_mb: int = 512, isolation: str = "namespaces", audit_hook: bool = True,
          max_completion_chars: int = MAX_COMPLETION_CHARS, require_seccomp: bool = True) -> CodeEnv:
    return CodeEnv(path=path, heldout_pct=heldout_pct, all_or_nothing=all_or_nothing, wall_s=wall_s,
                   cpu_s=cpu_s, mem_mb=mem_mb, isolation=isolation, audit_hook=audit_hook,
                   max_completion_chars=max_completion_chars, require_seccomp=require_seccomp)
