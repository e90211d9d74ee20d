"""Settings for the orchestrator, the validator and nodes (StrictModels: unknown keys are errors)."""

from __future__ import annotations

from pydantic import Field, field_validator

from swarmrl.config import StrictModel
from swarmrl.envs.config import TaskConfig


def _check_keys(keys: list[str]) -> list[str]:
    out = []
    for k in keys:
        k = k.strip().lower()
        if len(k) != 64 or any(c not in "0123456789abcdef" for c in k):
            raise ValueError(f"{k!r} is not a 64-hex-char Ed25519 public key")
        out.append(k)
    return out


class OrchestratorConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)  # >1: that many server processes (PostgreSQL only)
    database_url: str = ""  # empty: SQLite file <data_dir>/orchestrator.db; else e.g. postgresql+psycopg2://...
    data_dir: str = "runs/orchestrator"  # content-addressed store lives in <data_dir>/store
    run_secret: str = "change-me"  # mixed into task seeds; validators need it to re-derive assignments
    validator_keys: list[str] = Field(default_factory=list)  # public keys (hex) allowed to post verdicts
    trainer_keys: list[str] = Field(default_factory=list)  # public keys (hex) allowed to advance steps
    # requests
    max_clock_skew_s: float = Field(60.0, gt=0)
    max_json_bytes: int = Field(1 << 20, gt=0)
    rate_limit_per_s: float = Field(20.0, gt=0)  # per key, token bucket
    rate_limit_burst: int = Field(40, ge=1)
    # membership
    heartbeat_interval_s: float = Field(10.0, gt=0)
    dead_after_missed: int = Field(3, ge=1)
    sweep_interval_s: float = Field(1.0, gt=0)
    min_stake: float = Field(100.0, ge=0)
    # assignments
    task: TaskConfig = Field(default_factory=TaskConfig)
    tasks_per_node: int = Field(8, ge=1)
    group_size: int = Field(4, ge=1)
    async_window: int = Field(2, ge=0)  # accepted policy versions: [step - async_window, step]
    budget_tiers: list[int] = Field(default_factory=lambda: [64, 128, 256])  # thinking budgets, ascending
    target_step_time_s: float = Field(60.0, gt=0)  # a node's budget tier must fit this time at its throughput
    # how a budget reaches the model and the reward (sent with every assignment; the validator re-derives both):
    # the prompt is budget_prompt_format with {target} and {prompt}; reward = task_reward - penalty * |target - len|
    budget_prompt_format: str = "[{target}]{prompt}"
    budget_penalty: float = Field(0.02, ge=0)
    reassign_per_heartbeat: int = Field(1, ge=0)
    # demand-driven assignment (swarm RL): > 0 hands a node a new assignment whenever it holds none open, for
    # the lowest step in [step, step + lookahead] whose usable groups (pending + accepted submissions, plus
    # tasks_per_node per open assignment) are below groups_per_step * overassign. 0: one per node per step.
    groups_per_step: int = Field(0, ge=0)
    overassign: float = Field(1.0, ge=1.0)
    lookahead: int = Field(0, ge=0)  # capped by async_window: a step is never served with a policy older than that
    count_tied_groups: bool = False  # True when the trainer keeps groups with equal rewards (filter_ties = false)
    last_step: int = Field(-1, ge=-1)  # no assignments beyond this step (-1: unbounded)
    # demand mode: open work older than this goes back to the pool (0: never), and so does an assignment whose
    # upload was refused as invalid or oversized, so a stalling or broken node cannot starve a step
    assignment_timeout_s: float = Field(0.0, ge=0)
    shardcast_relays: list[str] = Field(default_factory=list)
    # uploads
    max_upload_bytes: int = Field(64 << 20, gt=0)
    max_rows: int = Field(65_536, gt=0)
    # ledger
    credit_per_sample: float = Field(1.0, ge=0)
    challenge_window_s: float = Field(24 * 3600.0, ge=0)
    slash_fraction: float = Field(0.5, ge=0, le=1)
    optimistic: bool = False  # trainer may use pending submissions before a verdict
    # metrics (JSONL): "" = <data_dir>/metrics.jsonl; a snapshot row every metrics_interval_s plus verdict events
    metrics_path: str = ""
    metrics_interval_s: float = Field(10.0, gt=0)

    @field_validator("validator_keys", "trainer_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        return _check_keys(v)

    @field_validator("budget_prompt_format")
    @classmethod
    def _fmt(cls, v: str) -> str:
        from swarmrl.rl.budget import check_prompt_format

        return check_prompt_format(v)

    @field_validator("budget_tiers")
    @classmethod
    def _tiers(cls, v: list[int]) -> list[int]:
        if any(t <= 0 for t in v) or v != sorted(v):
            raise ValueError("budget_tiers must be positive and ascending")
        return v


class ValidatorConfig(StrictModel):
    orchestrator: str = "http://127.0.0.1:8700"
    key: str = ""  # path to the validator's Ed25519 PEM key (its public key must be in validator_keys)
    model_dir: str = ""  # HF model dir of the policy in use: its tokenizer decodes completions
    run_secret: str = "change-me"  # must match the orchestrator's (re-derives task seeds)
    poll_interval_s: float = Field(2.0, gt=0)
    work_dir: str = "runs/validator"
    reward_tolerance: float = Field(1e-4, ge=0)
    model_dir_template: str = ""  # e.g. "runs/ckpt/v{policy_version}": the policy per version for TOPLOC
    # module:function(model, items, batch_size=, [sampling_thresholds=]) -> one result per item, called once per
    # policy version in a file; skipped (logged) when absent
    toploc_check: str = "swarmrl.toploc.rollout:verify_rollouts"
    toploc_batch_size: int = Field(64, ge=1)  # rows per prefill
    sampling_claim: str = "swarmrl.toploc.rollout:claim_from_rollout"  # row -> claim, checked in the TOPLOC prefill
    sampling_check: str = ""  # optional separate module:function(model, row) -> (ok, reason) | .passed/.reason
    logprob_rows: int = Field(4, ge=0)  # rows per submission whose logprobs are recomputed (0: off; needs a model)
    logprob_tolerance: float = Field(1e-3, gt=0)  # max abs difference per token
    # overrides of swarmrl.toploc SamplingThresholds passed to the TOPLOC check (e.g. {min_token_logprob = -30}):
    # a slashing decision needs a per-token false-positive bound far below 1/tokens-judged
    sampling_thresholds: dict[str, float | int] = Field(default_factory=dict)
    # Policy check: also reject work for a step older than the window at VERDICT time. Off by default:
    # a validator lagging behind the trainer would slash honest nodes for its own delay, and late
    # work is harmless (the trainer never uses it).
    reject_late_steps: bool = False
    require_proofs: bool = False  # when true, a skipped TOPLOC check rejects instead of passing
    max_batches: int = Field(0, ge=0)  # 0: run forever
    timeout_s: float = Field(30.0, gt=0)
    threads: int = Field(0, ge=0)  # torch threads (0: torch's default, all cores)


class NodeConfig(StrictModel):
    orchestrator: str = "http://127.0.0.1:8700"
    key: str = ""
    stake: float = Field(100.0, ge=0)
    throughput: float = Field(0.0, ge=0)  # generation tokens/s as measured by the worker (sets thinking budgets)
    timeout_s: float = Field(30.0, gt=0)
