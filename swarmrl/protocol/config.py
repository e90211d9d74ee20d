"""Settings for the orchestrator, the validator and nodes (StrictModels: unknown keys are errors)."""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator

from swarmrl.config import StrictModel, refuse_moved
from swarmrl.contract import PROOF_GEOMETRY, ProofGeometry, RLContract
from swarmrl.rollouts.limits import RolloutLimits
from swarmrl.utils.keys import public_key_problem

DEFAULT_RUN_SECRET = "change-me"

# the upload limits that were fields of OrchestratorConfig, now its [rollout_limits] section (RolloutLimits, declared
# once for every reader of rollout files): an old config is told where each went
MOVED_TO_ROLLOUT_LIMITS = {"max_upload_bytes": "rollout_limits.max_bytes",
                           **{k: f"rollout_limits.{k}" for k in RolloutLimits.model_fields if k != "max_bytes"}}


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a name or address to listen on or connect to) stays on this machine."""
    h = (host or "").strip().strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _check_secret(secret: str, where: str | None, what: str) -> str:
    """The shipped default run secret is public (anyone could derive every task seed and pick easy work): refused
    unless everything stays on this machine."""
    if where is not None and not is_loopback(where) and secret in ("", DEFAULT_RUN_SECRET):
        raise ValueError(f"the default run secret {secret!r} is public, and {what} {where!r}, not a loopback "
                         "address: set run_secret to a secret of your own (e.g. the output of `python -c "
                         "'import secrets; print(secrets.token_hex(16))'`), the same for the orchestrator and its "
                         "validators")
    return secret


def _check_keys(keys: list[str]) -> list[str]:
    out = []
    for k in keys:
        k = k.strip().lower()
        if len(k) != 64 or any(c not in "0123456789abcdef" for c in k):
            raise ValueError(f"{k!r} is not a 64-hex-char Ed25519 public key")
        why = public_key_problem(bytes.fromhex(k))
        if why is not None:
            raise ValueError(f"{k!r}: {why}")
        out.append(k)
    return out


class OrchestratorConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)  # >1: that many server processes (PostgreSQL only)
    database_url: str = ""  # empty: SQLite file <data_dir>/orchestrator.db; else e.g. postgresql+psycopg2://...
    data_dir: str = "runs/orchestrator"  # content-addressed store lives in <data_dir>/store
    # the key that signs the run's description (GET /v1/run; joining nodes pin it): "" = <data_dir>/orchestrator.pem,
    # made on first start
    key: str = ""
    run_secret: str = Field(DEFAULT_RUN_SECRET, validate_default=True)  # mixed into task seeds; validators need it; the default only on loopback
    validator_keys: list[str] = Field(default_factory=list)  # public keys (hex) allowed to post verdicts
    trainer_keys: list[str] = Field(default_factory=list)  # public keys (hex) allowed to advance steps
    # requests
    max_clock_skew_s: float = Field(60.0, gt=0)
    max_json_bytes: int = Field(1 << 20, gt=0)
    rate_limit_per_s: float = Field(20.0, gt=0)  # per key, token bucket
    rate_limit_burst: int = Field(40, ge=1)
    # membership
    heartbeat_interval_s: float = Field(10.0, gt=0)
    # a node's heartbeats: at most this many per heartbeat_interval_s on average (a token bucket of this size); beyond,
    # 429 with Retry-After. Our nodes beat once an interval, again at once only after work or a held poll's answer
    heartbeats_per_interval: int = Field(10, ge=2, le=10_000)
    dead_after_missed: int = Field(3, ge=1)
    sweep_interval_s: float = Field(1.0, gt=0)
    # heartbeat hot path (one server process only): steady-state beats answered from an in-memory mirror, their
    # writes group-committed before the reply; beyond these bounds the orchestrator answers 503 + Retry-After
    fast_heartbeats: bool = True
    max_heartbeat_queue: int = Field(8192, ge=1)  # beats waiting for their group commit
    max_full_heartbeats: int = Field(64, ge=1)  # beats on the full (database) path at once
    max_nonces: int = Field(2_000_000, ge=1000)  # used nonces remembered in memory until they expire
    min_stake: float = Field(100.0, ge=0)
    # assignments: the run's shared rules (task, group size, staleness window, tie rule, budget, proof geometry)
    contract: RLContract = Field(default_factory=RLContract)
    tasks_per_node: int = Field(8, ge=1)
    # False: this orchestrator runs no RL and hands out no rollout work: its members heartbeat for liveness only
    # (a DiLoCo swarm's orchestrator: swarmrl.diloco.trust.launch)
    rollouts: bool = True
    # a node's budget tier (contract.budget, when enabled) is the largest whose completions fit
    # contract.budget.step_time_s at the node's announced throughput
    reassign_per_heartbeat: int = Field(1, ge=0)
    # demand-driven assignment (swarm RL): > 0 hands a node a new assignment whenever it holds none open, for
    # the lowest step in [step, step + lookahead] whose usable groups (pending + accepted submissions, plus
    # tasks_per_node per open assignment) are below groups_per_step * overassign. 0: one per node per step.
    groups_per_step: int = Field(0, ge=0)
    overassign: float = Field(1.0, ge=1.0)
    lookahead: int = Field(0, ge=0)  # capped by the window: a step is never served with a policy older than async_level
    last_step: int = Field(-1, ge=-1)  # no assignments beyond this step (-1: unbounded)
    # demand mode: open work older than this goes back to the pool (0: never), and so does an assignment whose
    # upload was refused as invalid or oversized, so a stalling or broken node cannot starve a step
    assignment_timeout_s: float = Field(0.0, ge=0)
    shardcast_relays: list[str] = Field(default_factory=list)
    # uploads: hostile ones are bounded once DECODED ([rollout_limits]: the file's bytes as uploaded, rows, tokens,
    # strings, proofs, the parquet footer; swarmrl.rollouts.limits), checked from the parquet metadata and then
    # batch by batch before anything is materialised; a file over one is refused with 413 naming the limit (a
    # malformed one with 422)
    rollout_limits: RolloutLimits = Field(default_factory=RolloutLimits)
    # listings for validators and the trainer (GET /v1/validator/pending, /v1/trainer/accepted with inline=N) carry
    # the files of up to N listed submissions (each at most inline_file_bytes, together at most inline_total_bytes;
    # the others are downloaded as before): one request instead of a listing plus one download per file
    inline_file_bytes: int = Field(1 << 20, ge=0)
    inline_total_bytes: int = Field(8 << 20, ge=0)
    # ledger
    credit_per_sample: float = Field(1.0, ge=0)
    challenge_window_s: float = Field(24 * 3600.0, ge=0)
    slash_fraction: float = Field(0.5, ge=0, le=1)
    # DiLoCo (swarmrl.diloco.trust): credit per accepted pseudo-gradient (a round), locked for challenge_window_s
    diloco_credit_per_round: float = Field(1.0, ge=0)
    optimistic: bool = False  # trainer may use pending submissions before a verdict
    # metrics (JSONL): "" = <data_dir>/metrics.jsonl; a snapshot row every metrics_interval_s plus verdict events
    metrics_path: str = ""
    metrics_interval_s: float = Field(10.0, gt=0)
    # membership and sybils
    # stake is deposited by these keys (POST /v1/ledger/deposits); registration locks at most what was deposited
    stake_authority_keys: list[str] = Field(default_factory=list)
    self_declared_stake: bool = False  # local demos only: registration locks whatever stake a node claims
    register_rate_per_s: float = Field(0.5, gt=0)  # registrations per source address (token bucket)
    register_burst: int = Field(20, ge=1)
    public_rate_per_s: float = Field(20.0, gt=0)  # unsigned GETs (health, nodes, ledgers, submissions) per address
    public_burst: int = Field(100, ge=1)
    # demand mode: the open work of a node silent for this many heartbeat intervals goes back to the pool at the
    # next sweep (its holder may still upload it first); 0: only once the node is dead (dead_after_missed)
    idle_after_missed: int = Field(2, ge=0)
    # connection limits (swarmrl.utils.serving): per source address (IPv6: per /64) and per server process, the
    # latter clipped to the open-files limit; reserved_connections of them only for addresses that made an
    # authenticated request within trusted_ttl_s. A request head must arrive within header_timeout_s (of the
    # connection going idle), its body within body_timeout_s; idle keep-alive connections close after
    # idle_timeout_s.
    max_connections: int = Field(16384, ge=1)
    max_connections_per_ip: int = Field(64, ge=1)
    reserved_connections: int = Field(1024, ge=0)
    trusted_ttl_s: float = Field(600.0, gt=0)
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(120.0, gt=0)
    idle_timeout_s: float = Field(5.0, gt=0)
    backlog: int = Field(4096, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        return refuse_moved(data, MOVED_TO_ROLLOUT_LIMITS, "[rollout_limits]", "[rollout_limits] max_bytes = 67108864")

    @field_validator("validator_keys", "trainer_keys", "stake_authority_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        return _check_keys(v)

    @field_validator("run_secret")
    @classmethod
    def _secret(cls, v: str, info: ValidationInfo) -> str:
        return _check_secret(v, info.data.get("host"), "the orchestrator listens on")

    @model_validator(mode="after")
    def _one_role_per_key(self) -> OrchestratorConfig:
        both = set(self.stake_authority_keys) & (set(self.validator_keys) | set(self.trainer_keys))
        if both:
            raise ValueError(f"a stake authority key may not also be a validator or trainer key: {sorted(both)}")
        return self


class ValidatorConfig(StrictModel):
    orchestrator: str = "http://127.0.0.1:8700"
    key: str = ""  # path to the validator's Ed25519 PEM key (its public key must be in validator_keys)
    model_dir: str = ""  # HF model dir of the policy in use: its tokenizer decodes completions
    # the run's rules as this validator expects them (swarmrl run sets them to the orchestrator's): an assignment
    # under other rules is not judged (left pending: the operator's mistake, not the node's). None: each
    # assignment's own, with proofs checked at the default geometry (contract.proof)
    contract: RLContract | None = None
    # No model: only the cheap checks (schema, seed, tasks, policy, proof shape) can run; rewards, logprobs, TOPLOC
    # and sampling cannot, so a node could forge any of them. Without a model_dir the validator refuses to start
    # unless this says so explicitly; then every verdict states that the model checks were not run.
    cheap_checks_only: bool = False
    run_secret: str = Field(DEFAULT_RUN_SECRET, validate_default=True)  # must match the orchestrator's (re-derives task seeds)
    poll_interval_s: float = Field(2.0, gt=0)
    # with nothing to do, wait for the next upload in one long poll of GET /v1/changes up to this long (it
    # answers as soon as one comes) instead of listing pending work every poll_interval_s (0: plain polling)
    long_poll_s: float = Field(5.0, ge=0, le=10.0)
    work_dir: str = "runs/validator"
    reward_tolerance: float = Field(1e-4, ge=0)
    model_dir_template: str = ""  # e.g. "runs/ckpt/v{policy_version}": the policy per version for TOPLOC
    # module:function(model, items, batch_size=, [sampling_thresholds=]) -> one result per item, called once per
    # policy version in a file; one that does not import or take these arguments is refused at startup
    toploc_check: str = "swarmrl.toploc.rollout:verify_rollouts"
    toploc_batch_size: int = Field(64, ge=1)  # rows per prefill
    sampling_claim: str = "swarmrl.toploc.rollout:claim_from_rollout"  # row -> claim, checked in the TOPLOC prefill
    sampling_check: str = ""  # optional separate module:function(model, row) -> (ok, reason) | .passed/.reason
    logprob_rows: int = Field(4, ge=0)  # rows per submission whose logprobs are recomputed (0: off; needs a model)
    logprob_tolerance: float = Field(1e-3, gt=0)  # max abs difference per token
    # overrides of swarmrl.toploc SamplingThresholds passed to the TOPLOC check (e.g. {min_token_logprob = -30}):
    # a slashing decision needs a per-token false-positive bound far below 1/tokens-judged
    sampling_thresholds: dict[str, float | int] = Field(default_factory=dict)
    # overrides of swarmrl.toploc Thresholds (e.g. {max_exp_mismatches = 4}). Precedence, field by field, for these
    # and sampling_thresholds: the values set here > the calibration file of the policy version's model dir
    # (<dir>/toploc_thresholds.json from `swarmrl toploc calibrate`, read when toploc_calibration) > the defaults
    toploc_thresholds: dict[str, float | int] = Field(default_factory=dict)
    toploc_calibration: bool = True
    # Policy check: also reject work for a step older than the window at VERDICT time. Off by default:
    # a validator lagging behind the trainer would slash honest nodes for its own delay, and late
    # work is harmless (the trainer never uses it).
    reject_late_steps: bool = False
    require_proofs: bool = False  # when true, rows without TOPLOC proofs are rejected (and the check must be able to run)
    # sampled validation (swarmrl.protocol.spot_checks): the model checks (logprobs, toploc, sampling) run before the
    # verdict on a node's first full_check_first submissions and then on a full_check_rate share drawn with a
    # secret the node does not know (sample_key, hex; "" = random per process); the cheap checks always run. A
    # sampled-out submission is audited in full later (idle time, inside its challenge window) with probability
    # audit_rate, and a finding then slashes it as a challenge. 1.0 (the default): every submission in full.
    full_check_rate: float = Field(1.0, ge=0, le=1)
    full_check_first: int = Field(2, ge=0)
    audit_rate: float = Field(1.0, ge=0, le=1)
    audit_queue: int = Field(4096, ge=0)  # audits waiting at most; beyond it the oldest are dropped (counted)
    sample_key: str = Field("", pattern=r"^([0-9a-fA-F]{2})*$")
    max_batches: int = Field(0, ge=0)  # 0: run forever
    timeout_s: float = Field(30.0, gt=0)
    threads: int = Field(1, ge=0)  # torch threads: 1 beside other roles on one host; 0: torch's default (all cores)
    # validator robustness
    # an internal error (a check that raises, a model that cannot be loaded, a download that fails) never
    # rejects: the submission stays pending and is judged again after internal_error_backoff_s, doubling up
    # to internal_error_backoff_max_s, at most internal_error_retries more times; then it is left pending
    internal_error_retries: int = Field(5, ge=0)
    internal_error_backoff_s: float = Field(10.0, ge=0)
    internal_error_backoff_max_s: float = Field(600.0, ge=0)

    @property
    def proof_geometry(self) -> ProofGeometry:
        return self.contract.proof if self.contract is not None else PROOF_GEOMETRY

    @field_validator("run_secret")
    @classmethod
    def _secret(cls, v: str, info: ValidationInfo) -> str:
        url = info.data.get("orchestrator")
        return _check_secret(v, None if url is None else (urlsplit(url).hostname or url), "the orchestrator is at")


class NodeConfig(StrictModel):
    orchestrator: str = "http://127.0.0.1:8700"
    key: str = ""
    stake: float = Field(100.0, ge=0)
    throughput: float = Field(0.0, ge=0)  # generation tokens/s as measured by the worker (sets thinking budgets)
    timeout_s: float = Field(30.0, gt=0)
