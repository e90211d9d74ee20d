"""The validator's checks: plain callables ``check(ctx) -> (ok, reason)``, run cheapest first.

A check has three outcomes, and they must not be confused:

- a FINDING: the submission is wrong. The check returns ``(False, reason)``; the node is slashed. Every
  property of the untrusted file a check relies on (shapes, ranges, token ids inside the vocabulary,
  sequence lengths, proof counts and sizes) is validated explicitly and reported as a finding, so hostile
  input never makes a check raise;
- a SKIP: the check cannot run here by the operator's choice (no model configured, check disabled):
  ``raise SkipCheck(reason)``, recorded as skipped;
- an INTERNAL ERROR: anything else a check raises (a bug, a misconfigured check, a missing model, OOM, a
  sandbox that did not start). Never the node's fault: the validator leaves the submission pending and
  retries it later (``swarmrl.protocol.validator``).

Order (``default_checks``), cheapest first, so a submission failing a cheap check never reaches an expensive
one: schema and sizes, seed, tasks (the seeded assignment), policy window, TOPLOC proof shape, the replay of
multi-turn rows' environment turns; then the checks that run the model (logprobs, toploc, sampling: one forward
per policy version serves all three, ``model_states``); then rewards
(env verifiers, the code sandbox) last. A multi-turn row (``completion_mask`` 0 at an environment's tokens) is
checked at the model's tokens by the model checks, and on the replayed text by the rewards check.
"""

from __future__ import annotations

import inspect
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from swarmrl.contract import PROOF_GEOMETRY, Rollout, assigned_tasks, check_score, format_prompt, task_seed
from swarmrl.contract.sampling import row_problem
from swarmrl.envs import Task
from swarmrl.envs.multiturn import is_multiturn
from swarmrl.envs.vf import PREFIX as VF_PREFIX
from swarmrl.protocol.check_config import import_dotted, sampling_claimer
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.replay import replay_and_text, task_prompt_ids
from swarmrl.protocol.schemas import PendingSubmission
from swarmrl.toploc.proof import M_MAX, P, chunk_count, proof_len
from swarmrl.toploc.rollout import Recomputed, input_problem, recompute
from swarmrl.toploc.thresholds_file import ToplocSettings, toploc_settings


class SkipCheck(Exception):
    """A check cannot run here by configuration (no model, check disabled); recorded as skipped."""


@dataclass
class CheckContext:
    rows: list[Rollout]
    item: PendingSubmission
    cfg: ValidatorConfig
    tokenizer: Any = None
    model_loader: Callable[[int], Any] | None = None  # policy version -> model
    cache: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None  # token ids must be below this (None: unknown, not checked here)
    settings_loader: Callable[[int], ToplocSettings] | None = None  # policy version -> its TOPLOC thresholds

    @property
    def expected_tasks(self) -> list[Task]:
        if "tasks" not in self.cache:
            a = self.item.assignment
            self.cache["tasks"] = assigned_tasks(a.contract.task.name, a.contract.task.params, a.seed, len(a.tasks))
        return self.cache["tasks"]

    def model(self, policy_version: int) -> Any:
        if self.model_loader is None:
            raise SkipCheck("no model_dir configured")
        return self.model_loader(policy_version)

    def toploc_settings(self, policy_version: int) -> ToplocSettings:
        """The TOPLOC thresholds for this version's rows: the config's > its model dir's calibration file >
        defaults (without a loader, the config's alone)."""
        if self.settings_loader is not None:
            return self.settings_loader(policy_version)
        return toploc_settings(None, self.cfg.toploc_thresholds, self.cfg.sampling_thresholds)


Check = Callable[[CheckContext], tuple[bool, str]]


def _multiturn_task(ctx: CheckContext) -> bool:
    """Whether the assignment's task samples episodes (a multi-turn environment, or a verifiers one: told by its
    name, without importing verifiers); an episode's row of model tokens alone is stored without a mask."""
    if "multiturn" not in ctx.cache:
        vf = ctx.item.assignment.contract.task.name.startswith(VF_PREFIX)
        ctx.cache["multiturn"] = vf or is_multiturn(_task_env(ctx))
    return ctx.cache["multiturn"]


