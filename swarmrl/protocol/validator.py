"""The validator: re-checks every pending submission and posts a signed verdict with reasons.

Checks are plain callables ``check(ctx) -> (ok, reason)`` run in order; a check may raise
``SkipCheck(reason)`` when it cannot run (recorded as skipped, not failed). Built in:

- ``schema``: the file passes ``read_rollouts`` and every row names this node, step and seed
- ``seed``: the assignment's seed is blake2b(origin node | step | run secret) (re-derived here)
- ``tasks``: groups answer exactly the seeded tasks (group size, prompts as stated under the assigned
  thinking budget, that budget)
- ``policy``: every row's policy version lies inside the async window and was published
- ``rewards``: completions decoded with the policy's tokenizer and re-scored with the env verifier; the
  length penalty re-derived from the assigned budget and the completion's length
- ``logprobs``: a few rows' claimed logprobs recomputed exactly (one packed forward per policy version)
- ``toploc`` and ``sampling``: imported lazily from ``module:function`` names in the config (default
  ``swarmrl.toploc.rollout:verify_rollouts``, batched: one call per policy version in the file); skipped
  with a logged reason while that module is absent. The model is the one of each row's policy version
  (``model_dir_template``) or ``model_dir``.
"""

from __future__ import annotations

import importlib
import logging
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from swarmrl.envs import Task, make_env
from swarmrl.protocol.assignment import assigned_tasks, task_seed
from swarmrl.protocol.client import ApiError
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.schemas import CheckResult, PendingSubmission, VerdictRequest
from swarmrl.rl.rollouts import Rollout, RolloutError, read_rollouts

log = logging.getLogger("swarmrl.protocol.validator")


class SkipCheck(Exception):
    """A check cannot run here (missing module, model, tokenizer); recorded as skipped."""


@dataclass
class CheckContext:
    rows: list[Rollout]
    item: PendingSubmission
    cfg: ValidatorConfig
    tokenizer: Any = None
    model_loader: Callable[[int], Any] | None = None  # policy version -> model
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def expected_tasks(self) -> list[Task]:
        if "tasks" not in self.cache:
            a = self.item.assignment
            self.cache["tasks"] = assigned_tasks(a.env, a.env_params, a.seed, len(a.tasks))
        return self.cache["tasks"]

    def model(self, policy_version: int) -> Any:
        if self.model_loader is None:
            raise SkipCheck("no model_dir configured")
        return self.model_loader(policy_version)


Check = Callable[[CheckContext], tuple[bool, str]]


def check_schema(ctx: CheckContext) -> tuple[bool, str]:
    a, sub = ctx.item.assignment, ctx.item.submission
    for i, r in enumerate(ctx.rows):
        if r.worker_id != sub.node_id:
            return False, f"row {i}: worker_id {r.worker_id!r} is not the submitting node {sub.node_id}"
        if r.step != a.step:
            return False, f"row {i}: step {r.step} is not the assignment's step {a.step}"
        if r.seed != a.seed:
            return False, f"row {i}: seed {r.seed} is not the assignment's seed {a.seed}"
    return True, f"{len(ctx.rows)} rows"


def check_seed(ctx: CheckContext) -> tuple[bool, str]:
    a = ctx.item.assignment
    want = task_seed(ctx.item.origin_node_id, a.step, ctx.cfg.run_secret, a.round)
    if a.seed != want:
        return False, (f"assignment seed {a.seed} is not the one derived for node {ctx.item.origin_node_id}, "
                       f"step {a.step}, round {a.round}")
    return True, "seed re-derived"


