"""Math word problems with symbolically checked ``\\boxed{}`` answers (INTELLECT-2 style data).

Task file records (JSONL or parquet): ``prompt``, ``verification_info = {"ground_truth": "<latex>"}``
(a dict or a JSON string), ``task_type`` (default ``"verifiable_math"``), optional ``task_id`` /
``problem_id`` and ``solution`` (a correct completion ending in ``\\boxed{...}``, used as the SFT
demonstration).

Verification: the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces in the (length
capped) completion is compared with the ground truth: first exact after light normalisation, then
exact rational comparison of plain numbers, then math-verify (sympy fallback) in a separate worker
process with a wall-time limit and an address-space cap, so a hostile answer (``10^{10^{10}}``,
deep nesting, megabytes of LaTeX) costs at most one timeout and gets reward 0. Never raises.
"""

from __future__ import annotations

import atexit
import re
from fractions import Fraction
from pathlib import Path

from swarmrl.envs.answers import extract_boxed
from swarmrl.envs.base import Task
from swarmrl.envs.datafile import DataFileError, FileEnvironment, Record
from swarmrl.envs.lineworker import LineWorker
from swarmrl.envs.registry import register_env

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_MATH_PATH = DATA_DIR / "math_sample.jsonl"

MAX_COMPLETION_CHARS = 16_384  # only the tail of a completion is searched for the answer
MAX_ANSWER_CHARS = 512  # longer boxed answers are rejected outright


_NORM_DROP = re.compile(r"\\(?:left|right|displaystyle|[,;!: ])|\s+|\$")


def normalize(ans: str) -> str:
    s = _NORM_DROP.sub("", ans)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"^\\text\{(.*)\}$", r"\1", s)
    s = s.rstrip(".")
    return s


_NUM = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")
_FRAC = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_SLASH = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")


def as_rational(s: str) -> Fraction | None:
    """Plain integers, decimals, ``a/b`` and ``\\frac{a}{b}`` (normalised text) as exact rationals."""
    if len(s) > 64:
        return None
    s = s.replace("{,}", "")
    try:
        if _NUM.match(s):
            return Fraction(s)
        m = _SLASH.match(s)
        if m and int(m.group(2)) != 0:
            return Fraction(int(m.group(1)), int(m.group(2)))
        m = _FRAC.match(s)
        if m and int(m.group(3)) != 0:
            v = Fraction(int(m.group(2)), int(m.group(3)))
            return -v if m.group(1) == "-" else v
    except (ValueError, ZeroDivisionError):
        return None
    return None


class _Checker:
    """The math-verify worker (``_mathcheck_worker.py``), shared by the process's math environments."""

    def __init__(self) -> None:
        self.worker = LineWorker("_mathcheck_worker.py", "math answer checker", start_timeout_s=60.0)

    @property
    def restarts(self) -> int:
        return self.worker.restarts

    def close(self) -> None:
        self.worker.close()

    def equal(self, gold: str, pred: str, timeout: float) -> bool:
        with self.worker.lock:
            try:
                self.worker.ensure()
            except RuntimeError:
                return False
            out = self.worker.call({"gold": gold, "pred": pred}, timeout)
        return bool(out and out.get("ok") is True)


_CHECKER = _Checker()
atexit.register(_CHECKER.close)


def answers_equal(gold: str, pred: str, timeout: float = 5.0) -> bool:
    """Whether two answer strings (boxed contents) denote the same value."""
    if not pred or len(pred) > MAX_ANSWER_CHARS:
        return False
    g, p = normalize(gold), normalize(pred)
    if not p:
        return False
    if g == p:
        return True
    gq, pq = as_rational(g), as_rational(p)
    if gq is not None and pq is not None:
        return gq == pq
    return _CHECKER.equal(gold, pred, timeout)


class MathEnv(FileEnvironment):
    name = "math"
    default_task_type = "verifiable_math"

    def __init__(self, path: str | Path | None = None, heldout_pct: float = 10.0, timeout_s: float = 5.0,
                 max_completion_chars: int = MAX_COMPLETION_CHARS) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.timeout_s = float(timeout_s)
        self.max_completion_chars = int(max_completion_chars)
        super().__init__(path or DEFAULT_MATH_PATH, heldout_pct)

    def check_record(self, r: Record) -> None:
        gt = r.verification_info.get("ground_truth")
        if not isinstance(gt, (str, int, float)) or isinstance(gt, bool) or str(gt).strip() == "":
            raise DataFileError(f"{self.path}:{r.line}: verification_info.ground_truth must be a non-empty "
                                "string or number")

    def verify(self, task: Task, completion: str) -> float:
        try:
            pred = extract_boxed(completion, self.max_completion_chars)
            if pred is None:
                return 0.0
            gold = str(task.verification_info["ground_truth"])
            return 1.0 if answers_equal(gold, pred, self.timeout_s) else 0.0
        except Exception:  # noqa: BLE001 - a verifier never crashes its caller
            return 0.0


@register_env("math")
def _math(path: str | None = None, heldout_pct: float = 10.0, timeout_s: float = 5.0,
          max_completion_chars: int = MAX_COMPLETION_CHARS) -> MathEnv:
    return MathEnv(path=path, heldout_pct=heldout_pct, timeout_s=timeout_s,
                   max_completion_chars=max_completion_chars)
