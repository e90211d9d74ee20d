"""The GRPO trainer process: gathers rollouts for each step, updates the policy, commits and publishes versions.

The trainer is made of parts, each a typed attribute:

- ``source`` (``rl.sources.RolloutSource``): the rollout files of a step (the run directory's, written by local
  workers or by the swarm's adapter);
- ``rule`` / ``window`` (``contract``): which groups of those a step uses;
- ``par`` (``rl.parallel``): how the ranks hold the model (one whole copy each, or FSDP2 shards);
- ``opt`` (``rl.optim``): AdamW, torch's fused kernel in float32 or ``LowMemoryAdamW`` with bfloat16 moments and
  gradients (``optim.state_dtype`` / ``optim.grad_dtype``); gradients are dropped and freed heap handed back after
  every step;
- ``state`` / ``checkpointer`` (``rl.state``): optimizer, schedule, RNG and counters, saved with every version
  through ``torch.distributed.checkpoint`` and restored on resume;
- ``publishers`` (``rl.publish.WeightPublisher``): where a committed version goes besides the run directory
  (the SHARDCAST origin when ``shardcast.enabled``);
- ``metrics``: one typed ``rundir.StepRecord`` per step in ``metrics/trainer.jsonl``;
- ``lora`` (``rl.lora.LoraPolicy``, with ``rl.lora.enabled``): the base wrapped with a LoRA adapter, the only
  trainable part; versions after 0 are the adapter alone (holders merge it onto their base) and the KL reference
  is the base with the adapter switched off.

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

Data parallel: under torchrun (WORLD_SIZE > 1) rank 0 gathers and broadcasts the batch and every rank
back-propagates its share with global normalisation weights, so N ranks make the same update as one.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch

from swarmrl.contract import Rollout
from swarmrl.envs.multiturn import is_multiturn
from swarmrl.envs.vf import is_verifiers_env
from swarmrl.eval.heldout import evaluate
from swarmrl.models.io import load_tokenizer
from swarmrl.rl.config import RLConfig
from swarmrl.rl.lora import LoraPolicy
from swarmrl.rl.optim import build_optimizer, clip_gradients
from swarmrl.rl.parallel import load_parallel
from swarmrl.rl.publish import ShardcastPublisher, WeightPublisher
from swarmrl.rl.sources import RolloutSource, RunDirRolloutSource
from swarmrl.rl.state import STATE_DIR, Checkpointer, TrainerState
from swarmrl.rl.tracking import SafeTracker, make_tracker, numbers
from swarmrl.rl.train_step import accumulate_gradients
from swarmrl.rollouts.packing import Sequence
from swarmrl.rundir import EvalRecord, StepRecord, read_trainer_log
from swarmrl.rundir.writer import RunDir
from swarmrl.toploc.thresholds_file import copy_calibration
from swarmrl.utils.memory import peak_rss_mb, release_before_embedding_backward, release_freed_memory
from swarmrl.utils.metrics import MetricsWriter
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
                 publishers: list[WeightPublisher] = ()) -> None:
        """``source``: where rollouts come from (default: the run directory). ``publishers``: more places a
        committed version goes, besides those the config names (SHARDCAST)."""
        self.cfg = cfg
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        if self.world > 1 and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
        set_role_threads(cfg.trainer.threads)
        self.run = RunDir(cfg.run_dir)
        self.window = cfg.contract.window(last_step=cfg.steps - 1)
        self.rule = cfg.contract.group_rule()
        self._carry: list[list] = []  # usable groups of the previous step beyond its need (cfg.carry_surplus)
        self.tokenizer = load_tokenizer(cfg.model)
        self.env = cfg.contract.task.build()
        lead = self.rank == 0  # rank 0 gathers, evaluates, writes and publishes
        self.metrics = MetricsWriter(self.run.trainer_metrics) if lead else None
        self.source = (source or RunDirRolloutSource(
            self.run, self.window, read_ahead=cfg.trainer.read_ahead, poll_s=cfg.trainer.poll_s,
            on_reject=lambda name, why: self._log_event("rejected_file", file=name, reason=why))) if lead else None
        self.publishers: list[WeightPublisher] = []
        if lead and cfg.shardcast.enabled:
            sc = cfg.shardcast
            self.publishers.append(ShardcastPublisher(self.run, keep=sc.keep, shard_size=sc.shard_size,
                                                      port=sc.origin_port, host=sc.origin_host,
                                                      on_error=self._publish_failed))
        if lead:
            self.publishers += list(publishers)
        tracker = make_tracker(cfg.tracking, cfg.run_dir, cfg.model_dump(mode="json")) if lead else None
        self.tracker = SafeTracker(tracker) if tracker is not None else None
        self.checkpointer = Checkpointer(self.rank, self.world)
        self._setup()

    # ---- state -------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self.state.step

    def _setup(self) -> None:
        cfg = self.cfg
        latest = self.run.latest_version()
        lora = cfg.lora.enabled  # versions are adapters on the base (cfg.model), which is always what is loaded
        start = self.run.version_dir(latest) if latest is not None and not lora else cfg.model
        self.par = load_parallel(cfg.trainer.parallel, start, self.world, self.rank)  # fsdp2: built sharded
        self.model = self.par.model
        if cfg.optim.activation_checkpointing:  # each decoder layer recomputed in backward (HF's own mechanism)
            kw = {"use_reentrant": False}
            enable = getattr(self.model, "activation_checkpointing_enable", None)  # its name since transformers 5.x
            if enable is not None:
                enable(activation_checkpointing_kwargs=kw)
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
        release_before_embedding_backward(self.model)  # the embedding's gradient fits into the freed activations
        self.lora = LoraPolicy.wrap(self.model, cfg.lora, cfg.seed) if lora else None
        if self.lora is not None and latest:
            self.lora.load(self.run.version_dir(latest))
        self.ref_model = None
        if cfg.loss.kl_coef and self.lora is not None:  # the base: the same modules with the adapter off
            self.ref_model = self.lora.reference()
        elif cfg.loss.kl_coef:  # the initial policy, held the same way (sharded under fsdp2)
            self.ref_model = load_parallel(cfg.trainer.parallel, cfg.model, self.world, self.rank).model
            self.ref_model.eval().requires_grad_(False)
        o = cfg.optim
        params = self.lora.trainable() if self.lora is not None else self.model.parameters()
        self.opt = build_optimizer(params, o.lr, o.betas, o.weight_decay, state_dtype=o.state_dtype,
                                   grad_dtype=o.grad_dtype, sharded=cfg.trainer.parallel == "fsdp2", world=self.world)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / max(1, o.warmup_steps)))
        self.state = TrainerState(self.model, self.opt, self.sched)
        self.resumed = latest is not None
        if latest is not None:
            meta = self.checkpointer.load(self.run.version_dir(latest), self.state)
            self.state.step = latest
            if self.rank == 0:
                self._recover_metrics_row((meta or {}).get("metrics_row"))
                self._publish(latest)  # a crash between commit and publication left it unpublished
        else:
            self._commit(0, consumed=[], full=self.par.gather())
        self._barrier()

    def _barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def _recover_metrics_row(self, row: dict | None) -> None:
        """A crash between a version's commit and its metrics row lost the row: write it from the checkpoint."""
        if not row:
            return
        done = {r.step for r in read_trainer_log(self.run.trainer_metrics).steps}
        if row["step"] not in done:
            self.metrics.write(**row)

    def _commit(self, version: int, consumed: list[str], full: torch.nn.Module | None,
                record: StepRecord | None = None) -> None:
        """Every rank: the weights (``full``, the gathered model on rank 0), tokenizer and calibration, and the
        trainer's state (each rank its part) into a staging directory that rank 0 renames into place."""
        if self.rank == 0:
            staged = self.run.staging_dir(version)
            was = full.training
            full.eval()
            if self.lora is not None and version:  # a LoRA run's versions after 0 are the adapter alone
                self.lora.save(staged, self.tokenizer)
            elif self.lora is not None:  # its version 0 is the base itself
                self.lora.save_base(staged, self.tokenizer)
            else:
                full.save_pretrained(staged, safe_serialization=True)
                self.tokenizer.save_pretrained(staged)
            copy_calibration(self.cfg.model, staged)  # per-model TOPLOC thresholds travel with every version
            full.train(was)
        self._barrier()
        staged = self.run.policies.staging_path(version)
        row = record.model_dump(exclude_none=True, exclude={"time"}) if record is not None else None
        self.checkpointer.save(staged, self.state, {"step": version, "consumed": consumed, "metrics_row": row})
        self._barrier()
        if self.rank != 0:
            return
        self.run.commit_version(version, staged)
        self.run.policies.drop_older_states(STATE_DIR)  # after LATEST names the new version and its state
        self._publish(version)
        self.run.prune_versions(self.cfg.keep_versions)
        if self.cfg.keep_rollout_steps >= 0:  # the trainer never reads the steps it has trained again
            self.run.prune_rollouts(before_step=version - self.cfg.keep_rollout_steps)

    def _publish(self, version: int) -> None:
        for p in self.publishers:
            p.publish(version, self.run.version_dir(version))

    def _publish_failed(self, version: int, e: BaseException) -> None:
        self._log_event("publish_failed", version=version, reason=str(e))

    # ---- data --------------------------------------------------------------------------------
    def gather(self, step: int, deadline: float | None) -> Batch | None:
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
                self._log_event("waiting", step=step, usable=len(usable), need=cfg.prompts_per_step)
            time.sleep(cfg.trainer.poll_s)
        chosen = usable[: cfg.prompts_per_step]
        stats["workers"] = sorted({g[0].worker_id for g in chosen})
        stats["surplus_groups"] = len(usable) - len(chosen)
        # kept in memory only: a restarted trainer starts with none (those groups are lost, never used twice)
        self._carry = usable[cfg.prompts_per_step:] if cfg.carry_surplus else []
        return Batch(chosen, sorted(files), time.perf_counter() - t0, stats)

    def _log_event(self, kind: str, **kw) -> None:
        if self.metrics is not None:
            self.metrics.write(event=kind, **kw)
            if kind in ("eval", "final"):
                self._track(kw["step"], EvalRecord(event=kind, **kw))

    def _track(self, step: int, record: StepRecord | EvalRecord) -> None:
        if self.tracker is not None:
            self.tracker.log(step, numbers(record))

    # ---- update ------------------------------------------------------------------------------
    def update(self, groups: list[list[Rollout]]) -> dict:
        """One optimizer step on ``groups`` (every rank); returns the update's fields of the step record."""
        cfg = self.cfg
        seqs: list[Sequence] = []
        limit = cfg.sampling.row_limit(multiturn=is_multiturn(self.env) or is_verifiers_env(self.env))
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
        st = accumulate_gradients(self.model, mine, cfg.loss, self.tokenizer.pad_token_id, cfg.optim.micro_batch,
                                  max_tokens=limit, world_size=self.par.loss_scale,
                                  total_sequences=len(seqs), total_tokens=total_tokens, ref_model=self.ref_model,
                                  micro_batches=passes, share_prompts=cfg.optim.share_prompts)
        self.par.reduce_grads()
        gnorm = clip_gradients(self.model.parameters(), self.opt, cfg.optim.grad_clip)  # DTensors too
        loss = self._global_loss(st.loss)
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

    def _global_loss(self, loss: float) -> float:
        """The whole batch's loss: the sum of the ranks' shares (the same number on every rank)."""
        if self.world == 1:
            return loss
        t = torch.tensor([loss], dtype=torch.float64, device=next(self.model.parameters()).device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return float(t.item())

    def evaluate(self, full: torch.nn.Module) -> float:
        """Rank 0, on ``full`` (the gathered model: ``par.gather``)."""
        res = evaluate(full, self.tokenizer, self.env, n=self.cfg.eval.n,
                       limits=self.cfg.eval, chat_template=self.cfg.contract.chat_template)
        self.model.train()
        return res["accuracy"]

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
        if self.source is not None:
            self.source.start(self.step)
        try:
            return self._loop(t_start, deadline)
        finally:
            if self.source is not None:
                self.source.stop()

    def _next_batch(self, n: int, deadline: float | None) -> Batch | None:
        """Rank 0 gathers step ``n``'s batch (None: the run ends) and every rank gets it."""
        batch = None
        if self.rank == 0 and not _past(deadline):
            batch = self.gather(n, deadline)
        if self.world > 1:
            obj = [batch]
            torch.distributed.broadcast_object_list(obj, src=0)
            batch = obj[0]
        return batch

    def _loop(self, t_start: float, deadline: float | None) -> int:
        cfg = self.cfg
        if not self.resumed and cfg.eval.every_steps:
            full = self.par.gather()
            if self.rank == 0:
                self._log_event("eval", step=0, version=0, heldout_acc=self.evaluate(full), wall_s=0.0)
            del full
        while self.step < cfg.steps:
            n = self.step
            batch = self._next_batch(n, deadline)
            if batch is None:
                break
            t1 = time.perf_counter()
            info = self.update(batch.groups)
            full = self.par.gather()  # the new version's whole weights on rank 0 (fsdp2: a collective)
            train_s = time.perf_counter() - t1
            self.state.step = n + 1
            record = None
            if self.rank == 0:
                record = self._record(n, batch, info, t_start, train_s)
                if cfg.eval.every_steps and (n + 1) % cfg.eval.every_steps == 0:
                    te = time.perf_counter()
                    record.heldout_acc = self.evaluate(full)
                    record.eval_s = round(time.perf_counter() - te, 3)
            self._commit(n + 1, consumed=batch.files, full=full, record=record)
            del full  # under fsdp2 the whole weights live only while their version is published
            if record is not None:
                self.metrics.write(**record.model_dump(exclude_none=True, exclude={"time"}))
                self._track(record.step, record)
        full = self.par.gather()
        if self.rank == 0:
            final = self.evaluate(full)
            self._log_event("final", step=self.step, version=self.step, heldout_acc=final,
                            wall_s=round(time.monotonic() - t_start, 3))
            self.run.done_flag.write_text(str(self.step))
            for p in self.publishers:
                p.close()
            if self.tracker is not None:
                self.tracker.close()
            self.metrics.close()
        del full
        self._barrier()
        return self.step


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


def run_trainer(cfg: RLConfig) -> int:
    return Trainer(cfg).run_loop()


__all__ = ["Batch", "Trainer", "run_trainer"]