def check_tasks(ctx: CheckContext) -> tuple[bool, str]:
    a = ctx.item.assignment
    expected = ctx.expected_tasks
    by_id = {t.task_id: t for t in expected}
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for r in ctx.rows:
        groups[r.group_id].append(r)
    got: Counter[str] = Counter()
    for gid, rows in groups.items():
        ids = {r.task_id for r in rows}
        if len(ids) != 1:
            return False, f"group {gid!r} mixes tasks {sorted(ids)[:3]}"
        if len(rows) != a.group_size:
            return False, f"group {gid!r} has {len(rows)} completions, expected group size {a.group_size}"
        got[rows[0].task_id] += 1
    want = Counter(t.task_id for t in expected)
    if got != want:
        extra = sorted((got - want).elements())[:3]
        missing = sorted((want - got).elements())[:3]
        return False, f"tasks differ from the seeded assignment: unassigned {extra}, missing {missing}"
    for i, r in enumerate(ctx.rows):
        t = by_id[r.task_id]
        if r.env != t.env:
            return False, f"row {i}: env {r.env!r} is not {t.env!r}"
        if r.target_length != a.target_length:
            return False, f"row {i}: thinking budget {r.target_length} is not the assigned {a.target_length}"
    if ctx.tokenizer is not None:
        from swarmrl.inference.prompts import encode_prompt
        from swarmrl.rl.budget import format_prompt

        enc: dict[str, list[int]] = {}
        for i, r in enumerate(ctx.rows):
            if r.task_id not in enc:
                text = by_id[r.task_id].prompt
                if a.target_length is not None:
                    text = format_prompt(text, a.target_length, a.budget_prompt_format or "{prompt}")
                enc[r.task_id] = encode_prompt(ctx.tokenizer, text,
                                               chat_template=bool(getattr(ctx.tokenizer, "chat_template", None)))
            if list(r.prompt_ids) != enc[r.task_id]:
                return False, f"row {i}: prompt tokens are not the assigned task's prompt"
    return True, f"{len(groups)} groups match the seeded tasks"


def check_policy(ctx: CheckContext) -> tuple[bool, str]:
    a, it = ctx.item.assignment, ctx.item
    lo = a.step - it.async_window
    # judged against the step current at VERDICT time: a validator lagging behind the trainer would slash honest
    # nodes for its own delay, so swarm mode turns this off (late work is harmless: the trainer never uses it)
    if ctx.cfg.reject_late_steps and it.current_step - a.step > it.async_window:
        return False, f"step {a.step} is older than the async window ({it.async_window}) behind step {it.current_step}"
    for i, r in enumerate(ctx.rows):
        if r.policy_version < lo or r.policy_version > a.step:
            return False, f"row {i}: policy version {r.policy_version} outside the async window [{lo}, {a.step}]"
        if r.policy_version > it.current_policy_version:
            return False, f"row {i}: policy version {r.policy_version} was never published (latest {it.current_policy_version})"
    return True, f"policy versions within [{lo}, {a.step}]"


def check_rewards(ctx: CheckContext) -> tuple[bool, str]:
    if ctx.tokenizer is None:
        raise SkipCheck("no tokenizer (model_dir) configured")
    from swarmrl.inference.prompts import decode_completion
    from swarmrl.rl.budget import completion_length

    a = ctx.item.assignment
    env = make_env(a.env, **(a.env_params or {}))
    by_id = {t.task_id: t for t in ctx.expected_tasks}
    tol = ctx.cfg.reward_tolerance
    for i, r in enumerate(ctx.rows):
        task = by_id.get(r.task_id)
        if task is None:
            return False, f"row {i}: unknown task {r.task_id!r}"
        text = decode_completion(ctx.tokenizer, list(r.completion_ids))
        want = float(env.verify(task, text))
        if abs(want - r.task_reward) > tol:
            return False, f"row {i}: task_reward {r.task_reward:g} but the verifier gives {want:g}"
        if a.target_length is not None:
            eos = getattr(ctx.tokenizer, "eos_token_id", None)
            ends = bool(r.completion_ids) and r.completion_ids[-1] == eos
            if r.finished != ends:
                return False, f"row {i}: finished={r.finished} but the completion {'ends' if ends else 'does not end'} with EOS"
            pen = a.budget_penalty * abs(a.target_length - completion_length(list(r.completion_ids), ends))
            if abs(pen - r.length_penalty) > tol:
                return False, (f"row {i}: length_penalty {r.length_penalty:g} but budget {a.target_length} and "
                               f"{completion_length(list(r.completion_ids), ends)} tokens give {pen:g}")
        elif r.length_penalty != 0.0:
            return False, f"row {i}: length_penalty {r.length_penalty:g} without a thinking budget"
        if r.length_penalty < -tol or abs(r.reward - (r.task_reward - r.length_penalty)) > tol:
            return False, f"row {i}: reward {r.reward:g} != task_reward - length_penalty ({r.task_reward:g} - {r.length_penalty:g})"
    return True, f"{len(ctx.rows)} rewards recomputed"


