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
import json
import os
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction
from pathlib import Path

from swarmrl.envs.answers import extract_boxed
from swarmrl.envs.base import Task
from swarmrl.envs.datafile import DataFileError, FileEnvironment, Record
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
    """One long-lived worker process running math-verify; killed and restarted on a timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self.restarts = 0

    def _start(self, start_timeout: float) -> subprocess.Popen[str]:
        worker = Path(__file__).resolve().parent / "_mathcheck_worker.py"
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH")}
        env["OMP_NUM_THREADS"] = "1"
        proc = subprocess.Popen([sys.executable, "-I", "-u", str(worker)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                start_new_session=True)
        line = self._readline(proc, start_timeout)
        if line is None or "ready" not in line:
            self._kill(proc)
            raise RuntimeError("math answer checker failed to start")
        return proc

    @staticmethod
    def _readline(proc: subprocess.Popen[str], timeout: float) -> str | None:
        assert proc.stdout is not None
        r, _, _ = select.select([proc.stdout], [], [], timeout)
        if not r:
            return None
        line = proc.stdout.readline()
        return line or None

    @staticmethod
    def _kill(proc: subprocess.Popen[str]) -> None:
        try:
            os.killpg(proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._kill(self._proc)
                self._proc = None

    def equal(self, gold: str, pred: str, timeout: float) -> bool:
        with self._lock:
            try:
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = self._start(max(30.0, timeout))
                proc = self._proc
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"gold": gold, "pred": pred}) + "\n")
                proc.stdin.flush()
                line = self._readline(proc, timeout)
                if line is None:
                    raise TimeoutError
                return bool(json.loads(line).get("ok", False))
            except (TimeoutError, OSError, ValueError, RuntimeError):
                if self._proc is not None:
                    self._kill(self._proc)
                    self._proc = None
                    self.restarts += 1
                return False


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
