"""The trainer's parts as interfaces: a rollout source and weight publishers written here and used by a real
trainer, the deadline that ends a run whether or not the trainer waits, the pruning of trained steps' rollout
files, and the parts of a rank other than 0, which do nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from attacks._honest import row

from swarmrl.contract import RLContract
from swarmrl.envs.config import TaskConfig
from swarmrl.rl.config import EvalSection, RLConfig, ShardcastSection
from swarmrl.rl.parts import build_parts
from swarmrl.rl.trainer import Trainer
from swarmrl.rollouts.wire import write_rollouts
from swarmrl.rundir import read_trainer_log
from swarmrl.rundir.writer import RunDir

torch.set_num_threads(1)


def _group(step: int, tag: str = "g") -> list:
    return [row(step=step, policy_version=step, reward=r, prompt_ids=[5, 6, 7], completion_ids=c,
                logprobs=[-1.0, -1.0], group_id=f"{tag}{step}") for r, c in ((1.0, [8, 9]), (0.0, [9, 8]))]


def _cfg(tmp_path: Path, model: Path, steps: int, **kw) -> RLConfig:
    return RLConfig(run_dir=str(tmp_path / "run"), model=str(model), steps=steps, keep_versions=10, prompts_per_step=1,
                    contract=RLContract(task=TaskConfig(name="add"), async_level=0, group_size=2, filter_ties=False),
                    eval=EvalSection(every_steps=0, n=2, max_new_tokens=2), **kw)


class CountingPublisher:  # a WeightPublisher: what a version weighs
    def __init__(self) -> None:
        self.bytes: dict[int, int] = {}
        self.closed = 0

    def publish(self, version: int, version_dir: Path) -> None:
        self.bytes[version] = sum(f.stat().st_size for f in version_dir.glob("*.safetensors"))

    def close(self) -> None:
        self.closed += 1


class MemorySource:  # a RolloutSource: groups held in memory, one "file" per step
    def __init__(self, steps: int) -> None:
        self.pending = {s: _group(s) for s in range(steps)}
        self.polled: list[int] = []

    def start(self, step: int) -> None: ...

    def poll(self, step: int) -> list:
        self.polled.append(step)
        rows = self.pending.pop(step, None)
        return [(f"memory-{step}", rows)] if rows else []

    def announced(self, step: int) -> tuple[int, bool]:
        return 0, True

    def report_shortfall(self, step: int, missing: int) -> None: ...

    def is_done(self) -> bool:
        return False

    def stop(self) -> None: ...


def test_a_publisher_and_a_source_written_here_drive_a_real_trainer(tmp_path, tiny_model_dir):
    pub, src = CountingPublisher(), MemorySource(3)
    t = Trainer(_cfg(tmp_path, tiny_model_dir, 3), source=src, publishers=[pub])
    assert t.run_loop() == 3
    weights = (Path(tiny_model_dir) / "model.safetensors").stat().st_size
    cast = (t.run.version_dir(1) / "model.safetensors").stat().st_size  # the published bfloat16 weights
    assert cast < weights * 0.51
    # version 0 too: the base, committed as it is (every holder's version 0 is the base itself)
    assert pub.bytes == {0: weights, 1: cast, 2: cast, 3: cast} and pub.closed == 1
    assert src.polled[:3] == [0, 1, 2] and not src.pending
    log = read_trainer_log(t.run.trainer_metrics)
    assert [r.step for r in log.steps] == [0, 1, 2] and all(r.files == [f"memory-{r.step}"] for r in log.steps)


def test_max_minutes_ends_a_run_that_never_waits(tmp_path, tiny_model_dir):
    """Every step's rollouts are on disk before the trainer starts, so it never waits: the deadline still ends
    the run (it was checked only while waiting), with its final evaluation and DONE."""
    run = RunDir(tmp_path / "run")
    for s in range(300):  # without the deadline: ~20 ms a step here, 6 s in all
        write_rollouts(_group(s), run.new_rollout_path(s, "w0", 1))
    t = Trainer(_cfg(tmp_path, tiny_model_dir, 300, max_minutes=0.005))
    done = t.run_loop()
    assert 1 <= done < 300
    assert t.run.done_flag.read_text() == str(done)
    assert any(e.event == "final" for e in read_trainer_log(t.run.trainer_metrics).evals)


def test_trained_steps_rollout_files_are_pruned(tmp_path, tiny_model_dir):
    run = RunDir(tmp_path / "run")
    for s in range(6):
        write_rollouts(_group(s), run.new_rollout_path(s, "w0", 1))
    t = Trainer(_cfg(tmp_path, tiny_model_dir, 6, keep_rollout_steps=1))
    assert t.run_loop() == 6
    assert sorted(d.name for d in run.rollouts.iterdir()) == ["step_000005"]  # steps < 6 - 1 are gone
    shutil.rmtree(run.root)
    for s in range(3):
        write_rollouts(_group(s), run.new_rollout_path(s, "w0", 1))
    t = Trainer(_cfg(tmp_path, tiny_model_dir, 3, keep_rollout_steps=-1))
    assert t.run_loop() == 3
    assert len(list(run.rollouts.iterdir())) == 3  # -1 keeps them all


def test_activation_checkpointing_is_switched_on_and_steps_record_the_peak_rss(tmp_path, tiny_model_dir):
    from swarmrl.rl.config import OptimConfig

    t = Trainer(_cfg(tmp_path, tiny_model_dir, 1, optim=OptimConfig(activation_checkpointing=True)),
                source=MemorySource(1), publishers=[])
    assert _checkpointed(t.model)
    assert t.run_loop() == 1
    rec = read_trainer_log(t.run.trainer_metrics).steps[0]
    assert rec.peak_rss_mb is not None and rec.peak_rss_mb > 50  # at least the interpreter and torch
    assert not _checkpointed(Trainer(_cfg(tmp_path / "b", tiny_model_dir, 1), source=MemorySource(1),
                                     publishers=[]).model)


def _checkpointed(model: torch.nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_the_parts_of_a_rank_other_than_0_do_nothing(tmp_path, tiny_model_dir):
    """Rank 0 collects, evaluates, records, commits and publishes; the parts another rank holds take the same calls
    and leave no trace (its batch comes by broadcast, its state part is the checkpointer's)."""
    cfg = _cfg(tmp_path, tiny_model_dir, 2).model_copy(update={"shardcast": ShardcastSection(enabled=True)})
    run, pub = RunDir(cfg.run_dir), CountingPublisher()
    parts = build_parts(cfg, run, 1, cfg.contract.window(last_step=1), tokenizer=None, env=None,
                        source=MemorySource(2), publishers=[pub])
    src = parts.source
    src.start(0)
    assert src.poll(0) == [] and src.announced(0) == (0, True) and src.is_done()
    parts.recorder.event("final", step=2, version=2, heldout_acc=None)
    parts.recorder.recover({"step": 1, "version": 2, "reward": 0.0})
    assert parts.evaluator(None) is None
    parts.versions.stage(1, None)
    parts.versions.commit(1)
    parts.versions.close(2)
    parts.recorder.close()
    assert pub.bytes == {} and pub.closed == 0  # the publishers passed in are rank 0's
    assert not any(run.metrics.iterdir()) and not run.done_flag.exists() and not any(run.policy.iterdir())
    assert not run.shardcast.exists()  # no SHARDCAST origin started