def logprob_check(cfg: ValidatorConfig) -> Check:
    """Recompute the claimed sampling logprobs of up to ``cfg.logprob_rows`` rows (a sample fixed by the file
    hash) with the model of each row's policy version: tokens the policy did not sample, or a different
    model, show up as logprobs off by more than ``cfg.logprob_tolerance``. A cheap stand-in for the
    TOPLOC proof check (which also covers nodes that recompute their logprobs after editing)."""

    def check(ctx: CheckContext) -> tuple[bool, str]:
        if cfg.logprob_rows == 0:
            raise SkipCheck("logprob check disabled")
        if ctx.model_loader is None:
            raise SkipCheck("no model_dir configured")
        import random

        import torch

        from swarmrl.rl.train_step import Sequence, _pack, sequence_logprobs

        pad = getattr(ctx.tokenizer, "pad_token_id", None) or 0
        idx = list(range(len(ctx.rows)))
        random.Random(ctx.item.submission.sha256).shuffle(idx)
        picked = [i for i in sorted(idx[: cfg.logprob_rows]) if ctx.rows[i].completion_ids]
        worst = 0.0
        for version, rows_idx in _by_version(ctx.rows, picked).items():
            model = ctx.model(version)
            if not isinstance(model, torch.nn.Module):
                raise SkipCheck(f"policy v{version} is not a torch model here")
            by_temp: dict[float, list[int]] = defaultdict(list)  # one packed forward per sampling temperature
            for i in rows_idx:
                t = ctx.rows[i].temperature
                by_temp[t if t > 0 else 1.0].append(i)
            for temp, chunk in by_temp.items():
                seqs = [Sequence(list(ctx.rows[i].prompt_ids), list(ctx.rows[i].completion_ids),
                                 list(ctx.rows[i].logprobs), 0.0, temp) for i in chunk]
                packed = _pack(seqs, pad)
                with torch.no_grad():
                    logp, _ = sequence_logprobs(model, packed, temp)
                for j, i in enumerate(chunk):
                    mask = packed["cmask"][j] > 0
                    diff = float((logp[j][mask] - packed["old"][j][mask]).abs().max())
                    if not diff <= cfg.logprob_tolerance:  # also catches NaN claims
                        return False, (f"row {i}: claimed logprobs differ from policy v{version}'s by {diff:.4g} "
                                       f"(tolerance {cfg.logprob_tolerance:g}): tokens not sampled from that policy")
                    worst = max(worst, diff)
        return True, f"{len(picked)} rows' logprobs recomputed (max diff {worst:.2e})"

    check.__name__ = "check_logprobs"
    return check


def _import_dotted(spec: str) -> Callable[..., Any]:
    mod_name, _, fn_name = spec.partition(":")
    mod = importlib.import_module(mod_name)
    try:
        return getattr(mod, fn_name)
    except AttributeError:
        raise ImportError(f"{mod_name} has no {fn_name}") from None


def _result(res: Any) -> tuple[bool, str]:
    if isinstance(res, tuple):
        return bool(res[0]), str(res[1] or "")
    return bool(getattr(res, "passed")), str(getattr(res, "reason", "") or "")


def _optional_import(spec: str, what: str) -> Callable[..., Any] | None:
    if not spec:
        return None
    try:
        return _import_dotted(spec)
    except ImportError as e:
        log.warning("%s skipped: cannot import %s (%s)", what, spec, e)
        return None


def lazy_check(name: str, spec: str, per_row: Callable[[Callable[..., Any], Any, Rollout], Any]) -> Check:
    """A check whose implementation is imported from ``module:function`` on first use; when the module
    is missing it is skipped (with the reason logged) instead of failing. ``per_row(fn, model, row)``
    calls it for one row with the model of that row's policy version."""

    def check(ctx: CheckContext) -> tuple[bool, str]:
        if not spec:
            raise SkipCheck(f"{name} check disabled")
        try:
            fn = _import_dotted(spec)
        except ImportError as e:
            log.warning("%s check skipped: cannot import %s (%s)", name, spec, e)
            raise SkipCheck(f"{spec} not available: {e}") from None
        for i, r in enumerate(ctx.rows):
            ok, reason = _result(per_row(fn, ctx.model(r.policy_version), r))
            if not ok:
                return False, f"row {i}: {reason}"
        return True, f"{len(ctx.rows)} rows pass"

    check.__name__ = f"check_{name}"
    return check


