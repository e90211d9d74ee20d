"""The GRPO trainer process: gathers rollouts for each step, updates the policy, writes checkpoints.

Trainer step n starts from policy version n, uses only the usable groups (``contract.GroupRule``) generated
for step n with a policy inside the staleness window (``contract.AsyncWindow``), and commits version n + 1 (model + optimizer state in one
directory, renamed into place). A step whose loss or gradient norm is not finite changes no weight (the
optimizer step is skipped, counted in the metrics row as ``nonfinite_skipped`` and ``nonfinite_total``) and
still commits version n + 1, so the run goes on. Killed at any point, it restarts from the newest committed
version; the step that was in flight is redone from scratch, so no rollout is trained on twice. Only the newest
version keeps the optimizer state (``trainer_state.pt``, twice the weights' size with AdamW): older ones lose it
once a newer version is committed (``PolicyDir.drop_older_states``) and keep their weights. The base model's
TOPLOC calibration file (``toploc_thresholds.json``) is copied into every version, for validators.

Data parallel: launched under torchrun (WORLD_SIZE > 1), rank 0 gathers and broadcasts the
batch and every rank back-propagates its share with global normalisation weights. ``trainer.parallel``
(``swarmrl.rl.parallel``) says how the ranks hold the model: "ddp" (default) keeps a whole copy on every rank
and sums gradients with one all-reduce (what DDP does); "fsdp2" shards parameters, gradients and optimizer
state across the ranks with FSDP2 (``fully_shard``) and gathers the full weights and optimizer state at every
commit. Either way N ranks make the same update as one, and commits and published versions are the same files.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch

from swarmrl.contract import AsyncWindow, GroupRule, Rollout, group_advantages
from swarmrl.eval.heldout import evaluate
from swarmrl.models.io import load_model, load_tokenizer
from swarmrl.policy.holder import PolicyHolder
from swarmrl.policy.sources import RunDirPolicySource
from swarmrl.rl.config import RLConfig
from swarmrl.rl.parallel import allreduce_grads, make_parallel
from swarmrl.rl.readahead import ReadAhead
from swarmrl.rl.store import RunDir, announced_groups
from swarmrl.rl.train_step import accumulate_gradients
from swarmrl.rollouts.packing import Sequence
from swarmrl.rollouts.wire import RolloutError, read_rollouts
from swarmrl.shardcast import Origin
from swarmrl.toploc.calibration import copy_calibration
from swarmrl.utils.metrics import MetricsWriter, read_metrics
from swarmrl.utils.threads import set_role_threads

STATE_FILE = "trainer_state.pt"  # optimizer, scheduler, RNG: in the newest version only


@dataclass
class Batch:
    groups: list[list[Rollout]]
    files: list[str]
    wait_s: float
    stats: dict = field(default_factory=dict)


class Trainer:
    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        if self.world > 1 and not torch.distributed.is_initialized():
            torch.distributed.init_process_group("gloo" if not torch.cuda.is_available() else "nccl")
        set_role_threads(cfg.trainer.threads)
        self.run = RunDir(cfg.run_dir)
        self.window = AsyncWindow(cfg.async_level, last_step=cfg.steps - 1)
        self.rule = GroupRule(cfg.group_size, cfg.filter_ties)
        self._carry: list[list] = []  # usable groups of the previous step beyond its need (cfg.carry_surplus)
        self.tokenizer = load_tokenizer(cfg.model)
        self.env = cfg.task.build()
        self.metrics = MetricsWriter(self.run.metrics / "trainer.jsonl") if self.rank == 0 else None
        # rank 0 gathers: the next steps' files are parsed while it trains
        self.readahead = ReadAhead(self.run, cfg.async_level, cfg.trainer.poll_s) \
            if self.rank == 0 and cfg.trainer.read_ahead else None
        self.origin = None
        self._publishing: list = []
        if self.rank == 0 and cfg.shardcast.enabled:
            self._start_origin()
        self._setup()

    # ---- state -------------------------------------------------------------------------------
    def _setup(self) -> None:
        cfg = self.cfg
        latest = self.run.latest_version()
        holder = PolicyHolder(RunDirPolicySource(self.run.root), cfg.model)
        self.model = holder.load(latest, timeout_s=0.0) if latest is not None else holder.model
        self.model.train()
        self.par = make_parallel(cfg.trainer.parallel, self.model, self.world, self.rank)  # fsdp2: shards self.model
        self.ref_model = None
        if cfg.loss.kl_coef:
            self.ref_model = load_model(cfg.model)
            self.ref_model.requires_grad_(False)
        o = cfg.optim
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / max(1, o.warmup_steps)))
        self.step = 0
        self.nonfinite_total = 0  # optimizer steps skipped for a non-finite loss or gradient norm, over the run
        if latest is not None:
            state_path = self.run.version_dir(latest) / STATE_FILE
            if state_path.exists():
                state = torch.load(state_path, weights_only=False)
                self.par.load_optimizer_state(self.opt, state["optimizer"])
                self.sched.load_state_dict(state["scheduler"])
                torch.set_rng_state(state["rng"])
                self.nonfinite_total = int(state.get("nonfinite_total", 0))
                if self.rank == 0:
                    self._recover_metrics_row(state.get("metrics_row"))
            self.step = latest
            self.resumed = True
            if self.rank == 0:
                self._publish(latest)  # a crash between commit and publish left it unpublished
        else:
            self.resumed = False
            opt_state = self.par.snapshot(self.opt)
            if self.rank == 0:
                self._commit(0, consumed=[], opt_state=opt_state)
        self._barrier()

    def _start_origin(self) -> None:
        """SHARDCAST origin inside the trainer: every committed policy is published in the background."""

        sc = self.cfg.shardcast
        self.origin = Origin(self.run.shardcast / "origin", key=self.run.shardcast / "origin.key", keep=sc.keep,
                             shard_size=sc.shard_size, fsync=False)
        url = self.origin.serve(sc.origin_port)
        self.run.write_json("origin.json", {"url": url, "public_key": self.origin.public_key})

    def _publish(self, version: int) -> None:
        """Policy version N is SHARDCAST version N (version 0 is the base model every worker has). At resume the
        newest version is published again if a crash interrupted its publication (or came before it)."""
        if self.origin is None or version < 1 or version < self.origin.last_version or self.origin.is_published(version):
            return
        self._publishing = [f for f in self._publishing if not f.done()]
        fut = self.origin.publish(self.run.version_dir(version) / "model.safetensors", version)
        self._publishing.append(fut)

        def _done(f) -> None:
            if f.exception() is not None:
                self._log_event("publish_failed", version=version, reason=str(f.exception()))

        fut.add_done_callback(_done)

    def _barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def _recover_metrics_row(self, row: dict | None) -> None:
        """A crash between a version's commit and its metrics row lost the row: write it from the checkpoint."""
        if not row:
            return
        done = {r["step"] for r in read_metrics(self.run.metrics / "trainer.jsonl") if "reward" in r}
        if row["step"] not in done:
            self.metrics.write(**row)

    def _commit(self, version: int, consumed: list[str], opt_state: dict, metrics_row: dict | None = None) -> None:
        """Rank 0, after every rank's ``self.par.snapshot`` (which gave ``opt_state``)."""
        staged = self.run.staging_dir(version)
        model = self.par.full_model
        was = model.training
        model.eval()
        model.save_pretrained(staged, safe_serialization=True)
        self.tokenizer.save_pretrained(staged)
        copy_calibration(self.cfg.model, staged)  # per-model TOPLOC thresholds travel with every version
        model.train(was)
        torch.save({"optimizer": opt_state, "scheduler": self.sched.state_dict(),
                    "rng": torch.get_rng_state(), "step": version, "consumed": consumed,
                    "nonfinite_total": self.nonfinite_total, "metrics_row": metrics_row},
                   staged / STATE_FILE)
        self.run.commit_version(version, staged)
        self.run.policies.drop_older_states(STATE_FILE)  # after LATEST names the new version and its state
        self._publish(version)
        self.run.prune_versions(self.cfg.keep_versions)

    # ---- data --------------------------------------------------------------------------------
    def gather(self, step: int, deadline: float | None) -> Batch | None:
        cfg = self.cfg
        t0 = time.perf_counter()
        cache: dict[str, list[Rollout]] = {}
        rejected_files: list[str] = []
        last_log = t0
        while True:
            files = self.run.rollout_files(step)
            for f in files:
                if f.name not in cache and f.name not in rejected_files:
                    got = self.readahead.take(step, f) if self.readahead is not None else None
                    try:
                        if isinstance(got, RolloutError):
                            raise got
                        cache[f.name] = got if got is not None else read_rollouts(f)
                    except RolloutError as e:
                        rejected_files.append(f.name)
                        self._log_event("rejected_file", file=f.name, reason=str(e))
            usable, stats = self.rule.select(list(cache.items()), step, self.window, self._carry)
            if len(usable) >= cfg.prompts_per_step:
                break
            announced = sum(announced_groups(f) for f in files)
            # what this step's files announced and did not deliver (carried groups are not theirs: counting them
            # would hide a shortfall from the workers, who then make no more for this step)
            missing = announced - (len(usable) - stats["carried_groups"])
            if missing > 0 and all(f.name in cache or f.name in rejected_files for f in files):
                if self.run.deficit(step) != missing:
                    self.run.set_deficit(step, missing)
            if deadline is not None and time.monotonic() > deadline:
                return None
            if self.run.is_done():
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
        return Batch(chosen, sorted(cache), time.perf_counter() - t0, stats)

    def _log_event(self, kind: str, **kw) -> None:
        if self.metrics is not None:
            self.metrics.write(event=kind, **kw)

    # ---- update ------------------------------------------------------------------------------
    def update(self, groups: list[list[Rollout]]) -> dict:
        cfg = self.cfg
        seqs: list[Sequence] = []
        for g in groups:
            adv = group_advantages([r.reward for r in g], use_std=cfg.loss.use_std)  # recomputed, not trusted
            for r, a in zip(g, adv):
                seqs.append(Sequence(r.prompt_ids, r.completion_ids, r.logprobs, a, r.temperature))
        total_tokens = sum(len(s.completion_ids) for s in seqs)
        mine = seqs[self.rank:: self.world]
        passes = self.par.micro_batches([len(seqs[r:: self.world]) for r in range(self.world)], cfg.optim.micro_batch)
        self.opt.zero_grad(set_to_none=True)
        st = accumulate_gradients(self.model, mine, cfg.loss, self.tokenizer.pad_token_id, cfg.optim.micro_batch,
                                  max_tokens=cfg.sampling.max_new_tokens, world_size=self.par.loss_scale,
                                  total_sequences=len(seqs), total_tokens=total_tokens, ref_model=self.ref_model,
                                  micro_batches=passes)
        self.par.reduce_grads()
        gnorm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip))  # DTensors too
        loss = self._global_loss(st.loss)
        if math.isfinite(loss) and math.isfinite(gnorm):  # every rank's loss (a NaN anywhere makes the sum NaN)
            self.opt.step()
            self.sched.step()
            skipped = 0
        else:  # a non-finite loss or gradient: keep the weights and the optimizer's state (the schedule too),
            self.opt.zero_grad(set_to_none=True)  # drop the step; the version is still committed
            skipped = 1
            self.nonfinite_total += 1
        return {"loss": loss, "clip_frac": st.clip_frac, "clip_low_frac": st.clip_low_frac,
                "clip_high_frac": st.clip_high_frac, "delta_frac": st.delta_frac, "ratio_mean": st.ratio_mean,
                "ratio_max": st.ratio_max, "entropy": st.entropy, "kl": st.kl, "grad_norm": gnorm,
                "train_tokens": total_tokens, "lr": self.sched.get_last_lr()[0], "nonfinite_skipped": skipped,
                "nonfinite_total": self.nonfinite_total}

    def _global_loss(self, loss: float) -> float:
        """The whole batch's loss: the sum of the ranks' shares (the same number on every rank)."""
        if self.world == 1:
            return loss
        t = torch.tensor([loss], dtype=torch.float64, device=next(self.model.parameters()).device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return float(t.item())

    def evaluate(self) -> float:
        """Rank 0 (under fsdp2 on its whole copy of the weights, which ``snapshot`` keeps current)."""
        res = evaluate(self.par.full_model, self.tokenizer, self.env, n=self.cfg.eval.n,
                       max_new_tokens=self.cfg.eval.max_new_tokens, chat_template=self.cfg.chat_template)
        self.model.train()
        return res["accuracy"]

    # ---- loop --------------------------------------------------------------------------------
    def run_loop(self) -> int:
        cfg = self.cfg
        t_start = time.monotonic()
        deadline = t_start + cfg.max_minutes * 60 if cfg.max_minutes else None
        if self.readahead is not None:
            self.readahead.start(self.step)
        try:
            return self._loop(t_start, deadline)
        finally:
            if self.readahead is not None:
                self.readahead.stop()

    def _loop(self, t_start: float, deadline: float | None) -> int:
        cfg = self.cfg
        if self.rank == 0 and not self.resumed and cfg.eval.every_steps:
            self._log_event("eval", step=0, version=0, heldout_acc=self.evaluate(), wall_s=0.0)
        while self.step < cfg.steps:
            n = self.step
            batch = None
            if self.rank == 0:
                if self.readahead is not None:
                    self.readahead.at_step(n)
                batch = self.gather(n, deadline)
            if self.world > 1:
                obj = [batch]
                torch.distributed.broadcast_object_list(obj, src=0)
                batch = obj[0]
            if batch is None:
                break
            t1 = time.perf_counter()
            info = self.update(batch.groups)
            opt_state = self.par.snapshot(self.opt)  # every rank: under fsdp2 it gathers the full state to rank 0
            train_s = time.perf_counter() - t1
            if self.rank == 0:
                rows = [r for g in batch.groups for r in g]
                lags = [n - r.policy_version for r in rows]
                row = {"step": n, "version": n + 1, "wall_s": round(time.monotonic() - t_start, 3),
                       "wait_s": round(batch.wait_s, 4), "train_s": round(train_s, 4),
                       "reward": sum(r.reward for r in rows) / len(rows),
                       "task_reward": sum(r.task_reward for r in rows) / len(rows),
                       "lag_mean": sum(lags) / len(lags), "lag_max": max(lags),
                       "completion_len": sum(len(r.completion_ids) for r in rows) / len(rows),
                       "files": batch.files, **batch.stats, **info}
                if cfg.eval.every_steps and (n + 1) % cfg.eval.every_steps == 0:
                    te = time.perf_counter()
                    row["heldout_acc"] = self.evaluate()
                    row["eval_s"] = round(time.perf_counter() - te, 3)
                self._commit(n + 1, consumed=batch.files, opt_state=opt_state, metrics_row=row)
                self.metrics.write(**row)
            self._barrier()
            self.step = n + 1
        if self.rank == 0:
            final = self.evaluate()
            self._log_event("final", step=self.step, version=self.step, heldout_acc=final, wall_s=round(time.monotonic() - t_start, 3))
            self.run.done_flag.write_text(str(self.step))
            for f in self._publishing:
                f.result()
            self.metrics.close()
        self._barrier()
        return self.step


def run_trainer(cfg: RLConfig) -> int:
    return Trainer(cfg).run_loop()


__all__ = ["Trainer", "run_trainer", "allreduce_grads"]
