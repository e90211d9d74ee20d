"""The validator: re-checks every pending submission and posts a signed verdict with reasons.

The checks live in ``swarmrl.protocol.checks`` (run cheapest first; see there for the order and for what a
finding, a skip and an internal error are). ``judge`` runs them over one file; ``Validator`` polls the
orchestrator, judges and posts verdicts.

Internal errors never slash. When a check raises (our bug, a misconfigured check, a policy version whose
model cannot be loaded, OOM, a sandbox that did not start), when the downloaded file does not match its
recorded hash, or when the download fails, no verdict is posted: the submission stays pending and is judged
again after a backoff (``internal_error_backoff_s``, doubling up to ``internal_error_backoff_max_s``), at most
``internal_error_retries`` more times; after that it is left pending for the operator (or another validator)
and logged as such. Each internal error is logged with its traceback, written to the metrics JSONL
(``event = "internal_error"``) and counted in ``validator_internal_errors`` (every metrics row, the log, the
summary ``swarmrl validator run`` prints, ``Validator.health()``).

Sampled validation (``swarmrl.protocol.spot_checks``; off at ``full_check_rate = 1``): the model checks run before
the verdict on a node's first submissions and on a secret random share of the rest; a sampled-out submission
passing the cheap checks is accepted and may be queued for an audit (``audit_once``, run when nothing is
pending), whose finding is posted as a challenge of the accepted submission.

A configuration whose checks cannot work (a ``module:function`` that does not import or does not take the
arguments it is called with, ``require_proofs`` without a model) is refused at startup
(``config_problems``, used by the CLI).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import secrets
import tempfile
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmrl.contract import PROOF_GEOMETRY
from swarmrl.models import load_tokenizer
from swarmrl.policy.holder import PolicyHolder
from swarmrl.policy.sources import TemplatePolicySource
from swarmrl.protocol.check_config import configured_functions_problems, import_dotted
from swarmrl.protocol.checks import (  # noqa: F401  (re-exported: the checks' historical home)
    Check,
    CheckContext,
    SkipCheck,
    check_policy,
    check_proofs,
    check_rewards,
    check_schema,
    check_seed,
    check_tasks,
    default_checks,
    lazy_check,
    logprob_check,
    sampling_check,
    toploc_check,
)
from swarmrl.protocol.client import ApiError, ValidatorClient
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.schemas import CheckResult, InlineFile, PendingSubmission, VerdictRequest
from swarmrl.protocol.spot_checks import SAMPLED_CHECKS, draw
from swarmrl.rollouts.wire import RolloutError, read_rollouts
from swarmrl.toploc.thresholds_file import (
    CALIBRATION_FILE,
    CalibrationError,
    ToplocSettings,
    read_calibration,
    toploc_settings,
)
from swarmrl.utils.metrics import MetricsWriter
from swarmrl.utils.threads import set_role_threads

log = logging.getLogger("swarmrl.protocol.validator")

PENDING_PAGE = 16  # submissions asked for per poll, plus the ones waiting for a retry (the API allows 256)


@dataclass
class Verdict:
    accepted: bool
    reason: str
    checks: list[CheckResult]
    seconds: dict[str, float] = field(default_factory=dict)  # per check (and "read")
    internal_error: str | None = None  # set: no verdict; the validator could not judge (never posted)


def judge(rows_path: Path, item: PendingSubmission, cfg: ValidatorConfig, checks: list[tuple[str, Check]],
          tokenizer: Any = None, model_loader: Callable[[int], Any] | None = None,
          vocab_size: int | None = None, settings_loader: Callable[[int], ToplocSettings] | None = None,
          sampled_out: str = "") -> Verdict:
    """Run ``checks`` in order over one file: the first finding rejects; a check that raises anything but
    ``SkipCheck`` ends the judgement with ``internal_error`` set (no verdict). ``sampled_out`` (a reason): the
    model checks (``SAMPLED_CHECKS``) are not run now, recorded as skipped with that reason; every other check is."""
    results: list[CheckResult] = []
    secs: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        rows = read_rollouts(rows_path)
    except RolloutError as e:
        return Verdict(False, f"schema: {e}", [CheckResult(name="schema", ok=False, reason=str(e))])
    except Exception as e:  # noqa: BLE001 - reading is ours (disk, memory): not the node's fault
        log.exception("reading %s failed", rows_path)
        return Verdict(False, f"read: internal error: {type(e).__name__}: {e}", [], internal_error=_describe("read", e))
    secs["read"] = time.perf_counter() - t0
    ctx = CheckContext(rows=rows, item=item, cfg=cfg, tokenizer=tokenizer, model_loader=model_loader,
                       vocab_size=vocab_size, settings_loader=settings_loader)
    for name, check in checks:
        if sampled_out and name in SAMPLED_CHECKS:
            results.append(CheckResult(name=name, ok=True, reason=f"skipped: {sampled_out}", skipped=True))
            continue
        t0 = time.perf_counter()
        try:
            ok, reason = check(ctx)
        except SkipCheck as e:
            results.append(CheckResult(name=name, ok=True, reason=f"skipped: {e}", skipped=True))
            if name == "toploc" and cfg.require_proofs:  # the proofs cannot be checked here: our problem
                why = f"toploc: required (require_proofs) but skipped: {e}"
                return Verdict(False, why, results, secs, internal_error=why)
            continue
        except Exception as e:  # noqa: BLE001 - a check that raises is our failure, never the node's
            log.exception("check %s raised on submission %d (internal error, no verdict)",
                          name, item.submission.submission_id)
            return Verdict(False, f"{name}: internal error: {type(e).__name__}: {e}"[:4000], results, secs,
                           internal_error=_describe(name, e))
        finally:
            secs[name] = time.perf_counter() - t0
        results.append(CheckResult(name=name, ok=ok, reason=reason[:1000]))
        if not ok:
            return Verdict(False, f"{name}: {reason}"[:4000], results, secs)
    return Verdict(True, f"cheap checks passed ({sampled_out})" if sampled_out else "all checks passed", results, secs)


def _describe(where: str, e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    at = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return f"{where}: {type(e).__name__}: {e}{at}"[:2000]


def contract_mismatch(cfg: ValidatorConfig, item: PendingSubmission) -> str | None:
    """Why this validator cannot judge ``item`` by its own rules (``cfg.contract``, when set): the assignment
    carries a different contract (task excepted: an assignment names its own). None when they agree."""
    if cfg.contract is None:  # the orchestrator's rules, but proofs are checked with this validator's geometry
        if item.assignment.contract.proof != PROOF_GEOMETRY:
            return (f"contract mismatch: the assignment's proof geometry {item.assignment.contract.proof!r} is not "
                    f"this validator's {PROOF_GEOMETRY!r}")
        return None
    mine = cfg.contract.model_dump(exclude={"task"})
    theirs = item.assignment.contract.model_dump(exclude={"task"})
    diff = sorted(k for k in mine if mine[k] != theirs.get(k))
    if not diff:
        return None
    return ("contract mismatch: the assignment's " + ", ".join(f"{k}={theirs.get(k)!r}" for k in diff)
            + " differ from this validator's " + ", ".join(f"{k}={mine[k]!r}" for k in diff))


# what every verdict of a validator without a model says (``cheap_checks_only``): it must not pass unchecked work
# off as checked
MODEL_CHECKS_NOT_RUN = ("model checks not run: cheap_checks_only = true, no model; rewards, environment replays, "
                        "logprobs, TOPLOC proofs and sampling are unchecked")


def _skip_without_model(ctx: CheckContext) -> tuple[bool, str]:
    raise SkipCheck(MODEL_CHECKS_NOT_RUN)


def config_problems(cfg: ValidatorConfig, needs_model: bool = True) -> list[str]:
    """Why this configuration cannot judge (the CLI and ``Validator`` refuse to start with them); [] when it can.
    ``needs_model=False``: the checks chosen run no model (``SAMPLED_CHECKS``), so no model_dir is no problem."""
    problems = configured_functions_problems(cfg)
    if needs_model and not cfg.model_dir and not cfg.cheap_checks_only:
        problems.append("no model_dir: without the policy's model the reward, logprob, TOPLOC and sampling checks "
                        "cannot run, and a validator that skips them accepts forged work; set model_dir (or "
                        "--model-dir) to the policy's HF model dir, or cheap_checks_only = true to run the cheap "
                        "checks alone (every verdict then says the model checks were not run)")
    if cfg.cheap_checks_only and (cfg.model_dir or cfg.model_dir_template):
        problems.append("cheap_checks_only = true with a model (model_dir / model_dir_template): the model checks "
                        "would not run; drop cheap_checks_only or the model")
    geometry = cfg.proof_geometry
    if cfg.model_dir and not Path(cfg.model_dir).is_dir():
        problems.append(f"model_dir = {cfg.model_dir!r} is not a directory")
    elif cfg.model_dir and cfg.toploc_calibration and cfg.toploc_check:
        try:
            if read_calibration(cfg.model_dir, geometry.chunk, geometry.k) is not None:
                fn = import_dotted(cfg.toploc_check)
                inspect.signature(fn).bind(None, [], batch_size=1, thresholds=None)
        except CalibrationError as e:
            problems.append(f"TOPLOC calibration: {e} (fix or remove it, or set toploc_calibration = false)")
        except TypeError as e:
            problems.append(f"toploc_check = {cfg.toploc_check!r} cannot take the thresholds of {cfg.model_dir}'s "
                            f"calibration file ({e}); set toploc_calibration = false or use a function that does")
        except (ImportError, ValueError):  # reported above / no signature to read
            pass
    return problems


def vocab_bound(tokenizer: Any, model_dir: str) -> int | None:
    """Token ids a node may use: below the larger of the tokenizer's size and the model's ``vocab_size``
    (models pad their embedding past the tokenizer); None when neither is known."""
    n = len(tokenizer) if tokenizer is not None else None
    try:
        v = json.loads((Path(model_dir) / "config.json").read_text()).get("vocab_size") if model_dir else None
    except (OSError, ValueError):
        v = None
    if isinstance(v, int) and v > 0:
        n = max(n or 0, v)
    return n


@dataclass
class _Retry:
    attempts: int = 0
    next_at: float = 0.0
    error: str = ""


class Validator:
    """Polls the orchestrator for pending submissions, judges them, posts signed verdicts."""

    def __init__(self, cfg: ValidatorConfig, client: Any = None, checks: list[tuple[str, Check]] | None = None,
                 tokenizer: Any = None, model_loader: Callable[[int], Any] | None = None) -> None:
        """``checks``, ``tokenizer`` and ``model_loader`` (policy version -> the model the model checks run) replace
        the configured ones (``default_checks``, ``cfg.model_dir``'s tokenizer and versions)."""
        self.cfg = cfg
        set_role_threads(cfg.threads)
        # refused here as the CLI refuses them: a validator that cannot run its model checks would otherwise pass
        # every skipped one off as "all checks passed". Checks handed in that run no model need none.
        needs_model = model_loader is None and (checks is None or any(n in SAMPLED_CHECKS for n, _ in checks))
        if problems := config_problems(cfg, needs_model=needs_model):
            raise ValueError("validator config: " + "; ".join(problems))
        self.client = client or ValidatorClient(cfg.orchestrator, cfg.key, timeout=cfg.timeout_s)
        self.checks = checks if checks is not None else default_checks(cfg)
        # cheap checks only: the reward check is not run either (a tokenizer given here would let it run, and the
        # verdicts would say it did not); the other model checks are skipped by judge (``_judge_item``)
        self._not_run = MODEL_CHECKS_NOT_RUN if cfg.cheap_checks_only else ""
        if cfg.cheap_checks_only:
            self.checks = [(n, _skip_without_model if n in ("rewards", "replay") else c) for n, c in self.checks]
            log.warning("cheap_checks_only: %s; every verdict says so", MODEL_CHECKS_NOT_RUN)
        self.tokenizer = tokenizer
        if self.tokenizer is None and cfg.model_dir:
            self.tokenizer = load_tokenizer(cfg.model_dir)
        if self.tokenizer is None and not cfg.cheap_checks_only:
            log.warning("no model_dir: completions cannot be decoded, so rewards are NOT re-checked")
        self.vocab_size = vocab_bound(self.tokenizer, cfg.model_dir)
        template = cfg.model_dir_template or cfg.model_dir
        self._source = TemplatePolicySource(template) if template else None
        self._holder = None
        self.load_model: Callable[[int], Any] = model_loader or self._load_policy
        self._settings: dict[str, tuple[object, ToplocSettings]] = {}  # model dir -> (file's stat, its settings)
        self.work = Path(cfg.work_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.judged = 0
        self.internal_errors = 0  # health counter: judgements that failed on our side (none posted)
        self._retries: dict[int, _Retry] = {}  # submission id -> its retry state after internal errors
        self._listed, self._waited = 0, True  # the last listing's size, and whether its long poll waited
        self._clock: Callable[[], float] = time.monotonic
        self.metrics = MetricsWriter(self.work / "metrics.jsonl")
        # sampled validation (swarmrl.protocol.spot_checks)
        self._sample_key = bytes.fromhex(cfg.sample_key) if cfg.sample_key else secrets.token_bytes(32)
        self._seen: Counter[str] = Counter()  # node -> verdicts posted on its submissions (by this process)
        self._audits: deque[PendingSubmission] = deque()  # accepted after the cheap checks, to be judged in full
        self.sampling = {"full": 0, "sampled_out": 0, "audited": 0, "challenged": 0, "audit_dropped": 0,
                         "audit_errors": 0}

    def _load_policy(self, policy_version: int) -> Any:
        """The policy that generated a row, held by one ``PolicyHolder`` (swapped in place; the last two versions'
        weights stay in memory): ``model_dir_template`` formatted with the version (the trainer's policy dir
        or a SHARDCAST download dir), else ``model_dir`` for every version; a LoRA version is merged onto
        ``model_dir``, the base (the holder refuses an adapter made for another base). A version that cannot be loaded
        raises (``PolicyUnavailable``): an internal error, retried later."""
        if self._source is None:
            raise SkipCheck("no model_dir configured")
        if self._holder is None:
            # the base: model_dir (the run's initial model; a LoRA version is applied onto it), else the version's
            base = self.cfg.model_dir or self._source.fetch(policy_version)
            self._holder = PolicyHolder(self._source, base, keep_states=2)
        return self._holder.load(policy_version)

    def _toploc_settings(self, policy_version: int) -> ToplocSettings:
        """TOPLOC thresholds for one policy version: ``toploc_thresholds`` / ``sampling_thresholds`` > the version's
        model dir's calibration file (cached until the file changes) > defaults. An unusable calibration file
        raises ``CalibrationError``: an internal error (retried), never the node's fault."""
        cfg = self.cfg
        geometry = cfg.proof_geometry
        if self._source is None or not cfg.toploc_calibration:
            return toploc_settings(None, cfg.toploc_thresholds, cfg.sampling_thresholds)
        d = self._source.fetch(policy_version)
        try:
            st = os.stat(d / CALIBRATION_FILE)
            key: object = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = None
        hit = self._settings.get(str(d))
        if hit is not None and hit[0] == key:
            return hit[1]
        settings = toploc_settings(d, cfg.toploc_thresholds, cfg.sampling_thresholds, chunk=geometry.chunk, k=geometry.k)
        if len(self._settings) >= 64:
            self._settings.clear()
        self._settings[str(d)] = (key, settings)
        log.info("policy v%d: TOPLOC thresholds from %s: %s", policy_version, settings.source,
                 settings.thresholds.model_dump() if settings.thresholds else "defaults")
        return settings

    @property
    def left_pending(self) -> list[int]:
        """Submissions given up on after ``internal_error_retries`` retries (pending, for the operator)."""
        return sorted(s for s, r in self._retries.items() if r.attempts > self.cfg.internal_error_retries)

    def health(self) -> dict[str, Any]:
        return {"judged": self.judged, "validator_internal_errors": self.internal_errors,
                "retrying": sorted(s for s in self._retries if s not in set(self.left_pending)),
                "left_pending": self.left_pending, "audits_waiting": len(self._audits), **self.sampling}

    def sampled_out(self, item: PendingSubmission) -> str:
        """Why this submission's model checks are NOT run before its verdict ("" = they are): a node's first
        ``full_check_first`` submissions are always checked in full, the others with probability
        ``full_check_rate`` by a draw keyed with this validator's secret."""
        cfg, sub = self.cfg, item.submission
        if cfg.full_check_rate >= 1.0 or self._seen[sub.node_id] < cfg.full_check_first:
            return ""
        if draw(self._sample_key, "full", sub.submission_id, sub.sha256) < cfg.full_check_rate:
            return ""
        return f"sampled out (full_check_rate {cfg.full_check_rate:g})"

    def _judge_item(self, item: PendingSubmission, sampled_out: str = "",
                    inline: dict[int, InlineFile] | None = None) -> Verdict:
        sid = item.submission.submission_id
        why = contract_mismatch(self.cfg, item)
        if why is not None:  # the orchestrator's rules are not this validator's: an operator's fault, not the node's
            return Verdict(False, why, [], internal_error=why)
        try:
            with tempfile.TemporaryDirectory(dir=self.work) as d:
                path = Path(d) / "rollouts.parquet"
                sha = self.client.fetch_file(sid, path, inline)
                if sha != item.submission.sha256:
                    # the orchestrator checked the node's signed hash on upload: a different file now is a
                    # storage or transfer fault on our side of the wire, not the node's
                    why = f"download: the file's sha256 {sha[:16]}.. is not the recorded {item.submission.sha256[:16]}.."
                    return Verdict(False, why, [], internal_error=why)
                v = judge(path, item, self.cfg, self.checks, self.tokenizer, self.load_model, self.vocab_size,
                          self._toploc_settings, sampled_out=sampled_out or self._not_run)
                if self._not_run and not v.accepted and v.internal_error is None:  # accepted: judge says it
                    v.reason = f"{v.reason[:3800]} ({self._not_run})"
                return v
        except Exception as e:  # noqa: BLE001 - download or disk trouble: ours
            log.exception("submission %d: could not be judged", sid)
            return Verdict(False, f"internal error: {e}", [], internal_error=_describe("download", e))

    def _defer(self, item: PendingSubmission, v: Verdict, seconds: float) -> None:
        sid = item.submission.submission_id
        self.internal_errors += 1
        r = self._retries.setdefault(sid, _Retry())
        r.attempts += 1
        r.error = v.internal_error or v.reason
        gave_up = r.attempts > self.cfg.internal_error_retries
        delay = min(self.cfg.internal_error_backoff_s * 2 ** (r.attempts - 1), self.cfg.internal_error_backoff_max_s)
        r.next_at = self._clock() + delay
        self.metrics.write(event="internal_error", submission_id=sid, node_id=item.submission.node_id,
                           step=item.submission.step, error=r.error[:1000], attempt=r.attempts,
                           retry_in_s=None if gave_up else round(delay, 3), left_pending=gave_up,
                           seconds=seconds, validator_internal_errors=self.internal_errors)
        if gave_up:
            log.error("submission %d: INTERNAL ERROR %d time(s), giving up; it stays pending, nothing posted "
                      "(validator_internal_errors=%d): %s", sid, r.attempts, self.internal_errors, r.error)
        else:
            log.error("submission %d: INTERNAL ERROR (attempt %d), no verdict posted, retry in %.1f s "
                      "(validator_internal_errors=%d): %s", sid, r.attempts, delay, self.internal_errors, r.error)

    def run_once(self, wait: float = 0.0) -> list[tuple[int, Verdict]]:
        """Judge the pending submissions listed (with ``wait``: an empty listing waits that long for an upload)."""
        out = []
        limit = min(256, PENDING_PAGE + len(self._retries))
        t0 = time.monotonic()
        got = self.client.pending(limit=limit, wait=wait, inline=limit)
        items = got.items
        inline = {f.submission_id: f for f in got.files}
        self._listed = len(items)
        # an empty answer well before ``wait``: an orchestrator that does not wait (or a race): do not spin
        self._waited = not wait or bool(items) or time.monotonic() - t0 >= 0.5 * wait
        if len(items) < limit:  # every pending submission is listed: forget retries of ones decided elsewhere
            listed = {it.submission.submission_id for it in items}
            self._retries = {sid: r for sid, r in self._retries.items() if sid in listed}
        for item in items:
            sid = item.submission.submission_id
            retry = self._retries.get(sid)
            if retry is not None and (retry.attempts > self.cfg.internal_error_retries
                                      or self._clock() < retry.next_at):
                continue
            t0 = time.perf_counter()
            why = self.sampled_out(item)
            v = self._judge_item(item, why, inline)
            if v.internal_error is not None:
                self._defer(item, v, time.perf_counter() - t0)
                continue
            try:
                self.client.verdict(VerdictRequest(submission_id=sid, accepted=v.accepted, reason=v.reason,
                                                   checks=v.checks))
            except ApiError as e:
                if e.status != 409:  # 409: decided meanwhile (another validator, or its node was ejected)
                    raise
                log.info("submission %d already decided: %s", sid, e.detail)
                self._retries.pop(sid, None)
                continue
            self._retries.pop(sid, None)
            self._seen[item.submission.node_id] += 1
            self.sampling["sampled_out" if why else "full"] += 1
            audit = bool(why) and v.accepted and self._queue_audit(item)
            self.metrics.write(event="verdict", submission_id=sid, node_id=item.submission.node_id,
                               step=item.submission.step, rows=item.submission.n_rows, accepted=v.accepted,
                               reason=v.reason[:300], seconds=time.perf_counter() - t0,
                               check_s={k: round(x, 4) for k, x in v.seconds.items()},
                               skipped=[c.name for c in v.checks if c.skipped], full=not why, audit=audit,
                               validator_internal_errors=self.internal_errors)
            log.info("submission %d from %s: %s (%s)", sid, item.submission.node_id,
                     "accepted" if v.accepted else "REJECTED", v.reason)
            self.judged += 1
            out.append((sid, v))
        return out

    def _queue_audit(self, item: PendingSubmission) -> bool:
        """After a sampled-out acceptance: queue a full judgement with probability ``audit_rate`` (its own draw)."""
        sub = item.submission
        if self.cfg.audit_queue == 0 or draw(self._sample_key, "audit", sub.submission_id, sub.sha256) >= self.cfg.audit_rate:
            return False
        if len(self._audits) >= self.cfg.audit_queue:
            old = self._audits.popleft()
            self.sampling["audit_dropped"] += 1
            log.warning("audit queue full (%d): submission %d dropped unaudited", self.cfg.audit_queue,
                        old.submission.submission_id)
        self._audits.append(item)
        return True

    def audit_once(self) -> list[tuple[int, Verdict]]:
        """Judge the oldest queued audit in full (every check). A finding is posted as a challenge of the accepted
        submission (slash, revoke the node's credits in their window, eject); 409 means its window closed or it was
        rejected meanwhile. An internal error drops the audit (counted in ``audit_errors``; e.g. its policy version
        is gone): nothing is posted against the node."""
        if not self._audits:
            return []
        item = self._audits.popleft()
        sid = item.submission.submission_id
        t0 = time.perf_counter()
        v = self._judge_item(item)
        self.sampling["audited"] += 1
        if v.internal_error is not None:
            self.sampling["audit_errors"] += 1
            self.internal_errors += 1
            log.error("audit of submission %d: INTERNAL ERROR, dropped (validator_internal_errors=%d): %s", sid,
                      self.internal_errors, v.internal_error)
            self.metrics.write(event="internal_error", submission_id=sid, node_id=item.submission.node_id,
                               step=item.submission.step, error=v.internal_error[:1000], audit=True,
                               validator_internal_errors=self.internal_errors)
            return []
        posted = False
        if not v.accepted:
            try:
                self.client.verdict(VerdictRequest(submission_id=sid, accepted=False, reason=f"audit: {v.reason}",
                                                   checks=v.checks))
                posted = True
                self.sampling["challenged"] += 1
                log.warning("audit of accepted submission %d from %s: CHALLENGED (%s)", sid,
                            item.submission.node_id, v.reason)
            except ApiError as e:
                if e.status != 409:
                    raise
                log.info("audit of submission %d found %s, but it cannot be challenged: %s", sid, v.reason, e.detail)
        self.metrics.write(event="audit", submission_id=sid, node_id=item.submission.node_id,
                           step=item.submission.step, accepted=v.accepted, challenged=posted, reason=v.reason[:300],
                           seconds=time.perf_counter() - t0, check_s={k: round(x, 4) for k, x in v.seconds.items()},
                           validator_internal_errors=self.internal_errors)
        return [(sid, v)]

    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        batches = 0
        wait = 0.0  # the next listing's long poll: after a round that found nothing pending
        while not stop.is_set():
            failed = False
            try:
                done = self.run_once(wait)
                if not done:  # nothing pending: audit accepted, sampled-out work
                    done = self.audit_once()
            except Exception as e:  # noqa: BLE001 - orchestrator down or hiccup: keep polling
                log.warning("validator poll failed: %s", e)
                done, failed = [], True
            batches += 1
            if self.cfg.max_batches and batches >= self.cfg.max_batches:
                return
            if done:
                wait = 0.0
            elif self.cfg.long_poll_s and not failed and self._listed == 0 and self._waited:
                wait = self.cfg.long_poll_s  # the orchestrator answers when an upload comes
            else:  # deferred retries only, long polls off, a failure, or an orchestrator that did not wait
                wait = 0.0
                stop.wait(self.cfg.poll_interval_s)