def check_schema(ctx: CheckContext) -> tuple[bool, str]:
    """Every row names this node, step and seed; token ids inside the vocabulary; sampled as the contract says
    (``contract.sampling``: its temperature, no more model tokens than its limit; ``contract.sampling.row_problem``).
    (Sizes, types, lengths and finite numbers were checked by ``read_rollouts`` before any check.)"""
    a, sub = ctx.item.assignment, ctx.item.submission
    verifiers = a.contract.task.name.startswith(VF_PREFIX)
    for i, r in enumerate(ctx.rows):
        if r.worker_id != sub.node_id:
            return False, f"row {i}: worker_id {r.worker_id!r} is not the submitting node {sub.node_id}"
        if r.step != a.step:
            return False, f"row {i}: step {r.step} is not the assignment's step {a.step}"
        if r.seed != a.seed:
            return False, f"row {i}: seed {r.seed} is not the assignment's seed {a.seed}"
        wrong = row_problem(r, a.contract.sampling, lambda: _multiturn_task(ctx), verifiers)
        if wrong is not None:
            return False, f"row {i}: {wrong}"
        if ctx.vocab_size is not None:
            top = max(max(r.prompt_ids), max(r.completion_ids))
            if top >= ctx.vocab_size:
                return False, f"row {i}: token id {top} outside the policy's vocabulary [0, {ctx.vocab_size})"
    return True, f"{len(ctx.rows)} rows"


class SecretMismatch(RuntimeError):
    """The orchestrator's seed for an assignment is not the one this validator derives: the two disagree on the
    run secret (or the orchestrator is not the one we think). Never the node's doing: an internal error."""


def check_seed(ctx: CheckContext) -> tuple[bool, str]:
    """The assignment's seed (made by the orchestrator, which a node cannot touch; the rows' seeds are held to it
    by the schema check) re-derived from the run secret. A mismatch is the orchestrator and this validator
    disagreeing, so it raises (an internal error) instead of slashing the node."""
    a = ctx.item.assignment
    want = task_seed(ctx.item.origin_node_id, a.step, ctx.cfg.run_secret, a.round)
    if a.seed != want:
        raise SecretMismatch(f"the orchestrator's seed {a.seed} for node {ctx.item.origin_node_id}, step {a.step}, "
                             f"round {a.round} is not the one derived here: is run_secret the orchestrator's?")
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
            return False, f"group {gid[:64]!r} mixes tasks {sorted(ids)[:3]}"
        if len(rows) != a.contract.group_size:
            return False, f"group {gid[:64]!r} has {len(rows)} completions, expected group size {a.contract.group_size}"
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
        text_of = {t.task_id: format_prompt(t.prompt, a.budget()) for t in expected}
        enc: dict[str, list[int]] = {}
        for i, r in enumerate(ctx.rows):
            if r.task_id not in enc:
                enc[r.task_id] = task_prompt_ids(by_id[r.task_id], ctx.tokenizer, text_of[r.task_id],
                                                 a.contract.chat_template)
            if list(r.prompt_ids) != enc[r.task_id]:
                return False, f"row {i}: prompt tokens are not the assigned task's prompt"
    return True, f"{len(groups)} groups match the seeded tasks"


def check_policy(ctx: CheckContext) -> tuple[bool, str]:
    a, it = ctx.item.assignment, ctx.item
    k = a.contract.async_level
    window = a.contract.window()
    # judged against the step current at VERDICT time: a validator lagging behind the trainer would slash honest
    # nodes for its own delay, so swarm mode turns this off (late work is harmless: the trainer never uses it)
    if ctx.cfg.reject_late_steps and window.is_late(a.step, it.current_step):
        return False, f"step {a.step} is older than the async window ({k}) behind step {it.current_step}"
    versions = window.versions_for_step(a.step)
    for i, r in enumerate(ctx.rows):
        if not window.serves(r.policy_version, a.step):
            return False, (f"row {i}: policy version {r.policy_version} outside the async window "
                           f"[{a.step - k}, {a.step}]")
        if r.policy_version > it.current_policy_version:
            return False, f"row {i}: policy version {r.policy_version} was never published (latest {it.current_policy_version})"
    return True, f"policy versions within [{versions.start}, {a.step}]"


