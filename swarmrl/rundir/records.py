"""The trainer's records in ``metrics/trainer.jsonl``, typed: one ``StepRecord`` per trained step (with its loss
statistics, ``LossStats``), ``EvalRecord``s for held-out evaluations, and events. The trainer writes them; the run
report, the plots, the dashboard, the adapter (which posts them to the orchestrator) and the CLI read them through
``read_trainer_log`` / ``parse_trainer_row`` instead of string keys.

A file from an older run may lack fields or carry others: reading ignores unknown keys, and a row that does not
fit (a torn line, a wrong type) is skipped, never fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


@dataclass
class LossStats:
    """Statistics of the policy loss over a batch, per completion token (what every loss reports)."""

    clip_frac: float = 0.0  # share of tokens where a clip or cap is active (changes the gradient)
    clip_low_frac: float = 0.0
    clip_high_frac: float = 0.0
    delta_frac: float = 0.0  # share of tokens capped by the upper bound delta
    ratio_mean: float = 1.0
    ratio_max: float = 1.0
    entropy: float = 0.0
    kl: float = 0.0
    mismatch_kl: float = 0.0  # KL(inference || trainer) over the sampled tokens (k3): 0 when both agree
    is_weight_mean: float = 1.0  # the off-policy correction's importance weight (1 without one)
    is_dropped_frac: float = 0.0  # share of tokens the correction gave weight 0 (masked IS)
    tokens: int = 0

    _MEANS = ("clip_frac", "clip_low_frac", "clip_high_frac", "delta_frac", "ratio_mean", "entropy", "kl",
              "mismatch_kl", "is_weight_mean", "is_dropped_frac")

    @classmethod
    def combine(cls, parts: list[LossStats]) -> LossStats:
        """The statistics of a batch from those of its micro-batches (token-weighted means, max of maxima)."""
        n = sum(p.tokens for p in parts)
        if not n:
            return cls()
        out = cls(tokens=n, ratio_max=max(p.ratio_max for p in parts if p.tokens))
        for k in cls._MEANS:
            setattr(out, k, sum(getattr(p, k) * p.tokens for p in parts) / n)
        return out

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")

    time: float | None = None  # written by ``MetricsWriter``


class StepRecord(_Record):
    """One trained step: trainer step ``step`` made policy version ``version``. The trainer fills every field; a
    reader of an older or partial file gets None for what a row lacks."""

    step: int
    version: int
    reward: float
    task_reward: float | None = None
    wall_s: float | None = None  # since the trainer (re)started
    wait_s: float | None = None  # waiting for usable groups
    train_s: float | None = None
    lag_mean: float | None = None  # steps between a trained sample's policy version and the step
    lag_max: int | None = None
    completion_len: float | None = None
    files: list[str] = []
    # what the step's selection kept and dropped (``contract.GroupRule.select``)
    stale_rows: int = 0
    wrong_step_rows: int = 0
    incomplete_groups: int = 0
    tied_groups: int = 0
    usable_groups: int = 0
    carried_groups: int = 0
    stale_carried: int = 0
    surplus_groups: int = 0
    workers: list[str] = []
    # the update: the loss and its statistics (``LossStats``, tokens excepted), the optimizer step
    loss: float | None = None
    clip_frac: float | None = None
    clip_low_frac: float | None = None
    clip_high_frac: float | None = None
    delta_frac: float | None = None
    ratio_mean: float | None = None
    ratio_max: float | None = None
    entropy: float | None = None
    kl: float | None = None
    mismatch_kl: float | None = None
    is_weight_mean: float | None = None
    is_dropped_frac: float | None = None
    grad_norm: float | None = None
    train_tokens: int | None = None
    lr: float | None = None
    nonfinite_skipped: int = 0
    nonfinite_total: int = 0
    peak_rss_mb: float | None = None  # the trainer process's largest resident set so far (the kernel's high-water mark)
    # a held-out evaluation of ``version``, when one ran after this step
    heldout_acc: float | None = None
    eval_s: float | None = None


class EvalRecord(_Record):
    """A held-out evaluation of ``version``: ``event`` is ``eval`` (the base model, before step 0), ``final`` (at
    the end) or ``step`` (the one a ``StepRecord`` carries)."""

    event: str
    version: int
    heldout_acc: float
    wall_s: float | None = None
    step: int | None = None


def parse_trainer_row(row: Any) -> StepRecord | EvalRecord | dict | None:
    """A row of ``trainer.jsonl`` as a step record, an evaluation (``eval``/``final`` events), another event (the
    dict as it is: ``rejected_file``, ``waiting``, ``publish_failed``), or None when it fits none."""
    if not isinstance(row, dict):
        return None
    try:
        if "reward" in row and "event" not in row:
            return StepRecord.model_validate(row)
        if row.get("event") in ("eval", "final"):
            return EvalRecord.model_validate(row)
    except ValidationError:
        return None
    return row if isinstance(row.get("event"), str) else None


@dataclass
class TrainerLog:
    steps: list[StepRecord] = field(default_factory=list)  # one per step, in step order (a redone step: its last)
    evals: list[EvalRecord] = field(default_factory=list)  # in file order, step rows' evaluations included
    events: list[dict] = field(default_factory=list)


def read_trainer_log(path: str | Path) -> TrainerLog:
    log = TrainerLog()
    by_step: dict[int, StepRecord] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return log
    for line in text.splitlines():
        try:
            rec = parse_trainer_row(json.loads(line)) if line.strip() else None
        except json.JSONDecodeError:
            continue  # a torn last line after a crash
        if isinstance(rec, StepRecord):
            by_step[rec.step] = rec
            if rec.heldout_acc is not None:
                log.evals.append(EvalRecord(event="step", version=rec.version, heldout_acc=rec.heldout_acc,
                                            wall_s=rec.wall_s, step=rec.step, time=rec.time))
        elif isinstance(rec, EvalRecord):
            log.evals.append(rec)
        elif isinstance(rec, dict):
            log.events.append(rec)
    log.steps = [by_step[s] for s in sorted(by_step)]
    return log
