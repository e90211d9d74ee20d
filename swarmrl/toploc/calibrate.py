"""Calibrating TOPLOC thresholds on a model: honest recomputation vs tampered work.

An honest worker samples a batch with ``generate(capture_hidden=True)`` (KV-cache decoding) and
commits to the captured states. Honest variants verify those proofs with one prefill under different
batch sizes / padding, thread counts, and proofs from a worker that sampled each prompt alone.
Tampered variants change one completion token after sampling (the first, the middle, the third- and
second-to-last and the last token of each completion of both honest samples), or have the worker use
another model, a perturbed copy, fp16 / bf16 weights, int8-style quantised weights or a changed prompt.
For each variant we collect per-chunk (exp_mismatches, mant_err_mean, mant_err_median), rollout-level
TOPLOC and sampling-check verdicts, and recommend thresholds (``swarmrl.toploc.recommend``): within
[honest max, honest max x margin + slack], the ones that let the fewest one-token edits pass, halfway
between the honest maxima and the nearest edits. The recommendation, the model's identity and the figures
are written to the model's calibration file (``swarmrl.toploc.thresholds_file``). An edit of the LAST token
changes no committed state: it is reported, left out of the choice, and left to the
sampling check.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from transformers import AutoModelForCausalLM

from swarmrl.config import StrictModel
from swarmrl.contract.params import ProofGeometry
from swarmrl.envs.config import TaskConfig
from swarmrl.inference.prompts import encode_prompt
from swarmrl.inference.sampler import SamplingParams, generate
from swarmrl.models.io import load_model, load_tokenizer
from swarmrl.toploc.proof import build_proofs
from swarmrl.toploc.recommend import Recommendation, recommend, rollout_passes
from swarmrl.toploc.rollout import verify_rollouts
from swarmrl.toploc.sampling_check import SamplingClaim, SamplingThresholds
from swarmrl.toploc.thresholds_file import (
    CALIBRATION_FILE,
    CALIBRATION_FORMAT,
    Calibration,
    model_identity,
    write_calibration,
)
from swarmrl.toploc.verify import Thresholds
from swarmrl.utils.metrics import MetricsWriter

__all__ = ["CalibrateConfig", "ScenarioResult", "CalibrationReport", "run_calibration", "perturb_weights",
           "quantize_int8", "reinit_model", "change_token", "EDITS"]

Edit = Literal["first", "middle", "third_to_last", "second_to_last", "last"]
EDITS: tuple[Edit, ...] = ("first", "middle", "third_to_last", "second_to_last", "last")


class CalibrateConfig(StrictModel):
    model: str = ""  # HF model directory (required)
    dtype: str = "float32"
    task: TaskConfig = Field(default_factory=TaskConfig)
    chat_template: bool = False  # prompts in the model's chat template (as a run with chat_template = true)
    n_prompts: int = Field(16, ge=1)
    # each completion's token limit (single-turn sampling, ``TokenLimits.max_new_tokens``); None: three proof chunks
    # (3 x proof.chunk: 96 at the default geometry), so every completion can commit several chunks
    max_new_tokens: int | None = Field(None, ge=2)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    proof: ProofGeometry = Field(default_factory=ProofGeometry)  # the run's contract.proof
    seed: int = 0
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 3, 16])
    threads: list[int] = Field(default_factory=lambda: [1, 2])
    perturb_scale: float = Field(0.01, gt=0)  # relative std of the noise added to every weight
    edits: list[Edit] = Field(default_factory=lambda: list(EDITS))  # one-token edits: which token of each completion
    edit_rounds: int = Field(1, ge=1)  # each round edits every completion again with other random tokens
    weight_tampering: bool = True  # also another model, perturbed / fp16 / bf16 / int8 weights, a changed prompt
    margin: float = Field(2.0, ge=1)  # the loosest thresholds considered: honest max * margin + slack
    thresholds: Thresholds = Field(default_factory=Thresholds)  # reported as "dflt" (published defaults)
    sampling: SamplingThresholds = Field(default_factory=SamplingThresholds)
    out: str = ""  # the calibration file ("": <model>/toploc_thresholds.json, where verifiers look)
    write: bool = True  # false: report only
    metrics: str | None = None  # JSONL file for per-scenario results

    @model_validator(mode="after")
    def _chunks(self) -> CalibrateConfig:
        if self.max_new_tokens is None:
            self.__dict__["max_new_tokens"] = 3 * self.proof.chunk
        return self


# ----------------------------------------------------------------------------------------------
# tampering helpers


@torch.no_grad()
def perturb_weights(model: torch.nn.Module, scale: float, seed: int = 0) -> torch.nn.Module:
    """A copy with every parameter + N(0, (scale * std(param))^2) noise."""
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    for p in m.parameters():
        std = float(p.float().std()) if p.numel() > 1 else 1.0
        p.add_((torch.randn(p.shape, generator=g) * scale * (std or 1.0)).to(p.dtype))
    return m


@torch.no_grad()
def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A copy with every 2-D weight quantised to int8 per output row (symmetric) and dequantised."""
    m = copy.deepcopy(model)
    for p in m.parameters():
        if p.dim() == 2:
            w = p.float()
            s = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
            p.copy_((torch.round(w / s).clamp(-127, 127) * s).to(p.dtype))
    return m