def check_proofs(ctx: CheckContext) -> tuple[bool, str]:
    """TOPLOC proof SHAPE, before any model runs: a row with proofs has one per chunk of its completion, each
    exactly 2 + 2k bytes with a valid header (index modulus in [k, 65497], coefficients < p, not all zero).
    A row without proofs is refused only under ``require_proofs`` (otherwise the TOPLOC check decides)."""
    if not ctx.cfg.toploc_check:
        raise SkipCheck("toploc check disabled")
    g = ctx.item.assignment.contract.proof  # the validator refuses to judge under a geometry not its own
    size = proof_len(g.k)
    n_with = 0
    blobs: list[bytes] = []
    owner: list[int] = []
    for i, r in enumerate(ctx.rows):
        if not r.proofs:
            if ctx.cfg.require_proofs:
                return False, f"row {i}: no TOPLOC proofs (require_proofs)"
            continue
        n_with += 1
        n_model = len(r.model_positions())  # a multi-turn row's proofs cover the model's tokens only
        want = chunk_count(n_model, g.chunk)
        if len(r.proofs) != want:
            mine = "" if n_model == len(r.completion_ids) else " sampled by the model"
            return False, (f"row {i}: {len(r.proofs)} TOPLOC proofs for {n_model} completion tokens{mine} "
                           f"(expected {want}: one per {g.chunk} positions)")
        for j, p in enumerate(r.proofs):
            if len(p) != size:
                return False, f"row {i}: proof {j} is {len(p)} bytes, expected {size} (k={g.k})"
        blobs.extend(r.proofs)
        owner.extend([i] * len(r.proofs))
    if blobs:
        arr = np.frombuffer(b"".join(blobs), dtype=">u2").reshape(len(blobs), 1 + g.k).astype(np.int64)
        bad = (arr[:, 0] < g.k) | (arr[:, 0] > M_MAX) | (arr[:, 1:] >= P).any(axis=1) | ~arr.any(axis=1)
        if bad.any():
            j = int(np.argmax(bad))
            return False, (f"row {owner[j]}: malformed TOPLOC proof (index modulus {int(arr[j, 0])}, "
                           f"coefficients < {P} required, not all zero)")
    return True, f"{n_with} rows with well-formed proofs ({len(ctx.rows) - n_with} without)"


def _task_env(ctx: CheckContext) -> Any:
    """The assignment's environment, built once per submission; strict: a verifier that cannot judge (a sandbox
    that did not start) raises, an internal error rather than a finding."""
    if "env" not in ctx.cache:
        env = ctx.item.assignment.contract.task.build()
        env.strict = True
        ctx.cache["env"] = env
    return ctx.cache["env"]


def _replayed(ctx: CheckContext, i: int, r: Rollout, task: Task) -> tuple[str | None, str]:
    """Row ``i``'s replay finding and the text its reward is scored on (computed once per row)."""
    done = ctx.cache.setdefault("replayed", {})
    if i not in done:
        done[i] = replay_and_text(_task_env(ctx), task, r, ctx.tokenizer)
    return done[i]


def check_replay(ctx: CheckContext) -> tuple[bool, str]:
    """Every row's environment turns replayed (a multi-turn environment runs here on the row's model turns; a
    single-turn task's row holds no environment token). Cheap (no model), so it runs before the model checks: an
    edited environment turn or a forged tool result is named as such."""
    if ctx.tokenizer is None:
        raise SkipCheck("no tokenizer (model_dir) configured")
    by_id = {t.task_id: t for t in ctx.expected_tasks}
    turns = 0
    for i, r in enumerate(ctx.rows):
        task = by_id.get(r.task_id)
        if task is None:
            return False, f"row {i}: unknown task {r.task_id!r}"
        problem, _ = _replayed(ctx, i, r, task)
        if problem is not None:
            return False, f"row {i}: {problem}"
        turns += int(r.completion_mask is not None and 0 in r.completion_mask)
    return True, f"{len(ctx.rows)} rows replay ({turns} with environment turns)"


def check_rewards(ctx: CheckContext) -> tuple[bool, str]:
    if ctx.tokenizer is None:
        raise SkipCheck("no tokenizer (model_dir) configured")
    a = ctx.item.assignment
    env = _task_env(ctx)
    by_id = {t.task_id: t for t in ctx.expected_tasks}
    budget = a.budget()
    eos = getattr(ctx.tokenizer, "eos_token_id", None)
    for i, r in enumerate(ctx.rows):
        task = by_id.get(r.task_id)
        if task is None:
            return False, f"row {i}: unknown task {r.task_id!r}"
        replay, text = _replayed(ctx, i, r, task)  # already run by check_replay in the default order
        if replay is not None:
            return False, f"row {i}: replay: {replay}"
        wrong = check_score(r, env, task, text, eos, budget, ctx.cfg.reward_tolerance)
        if wrong is not None:
            return False, f"row {i}: {wrong}"
    return True, f"{len(ctx.rows)} rewards recomputed"


