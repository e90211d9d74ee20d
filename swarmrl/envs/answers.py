"""Where a completion states its answer: the rules verifiers use to find it.

- ``exact``: the whole completion is the answer (an integer, maybe padded with spaces): what a model
  trained on bare ``12+34=46`` completions produces;
- ``last_number``: the last integer in the completion (``12 + 34 = 46.`` -> 46): what a chat model answering
  in a sentence needs;
- ``boxed``: the contents of the last balanced ``\\boxed{...}`` (or ``\\fbox{...}``), the convention of math
  reasoning models (INTELLECT-2's math data).

Tasks whose answers are text, not integers (reasoning-gym's), use ``extract_text`` and its rules:
``answer_tag`` (the last ``<answer>...</answer>``, reasoning-gym's own convention), ``last_line``, ``last_number``
(the last number, with a sign, decimals or a ``/`` denominator: for numeric datasets asked of a small chat model,
which answers in a sentence), ``exact`` and ``boxed``.

Only the tail of a completion (``MAX_COMPLETION_CHARS``) is searched, so a hostile completion costs bounded time.
"""

from __future__ import annotations

import re
from typing import Literal

AnswerRule = Literal["exact", "last_number", "boxed"]
ANSWER_RULES: tuple[str, ...] = ("exact", "last_number", "boxed")

MAX_COMPLETION_CHARS = 16_384  # only the tail of a completion is searched for the answer
MAX_BRACE_DEPTH = 24

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(text: str, max_chars: int = MAX_COMPLETION_CHARS) -> str | None:
    """Contents of the last balanced ``\\boxed{...}`` or ``\\fbox{...}`` in ``text`` (None if none)."""
    if not isinstance(text, str):
        return None
    tail = text[-max_chars:]
    starts = [m.end() for m in _BOX.finditer(tail)]
    for start in reversed(starts):
        depth, i = 1, start
        while i < len(tail):
            c = tail[i]
            if c == "\\" and i + 1 < len(tail) and tail[i + 1] in "{}":
                i += 2
                continue
            if c == "{":
                depth += 1
                if depth > MAX_BRACE_DEPTH:
                    break
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return tail[start:i]
            i += 1
    return None


_EXACT_INT = re.compile(r"^\s*(-?\d+)\s*$")
_INT = re.compile(r"-?\d+")
MAX_DIGITS = 64  # a longer run of digits is not an answer to any task here (and int() of it is costly)


def _to_int(text: str) -> int | None:
    text = text.strip()
    if not text or len(text.lstrip("-")) > MAX_DIGITS or not _EXACT_INT.match(text):
        return None
    return int(text)


def extract_integer(text: str, rule: AnswerRule = "exact", max_chars: int = MAX_COMPLETION_CHARS) -> int | None:
    """The integer answer ``text`` states under ``rule`` (None if it states none)."""
    if not isinstance(text, str):
        return None
    if rule == "exact":
        return _to_int(text) if len(text) <= max_chars else None
    if rule == "boxed":
        inner = extract_boxed(text, max_chars)
        return None if inner is None else _to_int(inner.replace(",", ""))
    if rule == "last_number":
        found = _INT.findall(text[-max_chars:].replace(",", ""))
        return _to_int(found[-1]) if found else None
    raise ValueError(f"unknown answer rule {rule!r}; choose from {', '.join(ANSWER_RULES)}")


TextAnswerRule = Literal["answer_tag", "last_line", "last_number", "exact", "boxed"]
TEXT_ANSWER_RULES: tuple[str, ...] = ("answer_tag", "last_line", "last_number", "exact", "boxed")
# a number as a small chat model writes one: a sign, digits (thousands commas dropped first), a decimal part or a
# fraction's denominator
_NUMBER = re.compile(r"-?\d+(?:\.\d+|/\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")

_OPEN, _CLOSE = "<answer>", "</answer>"


def extract_tagged(text: str, max_chars: int = MAX_COMPLETION_CHARS) -> str | None:
    """Contents of the last ``<answer>`` that is closed, up to its first ``</answer>`` (stripped; None if none).

    Searched with ``rfind``/``find`` from the end, each stretch of the tail at most once (linear, where a regex over
    many unclosed tags is quadratic); nested tags give the innermost answer."""
    if not isinstance(text, str):
        return None
    tail = text[-max_chars:]
    end = len(tail)
    while True:
        o = tail.rfind(_OPEN, 0, end)
        if o < 0:
            return None
        c = tail.find(_CLOSE, o + len(_OPEN), end)
        if c >= 0:
            return tail[o + len(_OPEN): c].strip()
        end = o  # no close after this opening, so none after any earlier one either: search only before it


def extract_text(text: str, rule: TextAnswerRule = "answer_tag", max_chars: int = MAX_COMPLETION_CHARS) -> str | None:
    """The answer ``text`` states under ``rule``, as stripped text (None if it states none)."""
    if not isinstance(text, str):
        return None
    if rule == "answer_tag":
        return extract_tagged(text, max_chars)
    if rule == "boxed":
        inner = extract_boxed(text, max_chars)
        return None if inner is None else inner.strip()
    if rule == "last_line":
        lines = [line for line in text[-max_chars:].splitlines() if line.strip()]
        return lines[-1].strip() if lines else None
    if rule == "last_number":
        found = _NUMBER.findall(_THOUSANDS.sub("", text[-max_chars:]))
        return found[-1] if found and len(found[-1]) <= MAX_DIGITS else None
    if rule == "exact":
        return text.strip() if len(text) <= max_chars else None
    raise ValueError(f"unknown answer rule {rule!r}; choose from {', '.join(TEXT_ANSWER_RULES)}")


__all__ = ["ANSWER_RULES", "TEXT_ANSWER_RULES", "AnswerRule", "TextAnswerRule", "extract_boxed", "extract_integer",
           "extract_tagged", "extract_text"]
