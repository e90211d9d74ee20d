"""Synthetic arithmetic: ``a+b`` with n-digit operands and the two-step ``a*b+c``.

Prompts are the bare expression followed by ``=`` (e.g. ``12*7+33=``) and the expected completion is the
integer result then EOS: what a small model trained from scratch learns. A pretrained chat model answers in
sentences, so ``prompt`` (a format with ``{expr}``, e.g. ``"What is {expr}? Answer with just the number."``)
and ``answer`` (a rule of ``swarmrl.envs.answers``: ``exact``, ``last_number`` or ``boxed``) adapt the task to
it. Deterministic by seed; the train/held-out split is by expression.
"""

from __future__ import annotations

import random

from swarmrl.envs.answers import ANSWER_RULES, AnswerRule, extract_integer
from swarmrl.envs.base import Environment, Split, Task, check_prompt_format, heldout_bucket
from swarmrl.envs.registry import register_env

DEFAULT_PROMPT = "{expr}="


class ArithmeticEnv(Environment):
    def __init__(self, kind: str = "mul_add", digits: int = 3, max_factor: int = 19, max_addend: int = 99,
                 heldout_pct: float = 10.0, prompt: str = DEFAULT_PROMPT, answer: AnswerRule = "exact") -> None:
        if kind not in ("add", "mul_add"):
            raise ValueError(f"kind must be 'add' or 'mul_add', not {kind!r}")
        if not 1 <= digits <= 9:
            raise ValueError("digits must be in [1, 9]")
        if not 0 < heldout_pct < 100:
            raise ValueError("heldout_pct must be in (0, 100)")
        if answer not in ANSWER_RULES:
            raise ValueError(f"answer must be one of {', '.join(ANSWER_RULES)}, not {answer!r}")
        check_prompt_format(prompt, "expr")
        self.prompt, self.answer = prompt, answer
        self.kind, self.digits, self.max_factor, self.max_addend = kind, digits, max_factor, max_addend
        self.heldout_pct = heldout_pct
        self.name = "add" if kind == "add" else "mul_add"

    def _draw(self, rng: random.Random) -> tuple[str, int]:
        if self.kind == "add":
            hi = 10**self.digits - 1
            a, b = rng.randint(0, hi), rng.randint(0, hi)
            return f"{a}+{b}", a + b
        a, b, c = rng.randint(0, self.max_factor), rng.randint(0, self.max_factor), rng.randint(0, self.max_addend)
        return f"{a}*{b}+{c}", a * b + c

    def space_size(self) -> int:
        if self.kind == "add":
            return (10**self.digits) ** 2
        return (self.max_factor + 1) ** 2 * (self.max_addend + 1)

    def _task(self, expr: str, ans: int) -> Task:
        demo = f"\\boxed{{{ans}}}" if self.answer == "boxed" else str(ans)
        return Task(task_id=f"{self.name}:{expr}", env=self.name, prompt=self.prompt.format(expr=expr),
                    verification_info={"answer": ans}, task_type="arithmetic", demonstration=demo)

    def _enumerate(self) -> list[tuple[str, int]]:
        if self.kind == "add":
            hi = 10**self.digits
            return [(f"{a}+{b}", a + b) for a in range(hi) for b in range(hi)]
        return [(f"{a}*{b}+{c}", a * b + c) for a in range(self.max_factor + 1) for b in range(self.max_factor + 1)
                for c in range(self.max_addend + 1)]

    def heldout_set(self, n: int, seed: int = 1234) -> list[Task]:
        """Distinct held-out tasks; a small space returns all of its held-out tasks when it has fewer than n."""
        if self.space_size() <= 200_000:
            pool = [(e, a) for e, a in self._enumerate() if heldout_bucket(e, self.heldout_pct)]
            random.Random(f"{self.name}:heldout:{seed}").shuffle(pool)
            return [self._task(e, a) for e, a in pool[:n]]
        return self.sample(seed, n, split="heldout")

    def sample(self, seed: int, n: int, split: Split = "train") -> list[Task]:
        rng = random.Random(f"{self.name}:{seed}")
        want_heldout = split == "heldout"
        out: list[Task] = []
        seen: set[str] = set()
        # held-out is ~heldout_pct of the space; heldout sets are de-duplicated
        limit = max(1000, 200 * n)
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > limit:
                raise ValueError(f"could not draw {n} distinct {split} tasks from {self.name}")
            expr, ans = self._draw(rng)
            if heldout_bucket(expr, self.heldout_pct) != want_heldout:
                continue
            if want_heldout:
                if expr in seen:
                    continue
                seen.add(expr)
            out.append(self._task(expr, ans))
        return out

    def verify(self, task: Task, completion: str) -> float:
        got = extract_integer(completion, self.answer)
        if got is None:
            return 0.0
        try:
            return 1.0 if got == int(task.verification_info["answer"]) else 0.0
        except (KeyError, ValueError, TypeError):
            return 0.0


@register_env("add")
def _add(digits: int = 3, heldout_pct: float = 10.0, prompt: str = DEFAULT_PROMPT,
         answer: AnswerRule = "exact") -> ArithmeticEnv:
    return ArithmeticEnv("add", digits=digits, heldout_pct=heldout_pct, prompt=prompt, answer=answer)


@register_env("mul_add")
def _mul_add(max_factor: int = 19, max_addend: int = 99, heldout_pct: float = 10.0, prompt: str = DEFAULT_PROMPT,
             answer: AnswerRule = "exact") -> ArithmeticEnv:
    return ArithmeticEnv("mul_add", max_factor=max_factor, max_addend=max_addend, heldout_pct=heldout_pct,
                         prompt=prompt, answer=answer)