def model_states(ctx: CheckContext, version: int, model: torch.nn.Module, rows_idx: list[int]) -> dict[int, Recomputed]:
    """The model checks' one forward: the decode states and logits (``swarmrl.toploc.rollout.recompute``) of rows
    of one policy version, computed once per submission and kept in ``ctx.cache`` for the logprob, TOPLOC and
    sampling checks. Rows unfit for a forward (``input_problem``) are left out: the checks report them."""
    states: dict[int, Recomputed] = ctx.cache.setdefault("states", {})
    todo = [i for i in rows_idx if i not in states
            and input_problem(model, ctx.rows[i].prompt_ids, ctx.rows[i].completion_ids) is None]
    if todo:
        recs = recompute(model, [(ctx.rows[i].prompt_ids, ctx.rows[i].completion_ids) for i in todo],
                         batch_size=ctx.cfg.toploc_batch_size)
        states.update(zip(todo, recs))
    return {i: states[i] for i in rows_idx if i in states}


def _toploc_shares_states(cfg: ValidatorConfig) -> bool:
    """Whether the configured TOPLOC check will take the shared forward's states (ours does: ``recomputed=``)."""
    return bool(cfg.toploc_check) and _takes(import_dotted(cfg.toploc_check), {"batch_size": 1, "recomputed": None})


def logprob_check(cfg: ValidatorConfig) -> Check:
    """Recompute the claimed sampling logprobs of up to ``cfg.logprob_rows`` rows (a sample fixed by the file
    hash) with the model of each row's policy version: tokens the policy did not sample, or a different
    model, show up as logprobs off by more than ``cfg.logprob_tolerance``. The logprobs come from the model
    checks' one forward (``model_states``): when the TOPLOC check will run, that forward covers every row of the
    submission and the TOPLOC and sampling checks reuse it, so this check costs no forward of its own."""

    def check(ctx: CheckContext) -> tuple[bool, str]:
        if cfg.logprob_rows == 0:
            raise SkipCheck("logprob check disabled")
        if ctx.model_loader is None:
            raise SkipCheck("no model_dir configured")

        idx = list(range(len(ctx.rows)))
        random.Random(ctx.item.submission.sha256).shuffle(idx)
        picked = [i for i in sorted(idx[: cfg.logprob_rows]) if ctx.rows[i].completion_ids]
        every = _by_version(ctx.rows) if _toploc_shares_states(cfg) else {}
        worst = 0.0
        for version, rows_idx in _by_version(ctx.rows, picked).items():
            model = ctx.model(version)
            if not isinstance(model, torch.nn.Module):
                raise SkipCheck(f"policy v{version} is not a torch model here")
            for i in rows_idx:
                why = input_problem(model, ctx.rows[i].prompt_ids, ctx.rows[i].completion_ids)
                if why is not None:
                    return False, f"row {i}: {why}"
            # the TOPLOC check needs every row's states: one forward serves both (and its sampling check)
            states = model_states(ctx, version, model, every.get(version, rows_idx))
            for i in rows_idx:
                r = ctx.rows[i]
                temp = r.temperature if r.temperature > 0 else 1.0
                ids = torch.tensor(r.completion_ids, dtype=torch.long)
                logp = torch.log_softmax(states[i].logits / temp, dim=-1).gather(-1, ids[:, None])[:, 0]
                claimed = torch.tensor(r.logprobs, dtype=torch.float32)
                mask = torch.tensor(r.model_mask(), dtype=torch.bool)  # the model's tokens (an environment's are not sampled)
                diff = float((logp[mask] - claimed[mask]).abs().max()) if mask.any() else 0.0
                if not diff <= cfg.logprob_tolerance:  # also catches NaN claims
                    return False, (f"row {i}: claimed logprobs differ from policy v{version}'s by {diff:.4g} "
                                   f"(tolerance {cfg.logprob_tolerance:g}): tokens not sampled from that policy")
                worst = max(worst, diff)
        return True, f"{len(picked)} rows' logprobs recomputed (max diff {worst:.2e})"

    check.__name__ = "check_logprobs"
    return check


def _result(res: Any) -> tuple[bool, str]:
    if isinstance(res, tuple):
        return bool(res[0]), str(res[1] or "")
    return bool(res.passed), str(getattr(res, "reason", "") or "")


def lazy_check(name: str, spec: str, per_row: Callable[[Callable[..., Any], Any, Rollout], Any]) -> Check:
    """A check whose implementation is imported from ``module:function`` on first use. A name that does not
    import is a misconfiguration: the ImportError propagates (an internal error, never a rejection).
    ``per_row(fn, model, row)`` calls it for one row with the model of that row's policy version."""

    def check(ctx: CheckContext) -> tuple[bool, str]:
        if not spec:
            raise SkipCheck(f"{name} check disabled")
        fn = import_dotted(spec)
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


