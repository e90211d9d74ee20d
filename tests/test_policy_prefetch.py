"""A node downloads the next policy version in the background and, meanwhile, samples with a version it holds
inside the async window (swarmrl.policy.prefetch, SwarmNode.version_for)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from swarmrl.contract import RLContract
from swarmrl.envs.config import TaskConfig
from swarmrl.policy.prefetch import PrefetchingSource
from swarmrl.policy.sources import PolicyUnavailable
from swarmrl.protocol.schemas import AssignmentSpec
from swarmrl.swarm.node import SwarmNode


class SlowSource:
    """Downloads block until their version's gate opens; records what was downloaded, in order."""

    def __init__(self, root: Path, fail: set[int] | None = None) -> None:
        self.root, self.fail = root, fail or set()
        self.gates: dict[int, threading.Event] = {}
        self.calls: list[int] = []
        self.active = 0
        self.most_active = 0
        self._report: dict | None = None
        self._lock = threading.Lock()

    def gate(self, v: int) -> threading.Event:
        return self.gates.setdefault(v, threading.Event())

    def latest(self) -> int | None:
        return max(self.calls, default=None)

    def local(self, version: int) -> Path | None:
        d = self.root / f"v{version}"
        return d if d.exists() else None

    def fetch(self, version: int, timeout_s: float = 60.0) -> Path:
        d = self.root / f"v{version}"
        if d.exists():
            return d
        with self._lock:
            self.calls.append(version)
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            if not self.gate(version).wait(timeout_s):
                raise PolicyUnavailable(f"v{version}: timed out")
            if version in self.fail:
                raise PolicyUnavailable(f"v{version}: broken")
            d.mkdir(parents=True)
            self._report = {"version": version}
            return d
        finally:
            with self._lock:
                self.active -= 1

    def take_fetch_report(self) -> dict | None:
        r, self._report = self._report, None
        return r


def _until(cond, timeout: float = 5.0) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def test_a_held_version_loads_while_another_downloads(tmp_path):
    src = SlowSource(tmp_path)
    pre = PrefetchingSource(src, keep=3, timeout_s=5.0)
    src.gate(1).set()
    assert pre.fetch(1) == tmp_path / "v1"  # a foreground download
    pre.prefetch(2)
    _until(lambda: src.calls == [1, 2])
    assert pre.in_flight() == 2 and pre.held() == [0, 1] and not pre.has(2)
    assert pre.wait_for(2, 0.05) is False  # the grace runs out while v2 is still on its way
    assert pre.fetch(1) == tmp_path / "v1"  # held: no wait behind v2's download
    # had it waited behind v2 (whose gate is shut), v2 would have timed out (timeout_s) before it returned
    assert pre.in_flight() == 2 and src.calls == [1, 2]
    src.gate(2).set()
    assert pre.wait_for(2, 5.0) is True and pre.held() == [0, 1, 2] and pre.in_flight() is None
    assert [pre.take_fetch_report(), pre.take_fetch_report(), pre.take_fetch_report()] == \
        [{"version": 1}, {"version": 2}, None]


def test_one_download_at_a_time_and_the_newest_wanted_next(tmp_path):
    src = SlowSource(tmp_path)
    pre = PrefetchingSource(src, keep=2, timeout_s=5.0)
    pre.prefetch(1)
    _until(lambda: pre.in_flight() == 1)
    for v in (2, 3, 4):  # announced while v1 downloads: only the newest is fetched after it
        pre.prefetch(v)
    src.gate(1).set()
    _until(lambda: src.calls == [1, 4])
    src.gate(4).set()
    _until(lambda: pre.in_flight() is None)
    assert src.calls == [1, 4] and src.most_active == 1
    assert pre.held() == [0, 1, 4]
    pre.prefetch(3)  # older than what is held: not fetched
    assert pre.in_flight() is None and src.calls == [1, 4]
    src.gate(5).set()
    pre.fetch(5)
    assert pre.held() == [0, 4, 5]  # the newest keep=2 downloads, and the base


def test_a_failed_prefetch_is_tried_again_in_the_foreground(tmp_path):
    src = SlowSource(tmp_path, fail={2})
    pre = PrefetchingSource(src, timeout_s=5.0)
    src.gate(2).set()
    pre.prefetch(2)
    _until(lambda: pre.in_flight() is None)
    assert not pre.has(2)
    with pytest.raises(PolicyUnavailable, match="broken"):
        pre.fetch(2)
    src.fail.clear()
    assert pre.fetch(2) == tmp_path / "v2" and src.calls == [2, 2, 2]


def _assignment(step: int, version: int, k: int = 2) -> AssignmentSpec:
    return AssignmentSpec(assignment_id=1, step=step, policy_version=version, seed=1, target_length=None, tasks=[],
                          contract=RLContract(task=TaskConfig(name="add", params={}), group_size=2, async_level=k))


def _node(pre: PrefetchingSource | None, loaded: int = -1, grace: float = 0.05) -> SimpleNamespace:
    return SimpleNamespace(prefetcher=pre, policy=SimpleNamespace(version=loaded),
                           cfg=SimpleNamespace(hold_grace_s=grace))


def test_the_node_samples_with_a_held_version_inside_the_window(tmp_path):
    src = SlowSource(tmp_path)
    pre = PrefetchingSource(src, timeout_s=5.0)
    for v in (3, 4):
        src.gate(v).set()
        pre.fetch(v)
    node = _node(pre, loaded=4)
    # v6 is on its way: step 6 may use versions 4..6, so v4 serves it and v6 goes on downloading
    assert SwarmNode.version_for(node, _assignment(6, 6)) == 4
    assert pre.in_flight() == 6
    # step 7 may use 5..7: nothing held serves it, so the node waits for the assigned version
    assert SwarmNode.version_for(node, _assignment(7, 6)) == 6
    # async_level 0: only the assigned version serves
    assert SwarmNode.version_for(node, _assignment(6, 6, k=0)) == 6
    # the assigned version arriving within the grace is used
    threading.Timer(0.05, src.gate(6).set).start()
    assert SwarmNode.version_for(_node(pre, loaded=4, grace=5.0), _assignment(6, 6)) == 6
    # without hold_policy: always the assigned one
    assert SwarmNode.version_for(_node(None, loaded=4), _assignment(6, 9)) == 9
    # reopened work named an older version than the node holds: the newest held inside the window serves
    assert SwarmNode.version_for(node, _assignment(6, 2)) == 6


def test_a_version_gone_from_disk_is_not_held(tmp_path):
    """The inner source says what it still has (``local``): a version it evicted must be downloaded again,
    behind the one download at a time, not picked as held."""
    src = SlowSource(tmp_path)
    pre = PrefetchingSource(src, timeout_s=5.0)
    src.gate(1).set()
    pre.fetch(1)
    assert pre.has(1)
    (tmp_path / "v1").rmdir()
    assert not pre.has(1) and pre.held() == [0]

