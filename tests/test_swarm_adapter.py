"""The adapter's polling: the trainer's step and the next every round, the steps beyond every ``ahead_every``
rounds and at each new step (so files of later steps are still fetched, with fewer requests)."""

from __future__ import annotations

import types

from swarmrl.contract import RLContract
from swarmrl.rl.config import RLConfig
from swarmrl.rundir.writer import RunDir
from swarmrl.swarm.adapter import AdapterConfig, TrainerAdapter


class _Client:
    def __init__(self) -> None:
        self.polled: list[int] = []
        self.steps: list[int] = []

    def set_step(self, step: int, version: int, metrics: list | None = None) -> None:
        self.steps.append(step)

    def accepted(self, step: int):  # noqa: ANN201
        self.polled.append(step)
        return types.SimpleNamespace(items=[])


def _commit(run: RunDir, v: int) -> None:
    d = run.staging_dir(v)
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.safetensors").write_bytes(b"")
    run.commit_version(v, d)


def test_adapter_polls_later_steps_every_ahead_every_rounds_and_at_each_new_step(tmp_path):
    rl = RLConfig(run_dir=str(tmp_path / "run"), contract=RLContract(async_level=2), steps=100)
    rl = rl.model_copy(update={"shardcast": rl.shardcast.model_copy(update={"enabled": False})})
    run = RunDir(rl.run_dir)
    _commit(run, 0)
    c = _Client()
    ad = TrainerAdapter(rl, AdapterConfig(ahead_every=3), client=c)
    ad.poll_once()  # a new step: all of 0, 1, 2
    assert c.steps == [0] and c.polled == [0, 1, 2]
    c.polled.clear()
    for _ in range(5):
        ad.poll_once()
    assert c.polled == [0, 1, 0, 1, 2, 0, 1, 0, 1, 0, 1, 2]  # rounds 2..6: step 2 at rounds 3 and 6
    c.polled.clear()
    _commit(run, 1)
    ad.poll_once()  # the trainer moved on: every open step at once
    assert c.steps == [0, 1] and c.polled == [1, 2, 3]
    every = TrainerAdapter(rl, AdapterConfig(ahead_every=1), client=_Client())
    for _ in range(3):
        every.poll_once()
    assert every.client.polled == [1, 2, 3] * 3


def test_adapter_announces_a_new_step_at_once_not_at_the_next_poll(tmp_path):
    import threading
    import time

    rl = RLConfig(run_dir=str(tmp_path / "run"), contract=RLContract(async_level=2), steps=100)
    rl = rl.model_copy(update={"shardcast": rl.shardcast.model_copy(update={"enabled": False})})
    run = RunDir(rl.run_dir)
    _commit(run, 0)
    c = _Client()
    ad = TrainerAdapter(rl, AdapterConfig(poll_s=3600.0, watch_s=0.01), client=c)
    stop = threading.Event()
    t = threading.Thread(target=ad.run_forever, args=(stop,), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 120  # a bound for a loaded machine, far inside the next poll (an hour)
        while c.steps != [0] and time.monotonic() < deadline:
            time.sleep(0.01)
        _commit(run, 1)
        while c.steps != [0, 1] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.steps == [0, 1]  # announced on the commit: the adapter's one poll is an hour away
        assert c.polled[-3:] == [1, 2, 3]
    finally:
        stop.set()
        t.join(5)