def reinit_model(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Another model of the same architecture (fresh init with another seed)."""

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(model.config, dtype=next(model.parameters()).dtype)
    m.eval()
    return m


def change_token(ids: list[int], pos: int, vocab: int, avoid: set[int], rng: random.Random) -> list[int]:
    out = list(ids)
    pos = min(pos, len(out) - 1)
    while True:
        t = rng.randrange(vocab)
        if t != out[pos] and t not in avoid:
            out[pos] = t
            return out


# ----------------------------------------------------------------------------------------------
# report


@dataclass
class ScenarioResult:
    name: str
    honest: bool
    edit: bool = False  # a one-token edit with a changed committed state (what the thresholds must catch)
    exp: list[int] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    median: list[float] = field(default_factory=list)
    rollout_toploc_fail: list[bool] = field(default_factory=list)
    rollout_sampling_fail: list[bool] = field(default_factory=list)
    logprob_diff: list[float] = field(default_factory=list)
    chunk_pass: list[bool] = field(default_factory=list)
    per_rollout: list[list[tuple[int, float, float]]] = field(default_factory=list)

    def summary(self) -> dict:
        def q(v: list[float], f: float) -> float:
            return float(np.quantile(np.array(v, dtype=np.float64), f)) if v else float("nan")

        n = len(self.rollout_toploc_fail)
        return {
            "scenario": self.name, "honest": self.honest, "chunks": len(self.exp), "rollouts": n,
            "exp_p50": q(self.exp, 0.5), "exp_min": q(self.exp, 0), "exp_max": q(self.exp, 1),
            "mean_p50": q(self.mean, 0.5), "mean_min": q(self.mean, 0), "mean_max": q(self.mean, 1),
            "median_p50": q(self.median, 0.5), "median_min": q(self.median, 0), "median_max": q(self.median, 1),
            "chunk_fail_rate": 1 - (sum(self.chunk_pass) / len(self.chunk_pass)) if self.chunk_pass else float("nan"),
            "toploc_fail_rate": sum(self.rollout_toploc_fail) / n if n else float("nan"),
            "sampling_fail_rate": sum(self.rollout_sampling_fail) / n if n else float("nan"),
            "any_fail_rate": sum(a or b for a, b in zip(self.rollout_toploc_fail, self.rollout_sampling_fail)) / n
            if n else float("nan"),
            "logprob_diff_max": max(self.logprob_diff) if self.logprob_diff else float("nan"),
        }


@dataclass
class CalibrationReport:
    scenarios: list[ScenarioResult]
    recommendation: Recommendation
    recommended_logprob_diff: float
    overlaps: list[str]  # tampered scenarios with some rollout passing the recommended thresholds
    detection_recommended: dict[str, float]  # share of rollouts failing TOPLOC with the recommended thresholds
    logprob_detection_recommended: dict[str, float] = field(default_factory=dict)  # claimed-logprob check
    any_detection_recommended: dict[str, float] = field(default_factory=dict)  # either of the two
    calibration: Calibration | None = None
    path: Path | None = None  # where the calibration file was written (None: not written)
    wall_s: float = 0.0

    @property
    def recommended(self) -> Thresholds:
        return self.recommendation.thresholds

    def rows(self) -> list[dict]:
        return [s.summary() for s in self.scenarios]


# ----------------------------------------------------------------------------------------------
# the run


def _sample(model, prompts, cfg: CalibrateConfig, tok, seed: int, batch: int | None = None):
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)
    g = torch.Generator().manual_seed(seed)
    if batch is None:
        return generate(model, prompts, params, tok.eos_token_id, tok.pad_token_id, capture_hidden=True, generator=g)
    outs = [generate(model, prompts[i: i + batch], params, tok.eos_token_id, tok.pad_token_id, capture_hidden=True,
                     generator=g) for i in range(0, len(prompts), batch)]
    o = outs[0]
    for x in outs[1:]:
        o.prompt_ids += x.prompt_ids
        o.completion_ids += x.completion_ids
        o.logprobs += x.logprobs
        o.finished += x.finished
        o.hidden += x.hidden
    return o


def run_calibration(cfg: CalibrateConfig, progress: Callable[[str], None] | None = None) -> CalibrationReport:
    say = progress or (lambda _m: None)
    if not cfg.model:
        raise ValueError("model is required (a HF model directory)")
    bench = _Bench.load(cfg, say)
    t_start = time.perf_counter()
    rows = _honest_scenarios(bench)
    _edit_scenarios(bench, rows)
    if cfg.weight_tampering:
        _weight_scenarios(bench)
    report = _report(cfg, bench.results, t_start)
    if cfg.write:
        report.path = write_calibration(cfg.out or Path(cfg.model) / CALIBRATION_FILE, report.calibration)
    if cfg.metrics:
        _write_metrics(cfg.metrics, report)
    return report


@dataclass
class _Bench:
    """What every scenario shares: the honest model, its tokenizer and prompts, the one random generator (the
    order of its draws is part of a reproducible calibration: shuffles, edited tokens, the changed prompt), the
    thread count to restore after a scenario that sets its own, and the results so far."""

    cfg: CalibrateConfig
    model: torch.nn.Module
    tok: Any
    vocab: int
    prompts: list[list[int]]
    rng: random.Random
    threads0: int
    say: Callable[[str], None]
    results: list[ScenarioResult] = field(default_factory=list)

    @classmethod
    def load(cls, cfg: CalibrateConfig, say: Callable[[str], None]) -> _Bench:
        model = load_model(cfg.model, dtype=cfg.dtype)
        tok = load_tokenizer(cfg.model)
        vocab = model.get_input_embeddings().num_embeddings
        tasks = cfg.task.build().sample(cfg.seed, cfg.n_prompts)
        prompts = [encode_prompt(tok, t.prompt, cfg.chat_template) for t in tasks]
        return cls(cfg, model, tok, vocab, prompts, random.Random(cfg.seed), torch.get_num_threads(), say)

    def claims(self, out) -> list[SamplingClaim]:  # noqa: ANN001
        cfg = self.cfg
        return [SamplingClaim(eos_id=self.tok.eos_token_id, temperature=cfg.temperature, top_p=cfg.top_p, logprobs=lp,
                              finished=f, max_new_tokens=cfg.max_new_tokens) for lp, f in zip(out.logprobs, out.finished)]

    def check(self, name: str, honest: bool, prompt_ids, completions, proofs, cls, batch_size: int = 4,  # noqa: ANN001
              threads: int | None = None, shuffle: bool = False, edit: bool = False) -> None:
        """Verify one scenario's rollouts with the honest model and add its figures to ``results``."""
        cfg = self.cfg
        self.say(name)
        items = list(zip(prompt_ids, completions, proofs, cls))
        order = list(range(len(items)))
        if shuffle:
            self.rng.shuffle(order)
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            res = verify_rollouts(self.model, [items[i] for i in order], cfg.proof,
                                  thresholds=cfg.thresholds, sampling_thresholds=cfg.sampling, batch_size=batch_size)
        finally:
            torch.set_num_threads(self.threads0)
        r = ScenarioResult(name, honest, edit)
        for rc in res:
            r.per_rollout.append([(c.exp_mismatches, c.mant_err_mean, c.mant_err_median) if c.exp_mismatches >= 0
                                  else (1 << 30, math.inf, math.inf) for c in rc.chunks] or [(1 << 30, math.inf, math.inf)])
            for c in rc.chunks:
                if c.exp_mismatches >= 0:
                    r.exp.append(c.exp_mismatches)
                    r.mean.append(c.mant_err_mean)
                    r.median.append(c.mant_err_median)
                    r.chunk_pass.append(c.passed)
            r.rollout_toploc_fail.append(not rc.proofs_passed)
            r.rollout_sampling_fail.append(rc.sampling is not None and not rc.sampling.passed)
            if rc.sampling is not None:
                r.logprob_diff.append(rc.sampling.max_logprob_diff)
        self.results.append(r)

    def tampered(self, name: str, worker: torch.nn.Module) -> None:
        """A worker that samples with ``worker`` instead of the honest model, proofs from its own states."""
        cfg = self.cfg
        self.say(f"tampered worker: {name}")
        o = _sample(worker, self.prompts, cfg, self.tok, cfg.seed + 2)
        self.check(f"tampered: {name}", False, o.prompt_ids, o.completion_ids,
                   [build_proofs(h.float(), cfg.proof) for h in o.hidden], self.claims(o))


def _honest_scenarios(b: _Bench) -> list[tuple]:
    """The honest worker, verified under other batch sizes / padding and thread counts, and a worker that
    sampled each prompt alone. Returns both honest samples' rollouts (prompt, completion, proofs, claim)."""
    cfg = b.cfg
    b.say("honest worker: batched sampling")
    out = _sample(b.model, b.prompts, cfg, b.tok, cfg.seed)
    proofs = [build_proofs(h, cfg.proof) for h in out.hidden]
    base = (out.prompt_ids, out.completion_ids, proofs, b.claims(out))
    for bs in cfg.batch_sizes:
        b.check(f"honest: prefill batch={bs}, shuffled", True, *base, batch_size=bs, shuffle=bs > 1)
    for th in cfg.threads:
        b.check(f"honest: prefill threads={th}", True, *base, batch_size=4, threads=th)
    b.say("honest worker: one prompt at a time")
    single = _sample(b.model, b.prompts, cfg, b.tok, cfg.seed + 1, batch=1)
    single_proofs = [build_proofs(h, cfg.proof) for h in single.hidden]
    b.check("honest: worker sampled alone", True, single.prompt_ids, single.completion_ids, single_proofs,
            b.claims(single))
    return [(p, c, pr, cl) for o, prs in ((out, proofs), (single, single_proofs))
            for p, c, pr, cl in zip(o.prompt_ids, o.completion_ids, prs, b.claims(o))]


def _edit_scenarios(b: _Bench, rows: list[tuple]) -> None:
    """One completion token replaced after sampling, proofs and claims kept: in both honest samples'
    completions, at each position of ``cfg.edits``."""
    cfg = b.cfg
    avoid = {b.tok.eos_token_id, b.tok.pad_token_id}
    for kind in cfg.edits:
        pick = [r for r in rows if len(r[1]) > _EDIT_MIN[kind]] * cfg.edit_rounds
        if not pick:
            continue
        comps = [change_token(c, _edit_position(kind, len(c)), b.vocab, avoid, b.rng) for _, c, _, _ in pick]
        name = ("tampered: one-token edit, last token (no later state: invisible to proofs)" if kind == "last"
                else f"tampered: one-token edit, {kind.replace('_', '-')} token")
        b.check(name, False, [r[0] for r in pick], comps, [r[2] for r in pick], [r[3] for r in pick],
                edit=kind != "last")


def _weight_scenarios(b: _Bench) -> None:
    """Workers with other weights (another model, perturbed, fp16 / bf16, int8-style) and one with a changed
    prompt token."""
    cfg, model = b.cfg, b.model
    b.tampered("another model", reinit_model(model, cfg.seed + 1000))
    for scale in (cfg.perturb_scale, cfg.perturb_scale / 10):
        b.tampered(f"perturbed weights ({scale:g})", perturb_weights(model, scale, cfg.seed))
    dtype = next(model.parameters()).dtype
    for name, dt in (("fp16 weights", torch.float16), ("bf16 weights", torch.bfloat16)):
        if dt != dtype:  # the model's own dtype would be an honest control, not tampering
            b.tampered(name, copy.deepcopy(model).to(dt))
    b.tampered("int8 weights", quantize_int8(model))
    b.say("tampered worker: changed prompt")
    avoid = {b.tok.eos_token_id, b.tok.pad_token_id}
    changed = [change_token(p, b.rng.randrange(len(p)), b.vocab, avoid, b.rng) for p in b.prompts]
    o = _sample(model, changed, cfg, b.tok, cfg.seed + 3)
    b.check("tampered: changed prompt token", False, b.prompts, o.completion_ids,
            [build_proofs(h, cfg.proof) for h in o.hidden], b.claims(o))


def _report(cfg: CalibrateConfig, results: list[ScenarioResult], t_start: float) -> CalibrationReport:
    """The recommendation from the honest and the edited scenarios, every scenario's detection rate under it,
    and the calibration file's content."""
    honest = [s for s in results if s.honest]
    rec = recommend([r for s in honest for r in s.per_rollout], [r for s in results if s.edit for r in s.per_rollout],
                    cfg.margin)
    th = rec.thresholds
    lp_honest = max((max(s.logprob_diff) for s in honest if s.logprob_diff), default=0.0)
    lp_rec = round(lp_honest * cfg.margin + 1e-3, 6)
    detection, lp_det, any_det, overlaps = {}, {}, {}, []
    for s in results:
        tl_fail = _rollout_fails(s, th)
        lp_fail = [d > lp_rec for d in s.logprob_diff]
        detection[s.name] = sum(tl_fail) / len(tl_fail) if tl_fail else float("nan")
        lp_det[s.name] = sum(lp_fail) / len(lp_fail) if lp_fail else float("nan")
        any_det[s.name] = sum(a or b for a, b in zip(tl_fail, lp_fail)) / len(tl_fail) if tl_fail else float("nan")
        if not s.honest and not all(tl_fail):
            overlaps.append(s.name)
    report = CalibrationReport(results, rec, lp_rec, overlaps, detection, lp_det, any_det,
                               wall_s=round(time.perf_counter() - t_start, 1))
    report.calibration = Calibration(
        format=CALIBRATION_FORMAT, model=model_identity(cfg.model, cfg.dtype),
        proof=cfg.proof,
        thresholds=th, sampling={"max_logprob_diff": lp_rec}, separable=rec.separable,
        figures=_finite({"recommendation": rec.to_dict(), "wall_s": report.wall_s,
                         "settings": cfg.model_dump(mode="json", include={
                             "task", "chat_template", "n_prompts", "max_new_tokens", "temperature", "top_p", "seed",
                             "batch_sizes", "threads", "edits", "edit_rounds", "margin"}),
                         "scenarios": [{**s.summary(), "toploc_fail_rate_recommended": detection[s.name],
                                        "logprob_fail_rate_recommended": lp_det[s.name]} for s in results]}))
    return report


def _write_metrics(path: str, report: CalibrationReport) -> None:
    """Per-scenario figures, the recommendation, every rollout the thresholds were chosen from and the detection
    rates under them, as JSONL."""
    rec, th = report.recommendation, report.recommended
    with MetricsWriter(path) as w:
        for row in report.rows():
            w.write(kind="toploc_calibration", **row)
        w.write(kind="toploc_recommended", **th.model_dump(), max_logprob_diff=report.recommended_logprob_diff,
                separable=rec.separable, edits=rec.edits, edits_passing=rec.edits_passing,
                edits_passing_margin=rec.edits_passing_margin, note=rec.note, wall_s=report.wall_s)
        for sc in report.scenarios:  # what the thresholds were chosen from: every rollout's chunk metrics
            if sc.honest or sc.edit:
                for chunks in sc.per_rollout:
                    w.write(kind="toploc_rollout", scenario=sc.name, chunks=_finite(chunks))
        for name in report.detection_recommended:
            w.write(kind="toploc_detection_recommended", scenario=name,
                    toploc=report.detection_recommended[name],
                    logprob=report.logprob_detection_recommended.get(name),
                    any=report.any_detection_recommended.get(name))


_EDIT_MIN = {"first": 1, "middle": 1, "third_to_last": 2, "second_to_last": 1, "last": 0}  # completion longer than


def _edit_position(kind: str, n: int) -> int:
    """The completion token (of n) a one-token edit of ``kind`` replaces."""
    return {"first": 0, "middle": (n - 1) // 2, "third_to_last": n - 3, "second_to_last": n - 2, "last": n - 1}[kind]


def _finite(obj: object) -> object:
    """NaN / infinity (empty scenarios, proofs rejected outright) as None: the file is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _rollout_fails(s: ScenarioResult, th: Thresholds) -> list[bool]:
    return [not rollout_passes(chunks, th) for chunks in s.per_rollout]


def _detect_rate(s: ScenarioResult, th: Thresholds) -> float:
    """Share of this scenario's rollouts with at least one chunk failing thresholds ``th``."""
    fail = _rollout_fails(s, th)
    return sum(fail) / len(fail) if fail else float("nan")
