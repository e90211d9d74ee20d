"""The GRPO trainer process: collects rollouts for each step, updates the policy, commits and publishes versions.

The trainer is assembled from builders (``swarmrl.training``, which SFT and DiLoCo build from too), one set-up step
each, and holds its parts as typed attributes:

- ``par`` (``training.parallel``, ``_build_policy``): how the ranks hold the model (one whole copy each, or FSDP2
  shards) and the collectives they meet in (the batch broadcast from rank 0, barriers, the gathered model);
- ``model`` (``training.model.prepare_model``): the policy, with activation checkpointing
  (``optim.activation_checkpointing``) and the hook that hands freed heap back before the embedding's gradient;
- ``lora`` (``rl.lora.LoraPolicy``, with ``rl.lora.enabled``): the base wrapped with a LoRA adapter, the only
  trainable part; versions after 0 are the adapter alone (holders merge it onto their base) and the KL reference
  is the base with the adapter switched off;
- ``ref_model`` (``training.model.build_reference``, ``_build_reference``): the KL reference, with ``loss.kl_coef``;
- ``opt`` / ``sched`` (``training.optim``, ``training.schedule``, ``_build_optimizer``): AdamW, torch's fused kernel
  in float32 or ``LowMemoryAdamW`` with bfloat16 moments and gradients (``optim.state_dtype`` /
  ``optim.grad_dtype``), under the warm-up schedule; gradients are dropped and freed heap handed back after every
  step;
- ``state`` / ``checkpointer`` (``training.checkpoint``): optimizer, schedule, RNG and counters, saved with every
  version through ``torch.distributed.checkpoint`` and restored on resume;
- ``rule`` / ``window`` (``contract``): which groups of a step's rollouts it uses;
- the rank-aware parts (``rl.parts``, ``_build_parts``): ``source`` (``rl.sources.RolloutSource``: the rollout
  files of a step, the run directory's, written by local workers or by the swarm's adapter), ``recorder`` (one
  typed ``rundir.StepRecord`` per step in ``metrics/trainer.jsonl``, and the tracker), ``evaluator`` (held-out
  accuracy) and ``versions`` (a version staged, committed, handed to its ``publishers``, ``rl.publish``, and
  pruned). Rank 0 holds the working ones, every other rank ones that do nothing, so the loop has no rank branch.

Trainer step n starts from policy version n and commits version n + 1 (weights, tokenizer and the trainer's
state in one directory, renamed into place). It trains on the usable groups (``contract.GroupRule``) of rows made
for step n by a policy inside the staleness window (``contract.AsyncWindow``); usable groups a step got beyond
its need are carried to the next step while the window still serves their version (``carry_surplus``, kept in
memory only: a restarted trainer has none, so no group is trained on twice). A step whose loss or gradient norm
is not finite changes no weight (the optimizer step is skipped, counted as ``nonfinite_skipped`` /
``nonfinite_total``) and still commits its version, so the run goes on. Killed at any point, it restarts from the
newest committed version and redoes the step that was in flight. ``max_minutes`` ends the run after that much
wall time, whether the trainer is waiting for rollouts or training. Rollout directories of steps more than
``keep_rollout_steps`` behind are deleted, so a long run's disk use stays bounded.

Data parallel: under torchrun (WORLD_SIZE > 1) rank 0 collects and broadcasts the batch and every rank
back-propagates its share with global normalisation weights, so N ranks make the same update as one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swarmrl.contract import Rollout
from swarmrl.envs.multiturn import is_multiturn
from swarmrl.envs.vf import is_verifiers_env
from swarmrl.models.io import load_tokenizer
from swarmrl.rl.config import RLConfig
from swarmrl.rl.lora import LoraPolicy
from swarmrl.rl.parts import build_parts
from swarmrl.rl.publish import WeightPublisher
from swarmrl.rl.sources import RolloutSource
from swarmrl.rl.train_step import Passes, WholeBatch, accumulate_gradients
from swarmrl.rollouts.packing import Sequence
from swarmrl.rundir import StepRecord
from swarmrl.rundir.layout import MASTER_DIR
from swarmrl.rundir.writer import RunDir
from swarmrl.training.checkpoint import Checkpointer, TrainerState
from swarmrl.training.model import build_reference, prepare_model
from swarmrl.training.optim import build_optimizer, clip_gradients
from swarmrl.training.parallel import build_parallel, init_distributed
from swarmrl.training.schedule import build_scheduler
from swarmrl.utils.memory import peak_rss_mb, release_freed_memory
from swarmrl.utils.threads import set_role_threads


@dataclass
class Batch:
    groups: list[list[Rollout]]
    files: list[str]
    wait_s: float
    stats: dict = field(default_factory=dict)  # what the selection kept and dropped (``GroupRule.select``)


def overlong(row: Rollout, limit: int) -> bool:
    """Was the completion cut by its token limit (``TokenLimits.row_limit``): no EOS and the whole limit used? (A
    multi-turn trajectory the environment ended has no EOS either, but was not cut; one single-turn completion
    without EOS used it all.)"""
    return not row.finished and len(row.completion_ids) >= limit


class Trainer:
    def __init__(self, cfg: RLConfig, *, source: RolloutSource | None = None,
                 publishers: Iterable[WeightPublisher] = ()) -> None:
        """``source``: where rollouts come from (default: the run directory). ``publishers``: more places a
        committed version goes, besides those the config names (SHARDCAST)."""
        self.cfg = cfg
        self.rank, self.world = init_distributed()
        set_role_threads(cfg.trainer.threads)
        self.run = RunDir(cfg.run_dir)
        self.window = cfg.contract.window(last_step=cfg.steps - 1)
        self.rule = cfg.contract.group_rule()
        self._carry: list[list] = []  # usable groups of the previous step beyond its need (cfg.carry_surplus)
        self.tokenizer = load_tokenizer(cfg.model)
        self.env = cfg.contract.task.build()
        self._build_parts(source, publishers)  # first: the SHARDCAST origin is up while the model loads
        latest = self.run.latest_version()
        self._build_policy(latest)
        self._build_reference()
        self._build_optimizer()
        self._start(latest)

    # ---- set-up: one step per builder --------------------------------------------------------
    @property
    def step(self) -> int:
        return self.state.step

    def _build_policy(self, latest: int | None) -> None:
        """``par`` and ``model``: the newest version's weights (the initial policy's on a fresh run), held as
        ``trainer.parallel`` says (fsdp2: built sharded), ready to train; with ``lora``, the base wrapped with the
        adapter (the newest version's, on resume). A resumed trainer starts from its float32 master weights
        (``MASTER_DIR``) when the published ones are a cast."""
        cfg = self.cfg
        lora = cfg.lora.enabled  # versions are adapters on the base (cfg.model), which is always what is loaded
        start = self.run.version_dir(latest) if latest is not None and not lora else cfg.model
        if start != cfg.model and (Path(start) / MASTER_DIR).is_dir():  # published weights are a cast: the masters
            start = Path(start) / MASTER_DIR
        self.par = build_parallel(cfg.trainer.parallel, start, self.world, self.rank)
        self.model = prepare_model(self.par.model, activation_checkpointing=cfg.optim.activation_checkpointing,
                                   release_memory=True)
        self.lora = LoraPolicy.wrap(self.model, cfg.lora, cfg.seed) if lora else None
        if self.lora is not None and latest:
            self.lora.load(self.run.version_dir(latest))

    def _build_reference(self) -> None:
        """``ref_model``, the KL reference (with ``loss.kl_coef``): the initial policy, held as the policy is; under
        LoRA the base, the same modules with the adapter off."""
        cfg = self.cfg
        self.ref_model = None
        if cfg.loss.kl_coef and self.lora is not None:
            self.ref_model = self.lora.reference()
        elif cfg.loss.kl_coef:
            self.ref_model = build_reference(cfg.trainer.parallel, cfg.model, self.world, self.rank)

    def _build_optimizer(self) -> None:
        """``opt`` (AdamW on the trainable parameters), ``sched`` (the warm-up), and ``state`` / ``checkpointer``."""
        cfg, o = self.cfg, self.cfg.optim
        params = self.lora.trainable() if self.lora is not None else self.model.parameters()
        self.opt = build_optimizer(params, o.lr, o.betas, o.weight_decay, state_dtype=o.state_dtype,
                                   grad_dtype=o.grad_dtype, sharded=cfg.trainer.parallel == "fsdp2", world=self.world)
        self.sched = build_scheduler(self.opt, o.warmup_steps)
        self.state = TrainerState(self.model, self.opt, self.sched)
        self.checkpointer = Checkpointer(self.rank, self.world)

    def _build_parts(self, source: RolloutSource | None, publishers: Iterable[WeightPublisher]) -> None:
        """The rank-aware parts (``rl.parts``): rank 0's, or ones that do nothing."""
        parts = build_parts(self.cfg, self.run, self.rank, self.window, tokenizer=self.tokenizer, env=self.env,
                            source=source, publishers=publishers)
        self.source, self.recorder = parts.source, parts.recorder
        self.evaluator, self.versions = parts.evaluator, parts.versions

    def _start(self, latest: int | None) -> None:
        """Resume from the newest version (its state; the metrics row and the publication a crash may have lost
        after its commit), or commit version 0, the initial policy."""
        self.resumed = latest is not None
        if latest is not None:
            meta = self.checkpointer.load(self.run.version_dir(latest), self.state)
            self.state.step = latest
            self.recorder.recover((meta or {}).get("metrics_row"))
            self.versions.publish(latest)  # a crash between commit and publication left it unpublished
        else:
            self._commit(0, consumed=[], full=self.par.gather_full_model())
        self.par.barrier()

    # ---- commit ------------------------------------------------------------------------------
    def _commit(self, version: int, consumed: list[str], full: torch.nn.Module | None,
                record: StepRecord | None = None) -> None:
        """Every rank: the weights (``full``, the gathered model on rank 0), tokenizer and calibration, and the
        trainer's state (each rank its part) into a staging directory that rank 0 renames into place."""
        self.versions.stage(version, full, self.lora)
        self.par.barrier()
        staged = self.run.policies.staging_path(version)
        row = record.model_dump(exclude_none=True, exclude={"time"}) if record is not None else None
        self.checkpointer.save(staged, self.state, {"step": version, "consumed": consumed, "metrics_row": row})
        self.par.barrier()
        self.versions.commit(version)

    # ---- data --------------------------------------------------------------------------------
    def collect_batch(self, step: int, deadline: float | None) -> Batch | None:
        """Step ``step``'s usable groups from the source (rank 0), waiting for them; None: the run ends."""
        cfg, src = self.cfg, self.source
        t0 = time.perf_counter()
        files: dict[str, list[Rollout]] = {}
        last_log = t0
        while True:
            files.update(src.poll(step))
            usable, stats = self.rule.select(list(files.items()), step, self.window, self._carry)
            if len(usable) >= cfg.prompts_per_step:
                break
            announced, all_read = src.announced(step)
            # what this step's files announced and did not deliver (carried groups are not theirs: counting them
            # would hide a shortfall from the workers, who then make no more for this step)
            missing = announced - (len(usable) - stats["carried_groups"])
            if missing > 0 and all_read:
                src.report_shortfall(step, missing)
            if _past(deadline) or src.is_done():
                return None
            if time.perf_counter() - last_log > 30:
                last_log = time.perf_counter()
                self.recorder.event("waiting", step=step, usable=len(usable), need=cfg.prompts_per_step)
            time.sleep(cfg.trainer.poll_s)
        chosen = usable[: cfg.prompts_per_step]
        stats["workers"] = sorted({g[0].worker_id for g in chosen})
        stats["surplus_groups"] = len(usable) - len(chosen)
        # kept in memory only: a restarted trainer starts with none (those groups are lost, never used twice)
        self._carry = usable[cfg.prompts_per_step:] if cfg.carry_surplus else []
        return Batch(chosen, sorted(files), time.perf_counter() - t0, stats)

    def _next_batch(self, n: int, deadline: float | None) -> Batch | None:
        """Rank 0 collects step ``n``'s batch (None: the run ends) and every rank gets it."""
        return self.par.broadcast_from_lead(lambda: None if _past(deadline) else self.collect_batch(n, deadline))

    # ---- update ------------------------------------------------------------------------------
    def update(self, groups: list[list[Rollout]]) -> dict:
        """One optimizer step on ``groups`` (every rank); returns the update's fields of the step record."""
        cfg = self.cfg
        seqs: list[Sequence] = []
        limit = cfg.contract.sampling.row_limit(multiturn=is_multiturn(self.env) or is_verifiers_env(self.env))
        for g in groups:
            adv = cfg.loss.advantages([r.reward for r in g])  # the loss's rule, from the rewards (rows carry none)
            for r, a in zip(g, adv):
                if cfg.loss.overlong_filter and overlong(r, limit):  # left out of the loss
                    continue
                seqs.append(Sequence(r.prompt_ids, r.completion_ids, r.logprobs, a, r.temperature,
                                     r.completion_mask))
        total_tokens = sum(s.model_tokens() for s in seqs)
        mine = seqs[self.rank:: self.world]
        passes = self.par.micro_batches([len(seqs[r:: self.world]) for r in range(self.world)], cfg.optim.micro_batch)
        self.opt.zero_grad(set_to_none=True)
        plan = Passes(cfg.optim.micro_batch, at_least=passes, loss_scale=self.par.loss_scale,
                      share_prompts=cfg.optim.share_prompts)
        st = accumulate_gradients(self.model, mine, cfg.loss, self.tokenizer.pad_token_id,
                                  WholeBatch(limit, len(seqs), total_tokens), plan, ref_model=self.ref_model)
        self.par.reduce_grads()
        gnorm = clip_gradients(self.model.parameters(), self.opt, cfg.optim.grad_clip)  # DTensors too
        loss = self.par.sum_over_ranks(st.loss)
        if math.isfinite(loss) and math.isfinite(gnorm):  # every rank's loss (a NaN anywhere makes the sum NaN)
            self.opt.step()
            self.sched.step()
            skipped = 0
        else:  # a non-finite loss or gradient: keep the weights and the optimizer's state (the schedule too),
            skipped = 1  # drop the step; the version is still committed
            self.state.nonfinite_total += 1
        self.opt.zero_grad(set_to_none=True)  # the commit, evaluation and publication that follow need no gradient
        release_freed_memory()  # the step's activations and gradients: back to the system, not kept in the heap
        stats = st.stats.as_dict()
        stats.pop("tokens")
        return {"loss": loss, **stats, "grad_norm": gnorm, "train_tokens": total_tokens,
                "lr": self.sched.get_last_lr()[0], "nonfinite_skipped": skipped,
                "nonfinite_total": self.state.nonfinite_total}

    def _record(self, n: int, batch: Batch, info: dict, t_start: float, train_s: float) -> StepRecord:
        rows = [r for g in batch.groups for r in g]
        lags = [n - r.policy_version for r in rows]
        return StepRecord(step=n, version=n + 1, wall_s=round(time.monotonic() - t_start, 3),
                          wait_s=round(batch.wait_s, 4), train_s=round(train_s, 4),
                          reward=sum(r.reward for r in rows) / len(rows),
                          task_reward=sum(r.task_reward for r in rows) / len(rows),
                          lag_mean=sum(lags) / len(lags), lag_max=max(lags),
                          completion_len=sum(len(r.completion_ids) for r in rows) / len(rows),
                          files=batch.files, **batch.stats, **info,
                          peak_rss_mb=peak_rss_mb())

    # ---- loop --------------------------------------------------------------------------------
    def run_loop(self) -> int:
        cfg = self.cfg
        t_start = time.monotonic()
        deadline = t_start + cfg.max_minutes * 60 if cfg.max_minutes else None
        self.source.start(self.step)
        try:
            if not self.resumed and cfg.eval.every_steps:
                self._evaluate_base()
            while self.step < cfg.steps:
                batch = self._next_batch(self.step, deadline)
                if batch is None:
                    break
                self._train_step(batch, t_start)
            self._finish(t_start)
        finally:
            self.source.stop()
        return self.step

    def _evaluate_base(self) -> None:
        """Held-out accuracy of version 0, before any step."""
        full = self.par.gather_full_model()
        self.recorder.event("eval", step=0, version=0, heldout_acc=self.evaluator(full), wall_s=0.0)
        del full

    def _train_step(self, batch: Batch, t_start: float) -> None:
        """Step n: the update, the new version n + 1 (evaluated every ``eval.every_steps``) committed, its record."""
        cfg, n = self.cfg, self.step
        t1 = time.perf_counter()
        info = self.update(batch.groups)
        full = self.par.gather_full_model()  # the new version's whole weights on rank 0 (fsdp2: a collective)
        train_s = time.perf_counter() - t1
        self.state.step = n + 1
        record = self._record(n, batch, info, t_start, train_s)
        if cfg.eval.every_steps and (n + 1) % cfg.eval.every_steps == 0:
            te = time.perf_counter()
            record.heldout_acc = self.evaluator(full)
            record.eval_s = round(time.perf_counter() - te, 3)
        self._commit(n + 1, consumed=batch.files, full=full, record=record)
        del full  # under fsdp2 the whole weights live only while their version is published
        self.recorder.step(record)

    def _finish(self, t_start: float) -> None:
        """The final evaluation, DONE, the publications waited for, the records closed."""
        full = self.par.gather_full_model()
        self.recorder.event("final", step=self.step, version=self.step, heldout_acc=self.evaluator(full),
                            wall_s=round(time.monotonic() - t_start, 3))
        self.versions.close(self.step)
        self.recorder.close()
        del full
        self.par.barrier()


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


def run_trainer(cfg: RLConfig) -> int:
    return Trainer(cfg).run_loop()


__all__ = ["Batch", "Trainer", "run_trainer"]
