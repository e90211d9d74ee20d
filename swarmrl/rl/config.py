"""Configuration of an asynchronous GRPO run (trainer, workers, launcher share it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from swarmrl.config import StrictModel, refuse_moved
from swarmrl.contract import RLContract
from swarmrl.inference.config import InferenceConfig
from swarmrl.inference.params import TokenLimits
from swarmrl.models.adapter_file import DEFAULT_TARGETS, MAX_RANK
from swarmrl.rl.losses.objective import Correction, Normalization, Objective
from swarmrl.rl.losses.registry import get_loss
from swarmrl.rl.tracking import TrackingSection
from swarmrl.utils.serving import is_wildcard

# settings that moved into ``rl.contract`` (every role shares them): an old config is told where they went
MOVED_TO_CONTRACT = {"task": "contract.task", "chat_template": "contract.chat_template",
                     "async_level": "contract.async_level", "group_size": "contract.group_size",
                     "filter_ties": "contract.filter_ties", "budget": "contract.budget",
                     # every sampler uses the assignment's sampling settings; the validator holds rows to them
                     "sampling": "contract.sampling"}


class LossConfig(StrictModel):
    """The objective (``kind``: a registered loss, ``swarmrl.rl.losses.kinds``) and its knobs; a knob left unset
    takes the loss's value (its ``defaults``), then the field's default."""

    kind: str = "grpo"
    clip_eps: float = Field(0.2, gt=0, lt=1)  # the lower clip (and the upper one unless clip_eps_high is set)
    clip_eps_high: float | None = Field(None, gt=0, lt=10)  # the upper clip (DAPO's clip-higher)
    delta: float | None = Field(4.0, gt=1)  # upper bound on the ratio (None: plain PPO clip)
    normalization: Normalization = "token"
    constant: float | None = Field(None, gt=0)  # for normalization = "constant"
    entropy_coef: float = Field(0.0, ge=0)
    kl_coef: float = Field(0.0, ge=0)  # > 0 keeps a frozen reference copy of the initial policy
    use_std: bool = True  # advantages divided by the group std
    overlong_filter: bool = False  # completions cut at max_new_tokens without EOS are left out of the loss
    # off-policy correction against the inference logprobs (swarmrl.rl.losses.importance): none, truncated or masked IS
    correction: Correction = "none"
    correction_level: Literal["token", "sequence"] = "token"
    tis_cap: float = Field(2.0, gt=0)
    mis_band: tuple[float, float] = (0.5, 2.0)

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        get_loss(kind)  # an unknown name is refused with the known ones
        return kind

    @model_validator(mode="after")
    def _kind_defaults(self) -> LossConfig:
        for k, v in get_loss(self.kind).defaults.items():
            if k not in self.model_fields_set:
                self.__dict__[k] = v  # no re-validation loop: the values are the loss's own
        lo, hi = self.mis_band
        if not 0 <= lo < 1 < hi:
            raise ValueError(f"mis_band {self.mis_band} must satisfy 0 <= low < 1 < high")
        return self

    def objective(self) -> Objective:
        return Objective(kind=self.kind, clip_low=self.clip_eps, clip_high=self.clip_eps_high or self.clip_eps,
                         delta=self.delta, correction=self.correction, correction_level=self.correction_level,
                         tis_cap=self.tis_cap, mis_band=self.mis_band, entropy_coef=self.entropy_coef,
                         kl_coef=self.kl_coef)

    def advantages(self, rewards: list[float]) -> list[float]:
        """A group's advantages by this loss's rule (``Loss.advantages``; ``rloo``: leave-one-out): the one place
        the trainer gets them (rows carry rewards, not advantages)."""
        return get_loss(self.kind).advantages(rewards, use_std=self.use_std)


class OptimConfig(StrictModel):
    lr: float = Field(5e-5, gt=0)
    warmup_steps: int = Field(5, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch: int = Field(256, ge=1)  # sequences per forward/backward
    # the completions of one prompt in one row behind a single copy of it (swarmrl.rollouts.shared): the decoder
    # runs over each prompt once per micro-batch, not once per completion; the same logprobs and gradients. Models
    # whose attention takes no custom mask (supports_shared) fall back to one sequence per row.
    share_prompts: bool = True
    # recompute each decoder layer's activations in the backward pass (HF gradient checkpointing): peak memory of
    # a pass falls from all layers' activations to one layer's, for about one more forward pass of compute
    activation_checkpointing: bool = False
    # AdamW's two moments (state_dtype) and the gradients between backward and the step (grad_dtype) in bfloat16
    # instead of float32: 2 bytes a parameter each instead of 4 (swarmrl.training.optim; one whole model per rank)
    state_dtype: Literal["float32", "bfloat16"] = "float32"
    grad_dtype: Literal["float32", "bfloat16"] = "float32"


class EvalSection(TokenLimits):
    """The trainer's held-out evaluations (greedy) and the run's final one, under their own token limits."""

    every_steps: int = Field(5, ge=0)  # 0: only at the end
    n: int = Field(256, ge=1)


class WorkerSection(StrictModel):
    num: int = Field(2, ge=0)
    prompts_per_batch: int = Field(16, ge=1)
    threads: int = Field(1, ge=1)
    poll_s: float = Field(0.05, gt=0)
    proofs: bool = False  # attach TOPLOC proofs (needs swarmrl.toploc)


class TrainerSection(StrictModel):
    threads: int = Field(1, ge=1)
    poll_s: float = Field(0.02, gt=0)
    # parse the files of the next async_level steps in a background thread while training (swarmrl.rl.readahead)
    read_ahead: bool = True
    # under torchrun: "ddp" keeps the whole model on every rank and all-reduces gradients; "fsdp2" shards
    # parameters, gradients and optimizer state across the ranks (torch.distributed.fsdp.fully_shard)
    parallel: Literal["ddp", "fsdp2"] = "ddp"


class ShardcastSection(StrictModel):
    """Weight distribution through SHARDCAST: the trainer is the origin, workers fetch via relays."""

    enabled: bool = False
    relays: int = Field(1, ge=0)  # relay processes the launcher starts (0: workers fetch from the origin)
    servers: list[str] = Field(default_factory=list)  # explicit server URLs for workers (default: discovered)
    shard_size: int = Field(1_000_000, ge=1024)
    keep: int = Field(5, ge=1)
    fetch_wait_s: float = Field(30.0, ge=0)  # how long a worker waits for a version to reach its servers
    origin_port: int = Field(0, ge=0, le=65535)  # the trainer's origin port (0: any free one); fixed by
    # `swarmrl run` so a restarted trainer serves where its relays look
    origin_host: str = "127.0.0.1"  # the address the origin listens on and announces (`swarmrl run` under a
    # network profile: the trainer's namespace address)
    # the host name or address other machines reach the origin at, when it listens on a wildcard address
    # ("" = origin_host; `swarmrl run` with swarm.listen beyond loopback: swarm.public_host)
    origin_public_host: str = ""

    @model_validator(mode="after")
    def _named(self) -> ShardcastSection:
        if is_wildcard(self.origin_host) and not self.origin_public_host:
            raise ValueError(f"rl.shardcast.origin_host = {self.origin_host!r} listens on every address but names "
                             "none: set rl.shardcast.origin_public_host to the name or address others reach it at")
        return self


class LoraSection(StrictModel):
    """Train a LoRA adapter instead of the whole policy (``swarmrl.rl.lora``): each version is the adapter alone
    (a few MB instead of the model), applied merged onto the base by every holder. Off by default."""

    enabled: bool = False
    rank: int = Field(16, ge=1, le=MAX_RANK)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    # module names (the last part of a linear layer's name) that get an adapter; each must exist in the model
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGETS), min_length=1)

    @model_validator(mode="after")
    def _names(self) -> LoraSection:
        bad = [t for t in self.target_modules if not t.isidentifier()]
        if bad:
            raise ValueError(f"target_modules {bad}: each must be a module name such as 'q_proj'")
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError(f"target_modules {self.target_modules} names a module twice")
        return self


class RLConfig(StrictModel):
    run_dir: str = "runs/rl"
    model: str = "runs/warmstart/model"  # initial policy (any HF causal LM dir)
    # what every role must agree on: task, chat template, async_level, group_size, filter_ties, budget, sampling
    # (token limits, temperature, top_p), proofs
    contract: RLContract = Field(default_factory=RLContract)
    steps: int = Field(60, ge=1)
    max_minutes: float | None = Field(None, gt=0)  # trainer stops early after this much wall time
    prompts_per_step: int = Field(32, ge=1)  # informative groups the trainer uses per step
    # usable groups a step got beyond prompts_per_step train the next step while its window still serves their
    # policy version, instead of being dropped (work comes in whole assignments, so a step usually gets more)
    carry_surplus: bool = True
    inference: InferenceConfig = Field(default_factory=InferenceConfig)  # workers' and nodes' sampling backend
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalSection = Field(default_factory=EvalSection)
    workers: WorkerSection = Field(default_factory=WorkerSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    shardcast: ShardcastSection = Field(default_factory=ShardcastSection)
    tracking: TrackingSection = Field(default_factory=TrackingSection)  # W&B / trackio, besides metrics/*.jsonl
    lora: LoraSection = Field(default_factory=LoraSection)  # train and publish a LoRA adapter, not the whole model
    keep_versions: int = Field(4, ge=1)
    # rollout directories of trained steps kept behind the newest version (the trainer never reads them again;
    # a resumed trainer redoes only the step in flight): older ones are deleted, so disk use stays bounded. -1: all
    keep_rollout_steps: int = Field(2, ge=-1)
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        return refuse_moved(data, MOVED_TO_CONTRACT, "the run's contract",
                            "[rl.contract] async_level = 2, [rl.contract.sampling] temperature = 1.0")

    @model_validator(mode="after")
    def _check(self) -> RLConfig:
        k = self.contract.async_level
        if self.keep_versions < k + 1:
            raise ValueError(f"keep_versions ({self.keep_versions}) must be >= contract.async_level + 1 "
                             f"({k + 1}) so workers can still load the policies they may use")
        if self.lora.enabled and self.trainer.parallel == "fsdp2":
            raise ValueError("lora.enabled with trainer.parallel = 'fsdp2' is not supported (use 'ddp': the "
                             "adapter's optimizer state is small)")
        if self.lora.enabled and self.inference.backend != "ours":
            raise ValueError(f"lora.enabled with inference.backend = {self.inference.backend!r}: only 'ours' applies "
                             "adapter versions (it merges each onto the base it holds)")
        return self
