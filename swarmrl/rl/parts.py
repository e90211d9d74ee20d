"""The trainer's rank-aware parts: what rank 0 alone does, as objects every rank holds.

Under torchrun (WORLD_SIZE > 1) rank 0 collects each step's rollouts, evaluates, writes the run directory's
versions and records, tracks and publishes, while every rank trains its share and saves its part of the state.
``build_parts`` gives rank 0 the parts that do this and every other rank parts of the same methods that do
nothing, so the trainer's loop and commit path run the same code on every rank, with no branch on the rank:

- ``source`` (``rl.sources.RolloutSource``): the run directory's rollout files, or the one passed in; elsewhere
  ``NoRollouts`` (rank 0 broadcasts the batch: ``training.parallel``);
- ``recorder`` (``Recorder``): ``metrics/trainer.jsonl`` (one ``StepRecord`` per step, evaluations, events) and the
  tracker (``rl.tracking``); elsewhere ``NoRecorder``;
- ``evaluator`` (``Evaluator``): held-out accuracy of the gathered model; elsewhere ``NoEvaluator`` (None);
- ``versions`` (``VersionWriter``): a version's weights staged, the version renamed into place, older states
  dropped, the ``publishers`` handed it (``rl.publish``), old versions and trained rollouts pruned, DONE written;
  elsewhere ``NoVersionWriter``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from swarmrl.contract import AsyncWindow
from swarmrl.envs.base import Environment
from swarmrl.eval.heldout import evaluate
from swarmrl.models.io import save_inference_weights
from swarmrl.rl.config import RLConfig
from swarmrl.rl.lora import LoraPolicy
from swarmrl.rl.publish import DeltaPublisher, ShardcastPublisher, WeightPublisher
from swarmrl.rl.sources import NoRollouts, RolloutSource, RunDirRolloutSource
from swarmrl.rl.tracking import SafeTracker, Tracker, make_tracker, numbers
from swarmrl.rundir import EvalRecord, StepRecord, read_trainer_log
from swarmrl.rundir.layout import MASTER_DIR, STATE_DIR
from swarmrl.rundir.writer import RunDir
from swarmrl.toploc.thresholds_file import copy_calibration
from swarmrl.utils.metrics import MetricsWriter


class Recorder:
    """Rank 0's records: every row goes to ``metrics/trainer.jsonl``, and the numbers of steps and evaluations to
    the tracker as well."""

    def __init__(self, path: Path, tracker: Tracker | None) -> None:
        self.metrics = MetricsWriter(path)
        self.tracker = SafeTracker(tracker)

    def event(self, kind: str, **kw: Any) -> None:
        """An event row (``eval`` and ``final`` evaluations are tracked too)."""
        self.metrics.write(event=kind, **kw)
        if kind in ("eval", "final"):
            self.tracker.log(kw["step"], numbers(EvalRecord(event=kind, **kw)))

    def step(self, record: StepRecord) -> None:
        self.metrics.write(**record.model_dump(exclude_none=True, exclude={"time"}))
        self.tracker.log(record.step, numbers(record))

    def recover(self, row: dict | None) -> None:
        """A crash between a version's commit and its metrics row lost the row: write it from the checkpoint."""
        if not row:
            return
        done = {r.step for r in read_trainer_log(self.metrics.path).steps}
        if row["step"] not in done:
            self.metrics.write(**row)

    def close(self) -> None:
        self.tracker.close()
        self.metrics.close()


class NoRecorder:
    """The records of a rank other than 0: none."""

    def event(self, kind: str, **kw: Any) -> None:
        pass

    def step(self, record: StepRecord) -> None:
        pass

    def recover(self, row: dict | None) -> None:
        pass

    def close(self) -> None:
        pass


class Evaluator:
    """Rank 0: held-out accuracy (greedy) of the gathered model on the run's task; the model evaluated is put back
    in the mode it was in (under "ddp" it is the policy being trained, in train mode)."""

    def __init__(self, cfg: RLConfig, tokenizer: Any, env: Environment) -> None:
        self.cfg, self.tokenizer, self.env = cfg, tokenizer, env

    def __call__(self, full: torch.nn.Module | None) -> float | None:
        was = full.training
        res = evaluate(full, self.tokenizer, self.env, n=self.cfg.eval.n, limits=self.cfg.eval,
                       chat_template=self.cfg.contract.chat_template)
        full.train(was)
        return res["accuracy"]


class NoEvaluator:
    """A rank other than 0 holds no whole model to evaluate: no accuracy."""

    def __call__(self, full: torch.nn.Module | None) -> float | None:
        return None