def _takes(fn: Callable[..., Any], kw: dict[str, Any]) -> bool:
    """Whether ``fn(model, items, **kw)`` binds (True when there is no signature to read)."""
    try:
        inspect.signature(fn).bind(None, [], **kw)
    except TypeError:
        return False
    except ValueError:
        pass
    return True


def toploc_check(cfg: ValidatorConfig) -> Check:
    """TOPLOC proofs of every row, batched: for each policy version in the file, ONE call
    ``toploc_check(model, items, batch_size=..., [sampling_thresholds=...])`` with items
    ``(prompt_ids, completion_ids, proofs, claim-or-None)`` returning one result per item (default
    ``swarmrl.toploc.rollout:verify_rollouts``: a left-padded prefill per ``toploc_batch_size`` rows).
    When ``cfg.sampling_claim`` is set, each row's sampling claim (temperature, logprobs, finished) is
    checked in the same prefill."""

    def check(ctx: CheckContext) -> tuple[bool, str]:
        if not cfg.toploc_check:
            raise SkipCheck("toploc check disabled")
        if ctx.model_loader is None:
            raise SkipCheck("no model_dir configured")
        fn = import_dotted(cfg.toploc_check)
        claim_fn = import_dotted(cfg.sampling_claim) if cfg.sampling_claim else None
        eos = getattr(ctx.tokenizer, "eos_token_id", None)
        claim = sampling_claimer(claim_fn, eos, ctx.item.assignment.contract.sampling,
                                 single=lambda r: r.completion_mask is None and not _multiturn_task(ctx))
        results: list[Any] = [None] * len(ctx.rows)
        shares = _toploc_shares_states(cfg)
        for version, idx in _by_version(ctx.rows).items():
            model = ctx.model(version)
            st = ctx.toploc_settings(version)
            kw: dict[str, Any] = {"batch_size": cfg.toploc_batch_size}
            extra: dict[str, Any] = {}
            if st.thresholds is not None:
                extra["thresholds"] = st.thresholds
            if ctx.item.assignment.contract.proof != PROOF_GEOMETRY:  # the default needs no argument
                extra["geometry"] = ctx.item.assignment.contract.proof
            if claim_fn is not None and eos is not None and st.sampling is not None:
                extra["sampling_thresholds"] = st.sampling
            if extra and _takes(fn, kw) and not _takes(fn, {**kw, **extra}):  # ours, not the node's: internal error
                raise RuntimeError(f"toploc_check {cfg.toploc_check} cannot take {', '.join(extra)} (policy "
                                   f"v{version}: {st.source}); set toploc_calibration = false or use a function "
                                   "that takes them")
            kw.update(extra)
            items = [_toploc_item(ctx.rows[i], claim) for i in idx]
            if shares:  # the model checks' one forward (the logprob check's)
                states = model_states(ctx, version, model, idx) if isinstance(model, torch.nn.Module) else {}
                kw["recomputed"] = [states.get(i) for i in idx]
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


def _toploc_item(r: Rollout, claim: Callable[[Rollout], Any]) -> tuple:
    """A row as ``toploc_check`` takes it (``claim``: ``sampling_claimer``'s); a multi-turn row (environment tokens in its
    completion) with its mask as a fifth element, so its proofs and claim are checked at the model's tokens only."""
    item = (list(r.prompt_ids), list(r.completion_ids), list(r.proofs), claim(r))
    mask = r.model_mask()
    return item if all(mask) else (*item, mask)


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
    """Cheapest first: a submission that fails a cheap check never costs a forward pass or a sandbox run."""
    return [
        ("schema", check_schema),  # row identities, token ids, the contract's temperature and token limit
        ("seed", check_seed),
        ("tasks", check_tasks),  # the seeded assignment
        ("policy", check_policy),  # the async window
        ("proofs", check_proofs),  # TOPLOC proof shape: counts, sizes, headers
        ("replay", check_replay),  # multi-turn rows: the environment's turns, re-run here (no model)
        ("logprobs", logprob_check(cfg)),  # the one forward: every row when TOPLOC runs, else a few
        ("toploc", toploc_check(cfg)),  # the proofs against that forward's states
        ("sampling", sampling_check(cfg)),  # the claims against its logits
        ("rewards", check_rewards),  # env verifiers, the code sandbox: last
    ]