def _by_version(rows: list[Rollout], indices: list[int] | None = None) -> dict[int, list[int]]:
    """Row indices (all, or ``indices``) grouped by policy version, versions ascending."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(rows)) if indices is None else indices:
        groups[rows[i].policy_version].append(i)
    return dict(sorted(groups.items()))


def toploc_check(cfg: ValidatorConfig) -> Check:
    """TOPLOC proofs of every row, batched: for each policy version in the file, ONE call
    ``toploc_check(model, items, batch_size=..., [sampling_thresholds=...])`` with items
    ``(prompt_ids, completion_ids, proofs, claim-or-None)`` returning one result per item (default
    ``swarmrl.toploc.rollout:verify_rollouts``: a left-padded prefill per ``toploc_batch_size`` rows).
    When ``cfg.sampling_claim`` imports, each row's sampling claim (temperature, logprobs, finished) is
    checked in the same prefill."""

    def check(ctx: CheckContext) -> tuple[bool, str]:
        if not cfg.toploc_check:
            raise SkipCheck("toploc check disabled")
        try:
            fn = _import_dotted(cfg.toploc_check)
        except ImportError as e:
            log.warning("toploc check skipped: cannot import %s (%s)", cfg.toploc_check, e)
            raise SkipCheck(f"{cfg.toploc_check} not available: {e}") from None
        claim_fn = _optional_import(cfg.sampling_claim, "sampling claims")
        eos = getattr(ctx.tokenizer, "eos_token_id", None)
        kw: dict[str, Any] = {"batch_size": cfg.toploc_batch_size}
        if claim_fn is not None and eos is not None and cfg.sampling_thresholds:
            from swarmrl.toploc.sampling_check import SamplingThresholds

            kw["sampling_thresholds"] = SamplingThresholds(**cfg.sampling_thresholds)
        results: list[Any] = [None] * len(ctx.rows)
        for version, idx in _by_version(ctx.rows).items():
            model = ctx.model(version)
            items = [(list(ctx.rows[i].prompt_ids), list(ctx.rows[i].completion_ids), list(ctx.rows[i].proofs),
                      claim_fn(ctx.rows[i], eos) if claim_fn is not None and eos is not None else None) for i in idx]
            out = list(fn(model, items, **kw))
            if len(out) != len(items):
                raise RuntimeError(f"{cfg.toploc_check} returned {len(out)} results for {len(items)} rows")
            for i, res in zip(idx, out):
                results[i] = res
        ctx.cache["toploc_results"] = results
        for i, res in enumerate(results):
            ok, reason = _result(res)
            if not ok:
                return False, f"row {i}: {reason}"
        return True, f"{len(ctx.rows)} rows pass"

    check.__name__ = "check_toploc"
    return check


def sampling_check(cfg: ValidatorConfig) -> Check:
    """A separate per-row sampling check ``fn(model, row)`` when ``cfg.sampling_check`` names one; otherwise
    the sampling results the TOPLOC check produced in its prefill (skipped when there are none)."""
    separate = lazy_check("sampling", cfg.sampling_check, lambda fn, m, r: fn(m, r))

    def check(ctx: CheckContext) -> tuple[bool, str]:
        if cfg.sampling_check:
            return separate(ctx)
        results = ctx.cache.get("toploc_results") or []
        samp = [getattr(x, "sampling", None) for x in results]
        if not samp or all(x is None for x in samp):
            raise SkipCheck("no sampling results (TOPLOC check skipped or made no sampling claim)")
        for i, x in enumerate(samp):
            if x is not None and not x.passed:
                return False, f"row {i}: " + "; ".join(getattr(x, "reasons", []) or ["implausible sampling"])
        return True, f"{sum(x is not None for x in samp)} rows plausibly sampled"

    check.__name__ = "check_sampling"
    return check


def default_checks(cfg: ValidatorConfig) -> list[tuple[str, Check]]:
    return [
        ("schema", check_schema),
        ("seed", check_seed),
        ("tasks", check_tasks),
        ("policy", check_policy),
        ("rewards", check_rewards),
        ("logprobs", logprob_check(cfg)),
        ("toploc", toploc_check(cfg)),
        ("sampling", sampling_check(cfg)),
    ]


@dataclass
class Verdict:
    accepted: bool
    reason: str
    checks: list[CheckResult]
    seconds: dict[str, float] = field(default_factory=dict)  # per check (and "read")


def judge(rows_path: Path, item: PendingSubmission, cfg: ValidatorConfig, checks: list[tuple[str, Check]],
          tokenizer: Any = None, model_loader: Callable[[int], Any] | None = None) -> Verdict:
    results: list[CheckResult] = []
    secs: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        rows = read_rollouts(rows_path)
    except RolloutError as e:
        return Verdict(False, f"schema: {e}", [CheckResult(name="schema", ok=False, reason=str(e))])
    secs["read"] = time.perf_counter() - t0
    ctx = CheckContext(rows=rows, item=item, cfg=cfg, tokenizer=tokenizer, model_loader=model_loader)
    for name, check in checks:
        t0 = time.perf_counter()
        try:
            ok, reason = check(ctx)
        except SkipCheck as e:
            required = name == "toploc" and cfg.require_proofs
            results.append(CheckResult(name=name, ok=not required, reason=f"skipped: {e}", skipped=True))
            if required:
                return Verdict(False, f"{name}: required but skipped: {e}", results, secs)
            continue
        except Exception as e:  # a check crashing on hostile input is a rejection, not a validator crash
            log.exception("check %s crashed", name)
            ok, reason = False, f"check crashed: {type(e).__name__}: {e}"
        finally:
            secs[name] = time.perf_counter() - t0
        results.append(CheckResult(name=name, ok=ok, reason=reason[:1000]))
        if not ok:
            return Verdict(False, f"{name}: {reason}"[:4000], results, secs)
    return Verdict(True, "all checks passed", results, secs)


class Validator:
    """Polls the orchestrator for pending submissions, judges them, posts signed verdicts."""

    def __init__(self, cfg: ValidatorConfig, client: Any = None, checks: list[tuple[str, Check]] | None = None,
                 tokenizer: Any = None) -> None:
        from swarmrl.protocol.client import ValidatorClient

        self.cfg = cfg
        if cfg.threads:
            import torch

            torch.set_num_threads(cfg.threads)
        self.client = client or ValidatorClient(cfg.orchestrator, cfg.key, timeout=cfg.timeout_s)
        self.checks = checks if checks is not None else default_checks(cfg)
        self.tokenizer = tokenizer
        if self.tokenizer is None and cfg.model_dir:
            from swarmrl.models import load_tokenizer

            self.tokenizer = load_tokenizer(cfg.model_dir)
        if self.tokenizer is None:
            log.warning("no model_dir: completions cannot be decoded, so rewards are NOT re-checked")
        self._models: dict[str, Any] = {}
        self.work = Path(cfg.work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.judged = 0
        from swarmrl.utils.metrics import MetricsWriter

        self.metrics = MetricsWriter(self.work / "metrics.jsonl")

    def _load_model(self, policy_version: int) -> Any:
        """The policy that generated a row: ``model_dir_template`` formatted with the version (e.g. a
        SHARDCAST download dir), else ``model_dir``. The last two models stay loaded."""
        if self.cfg.model_dir_template:
            path = self.cfg.model_dir_template.format(policy_version=policy_version)
        elif self.cfg.model_dir:
            path = self.cfg.model_dir
        else:
            raise SkipCheck("no model_dir configured")
        if path not in self._models:
            if not Path(path, "config.json").is_file():
                raise SkipCheck(f"no model for policy version {policy_version} at {path}")
            from swarmrl.models import load_model

            if len(self._models) >= 2:
                self._models.pop(next(iter(self._models)))
            self._models[path] = load_model(path)
        return self._models[path]

    def run_once(self) -> list[tuple[int, Verdict]]:
        out = []
        for item in self.client.pending().items:
            sid = item.submission.submission_id
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(dir=self.work) as d:
                path = Path(d) / "rollouts.parquet"
                sha = self.client.download(sid, path)
                if sha != item.submission.sha256:
                    v = Verdict(False, "stored file does not match its recorded hash",
                                [CheckResult(name="hash", ok=False, reason="mismatch")])
                else:
                    v = judge(path, item, self.cfg, self.checks, self.tokenizer, self._load_model)
            try:
                self.client.verdict(VerdictRequest(submission_id=sid, accepted=v.accepted, reason=v.reason,
                                                   checks=v.checks))
            except ApiError as e:
                if e.status != 409:  # 409: decided meanwhile (another validator, or its node was ejected)
                    raise
                log.info("submission %d already decided: %s", sid, e.detail)
                continue
            self.metrics.write(submission_id=sid, node_id=item.submission.node_id, step=item.submission.step,
                               rows=item.submission.n_rows, accepted=v.accepted, reason=v.reason[:300],
                               seconds=time.perf_counter() - t0,
                               check_s={k: round(x, 4) for k, x in v.seconds.items()},
                               skipped=[c.name for c in v.checks if c.skipped])
            log.info("submission %d from %s: %s (%s)", sid, item.submission.node_id,
                     "accepted" if v.accepted else "REJECTED", v.reason)
            self.judged += 1
            out.append((sid, v))
        return out

    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        batches = 0
        while not stop.is_set():
            try:
                done = self.run_once()
            except Exception as e:  # orchestrator down or hiccup: keep polling
                log.warning("validator poll failed: %s", e)
                done = []
            batches += 1
            if self.cfg.max_batches and batches >= self.cfg.max_batches:
                return
            if not done:
                stop.wait(self.cfg.poll_interval_s)