class VersionWriter:
    """Rank 0's side of committing a version in the run directory (the state's parts are every rank's:
    ``training.checkpoint``)."""

    def __init__(self, cfg: RLConfig, run: RunDir, tokenizer: Any, publishers: list[WeightPublisher]) -> None:
        self.cfg, self.run, self.tokenizer, self.publishers = cfg, run, tokenizer, publishers

    def stage(self, version: int, full: torch.nn.Module | None, lora: LoraPolicy | None = None) -> None:
        """The weights (``full``, the gathered model; with ``lora``, a LoRA run's policy, the adapter after version
        0), tokenizer and TOPLOC calibration into a fresh staging directory (``RunDir.staging_dir``)."""
        staged = self.run.staging_dir(version)
        was = full.training
        full.eval()
        if lora is not None and version:  # a LoRA run's versions after 0 are the adapter alone
            lora.save(staged, self.tokenizer)
        elif lora is not None:  # its version 0 is the base itself
            lora.save_base(staged, self.tokenizer)
        else:
            # version 0 is the base model as every holder has it (a node's is the base itself): never a cast
            dtype = self.cfg.contract.weights.dtype if version else "float32"
            save_inference_weights(full, staged, dtype, master_dir=staged / MASTER_DIR)
            self.tokenizer.save_pretrained(staged)
        copy_calibration(self.cfg.model, staged)  # per-model TOPLOC thresholds travel with every version
        full.train(was)

    def commit(self, version: int) -> None:
        """Rename the staged version into place, drop older versions' states, publish it, prune."""
        cfg, run = self.cfg, self.run
        run.commit_version(version, run.policies.staging_path(version))
        run.policies.drop_older_states(STATE_DIR)  # after LATEST names the new version and its state
        run.policies.drop_older_states(MASTER_DIR)
        self.publish(version)
        run.prune_versions(cfg.keep_versions)
        if cfg.keep_rollout_steps >= 0:  # the trainer never reads the steps it has trained again
            run.prune_rollouts(before_step=version - cfg.keep_rollout_steps)

    def publish(self, version: int) -> None:
        for p in self.publishers:
            p.publish(version, self.run.version_dir(version))

    def close(self, step: int) -> None:
        """The run is over at ``step``: DONE, and every publication in flight waited for."""
        self.run.done_flag.write_text(str(step))
        for p in self.publishers:
            p.close()


class NoVersionWriter:
    """A rank other than 0 writes no version (only its part of the state)."""

    def stage(self, version: int, full: torch.nn.Module | None, lora: LoraPolicy | None = None) -> None:
        pass

    def commit(self, version: int) -> None:
        pass

    def publish(self, version: int) -> None:
        pass

    def close(self, step: int) -> None:
        pass


@dataclass
class TrainerParts:
    source: RolloutSource
    recorder: Recorder | NoRecorder
    evaluator: Evaluator | NoEvaluator
    versions: VersionWriter | NoVersionWriter


def build_parts(cfg: RLConfig, run: RunDir, rank: int, window: AsyncWindow, *, tokenizer: Any, env: Environment,
                source: RolloutSource | None = None, publishers: Sequence[WeightPublisher] = ()) -> TrainerParts:
    """Rank 0's parts (``source``: where rollouts come from, default the run directory; ``publishers``: more places
    a committed version goes, after the SHARDCAST origin when ``shardcast.enabled``); on every other rank, parts
    that do nothing. They need no model: built before it loads, the SHARDCAST origin is up (and announced in the
    run directory) while the trainer loads its weights, so the launcher's relays are up before version 1."""
    if rank != 0:
        return TrainerParts(NoRollouts(), NoRecorder(), NoEvaluator(), NoVersionWriter())
    recorder = Recorder(run.trainer_metrics, make_tracker(cfg.tracking, cfg.run_dir, cfg.model_dump(mode="json")))
    source = source or RunDirRolloutSource(
        run, window, read_ahead=cfg.trainer.read_ahead, poll_s=cfg.trainer.poll_s,
        on_reject=lambda name, why: recorder.event("rejected_file", file=name, reason=why))
    pubs: list[WeightPublisher] = []
    if cfg.shardcast.enabled:
        sc = cfg.shardcast
        rule = cfg.contract.weights
        kw = dict(keep=rule.versions_to_serve(sc.keep), shard_size=sc.shard_size, port=sc.origin_port,
                  host=sc.origin_host, public_host=sc.origin_public_host, base_model=cfg.model,
                  on_error=lambda version, e: recorder.event("publish_failed", version=version, reason=str(e)))
        # versions as deltas (``contract.weights``); a LoRA run's adapters go whole either way
        delta = rule.encoding == "delta" and not cfg.lora.enabled
        pubs.append(DeltaPublisher(run, rule=rule, **kw) if delta else ShardcastPublisher(run, **kw))
    pubs += list(publishers)
    return TrainerParts(source, recorder, Evaluator(cfg, tokenizer, env), VersionWriter(cfg, run, tokenizer, pubs))
