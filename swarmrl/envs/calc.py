"""``calc``: multi-step arithmetic with a calculator tool (the built-in multi-turn task).

The model is asked for the value of an expression such as ``(37*41-12)*3+5``. It may write
``<calc>expression</calc>``: the turn ends there and the environment answers ``<result>value</result>`` (or
``<result>error</result>``), evaluated by a bounded parser (integers, ``+ - * /`` and parentheses; no ``eval``).
The final answer goes in ``<answer>...</answer>``; the reward is 1 when the last answer tag holds the value.
Deterministic by seed; the train/held-out split is by expression. A task's demonstration (for the SFT warm start)
is a whole trajectory that uses the tool once: ``<calc>expr</calc><result>value</result><answer>value</answer>``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from fractions import Fraction

from swarmrl.envs.base import Split, Task, heldout_bucket
from swarmrl.envs.multiturn import MultiTurnEnvironment
from swarmrl.envs.registry import register_env

PROMPT = ("Compute {expr}. To use a calculator write <calc>expression</calc> and wait for <result>value</result>. "
          "Give the final answer as <answer>number</answer>.\n")
MAX_EXPR_CHARS = 200
MAX_DEPTH = 16
MAX_DIGITS = 40  # of any number and of any result
MAX_COMPLETION_CHARS = 16_384

_TOKEN = re.compile(r"\s*(\d+|[-+*/()])")
_ANSWER = re.compile(r"<answer>\s*(-?\d{1,40})\s*</answer>")


class CalcError(ValueError):
    pass


def _tokens(expr: str) -> list[str]:
    out, i = [], 0
    expr = expr.rstrip()
    while i < len(expr):
        m = _TOKEN.match(expr, i)
        if m is None:
            raise CalcError(f"unexpected {expr[i:i + 8]!r}")
        out.append(m.group(1))
        i = m.end()
    return out


def _bounded(x: Fraction) -> Fraction:
    if len(str(abs(x.numerator))) > MAX_DIGITS or len(str(x.denominator)) > MAX_DIGITS:
        raise CalcError("number too large")
    return x


class _Parser:
    """expr := term (('+'|'-') term)*; term := unary (('*'|'/') unary)*; unary := '-' unary | atom;
    atom := integer | '(' expr ')'. Exact (fractions), every value bounded, nesting bounded."""

    def __init__(self, toks: list[str]) -> None:
        self.toks, self.i, self.depth = toks, 0, 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        t = self.peek()
        if t is None:
            raise CalcError("unexpected end")
        self.i += 1
        return t

    def expr(self) -> Fraction:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CalcError("nested too deeply")
        v = self.term()
        while self.peek() in ("+", "-"):
            v = _bounded(v + self.term() if self.take() == "+" else v - self.term())
        self.depth -= 1
        return v

    def term(self) -> Fraction:
        v = self.unary()
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.unary()
            if op == "/" and rhs == 0:
                raise CalcError("division by zero")
            v = _bounded(v * rhs if op == "*" else v / rhs)
        return v

    def unary(self) -> Fraction:
        if self.peek() == "-":
            self.take()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise CalcError("nested too deeply")
            v = -self.unary()
            self.depth -= 1
            return v
        return self.atom()

    def atom(self) -> Fraction:
        t = self.take()
        if t == "(":
            v = self.expr()
            if self.take() != ")":
                raise CalcError("missing )")
            return v
        if t.isdigit():
            if len(t) > MAX_DIGITS:
                raise CalcError("number too large")
            return Fraction(int(t))
        raise CalcError(f"unexpected {t!r}")


def evaluate(expr: str) -> Fraction:
    """The exact value of ``expr``; CalcError for anything malformed, too long, too deep or too large."""
    if len(expr) > MAX_EXPR_CHARS:
        raise CalcError("expression too long")
    p = _Parser(_tokens(expr))
    v = p.expr()
    if p.peek() is not None:
        raise CalcError(f"unexpected {p.peek()!r}")
    return v


def show(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


class CalcEnv(MultiTurnEnvironment):
    name = "calc"
    stop = ("</calc>",)

    def __init__(self, max_turns: int = 4, max_operand: int = 99, heldout_pct: float = 10.0,
                 instructions: bool = True) -> None:
        if not 1 <= max_turns <= 64:
            raise ValueError("max_turns must be in [1, 64]")
        if not 2 <= max_operand <= 10**6:
            raise ValueError("max_operand must be in [2, 1000000]")
        if not 0 < heldout_pct < 100:
            raise ValueError("heldout_pct must be in (0, 100)")
        self.max_turns, self.max_operand, self.heldout_pct = max_turns, max_operand, heldout_pct
        self.instructions = instructions  # False: the prompt is the expression alone ("(3*4-2)*5=", a tiny model's)

    def _draw(self, rng: random.Random) -> str:
        n = lambda: rng.randint(2, self.max_operand)  # noqa: E731
        a, b, c, d = n(), n(), n(), n()
        return rng.choice([f"({a}*{b}-{c})*{d}", f"{a}*{b}+{c}*{d}", f"({a}+{b})*({c}-{d})", f"{a}*{b}*{c}-{d}"])

    def _task(self, expr: str) -> Task:
        ans = int(evaluate(expr))
        prompt = PROMPT.format(expr=expr) if self.instructions else f"{expr}="
        return Task(task_id=f"calc:{expr}", env=self.name, prompt=prompt,
                    verification_info={"answer": ans}, task_type="tool",
                    demonstration=f"<calc>{expr}</calc><result>{ans}</result><answer>{ans}</answer>")

    def sample(self, seed: int, n: int, split: Split = "train") -> list[Task]:
        rng = random.Random(f"{self.name}:{seed}")
        want = split == "heldout"
        out: list[Task] = []
        for _ in range(max(1000, 200 * n)):
            if len(out) == n:
                return out
            expr = self._draw(rng)
            if heldout_bucket(expr, self.heldout_pct) == want:
                out.append(self._task(expr))
        if len(out) == n:
            return out
        raise ValueError(f"could not draw {n} {split} tasks from calc")

    def respond(self, task: Task, turns: Sequence[str]) -> str | None:
        last = turns[-1] if turns else ""
        end = last.find("</calc>")
        start = last.rfind("<calc>", 0, end) if end >= 0 else -1
        if start < 0:
            return None  # no tool call: the episode is over
        try:
            return f"<result>{show(evaluate(last[start + len('<calc>'): end]))}</result>"
        except CalcError:
            return "<result>error</result>"

    def verify(self, task: Task, completion: str) -> float:
        found = _ANSWER.findall(completion[-MAX_COMPLETION_CHARS:]) if isinstance(completion, str) else []
        try:
            return 1.0 if found and int(found[-1]) == int(task.verification_info["answer"]) else 0.0
        except (KeyError, ValueError, TypeError):
            return 0.0


@register_env("calc")
def _calc(max_turns: int = 4, max_operand: int = 99, heldout_pct: float = 10.0, instructions: bool = True) -> CalcEnv:
    return CalcEnv(max_turns=max_turns, max_operand=max_operand, heldout_pct=heldout_pct, instructions=instructions)
