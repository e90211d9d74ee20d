import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swarmrl.contract import GroupRule, RLContract, Rollout
from swarmrl.rl.config import RLConfig
from swarmrl.rollouts.limits import RolloutLimits
from swarmrl.rollouts.wire import (
    SCHEMA,
    RolloutError,
    check_rollouts,
    read_group_keys,
    read_rollouts,
    to_table,
    write_rollouts,
)


def select_groups(rows_by_file, step, cfg):
    """The trainer's selection for ``cfg`` (its rule and window come from the RL config)."""
    return cfg.contract.group_rule().select(rows_by_file, step, cfg.contract.window())


def row(**kw) -> Rollout:
    base = dict(worker_id="w0", step=5, policy_version=4, task_id="t", env="mul_add", group_id="g0",
                prompt_ids=[1, 2, 3], completion_ids=[4, 2], logprobs=[-0.5, -0.125], reward=1.0, task_reward=1.0,
                length_penalty=0.0, target_length=None, temperature=1.0, finished=True, seed=9,
                proofs=[b"\x00\x01"])
    base.update(kw)
    return Rollout(**base)


def test_parquet_round_trip(tmp_path):
    rows = [row(), row(group_id="g1", target_length=8, proofs=[], reward=0.25)]
    p = write_rollouts(rows, tmp_path / "a.parquet")
    back = read_rollouts(p)
    assert back == rows
    assert pq.read_schema(p).names == SCHEMA.names
    assert not list(tmp_path.glob(".*tmp*"))  # atomic write leaves no temp file


@pytest.mark.parametrize("bad,reason", [
    (dict(logprobs=[-0.5]), "logprobs for"),
    (dict(logprobs=[0.5, -0.125]), "logprobs must be"),
    (dict(logprobs=[float("nan"), -0.125]), "logprobs must be"),
    (dict(completion_ids=[]), "completion length"),
    (dict(prompt_ids=[-1]), "negative token"),
    (dict(reward=float("inf")), "reward is not finite"),
    (dict(policy_version=-3), "negative step"),
])
def test_bad_rows_are_rejected_with_reason(tmp_path, bad, reason):
    p = write_rollouts([row(**bad)], tmp_path / "b.parquet")
    with pytest.raises(RolloutError, match=reason):
        read_rollouts(p)


def test_wrong_schema_and_garbage_and_size_limits(tmp_path):
    t = to_table([row()]).drop_columns(["length_penalty"])
    pq.write_table(t, tmp_path / "c.parquet")
    with pytest.raises(RolloutError, match="missing columns"):
        read_rollouts(tmp_path / "c.parquet")
    t2 = to_table([row()]).set_column(0, "worker_id", pa.array([7], pa.int64()))
    pq.write_table(t2, tmp_path / "d.parquet")
    with pytest.raises(RolloutError, match="worker_id"):
        read_rollouts(tmp_path / "d.parquet")
    (tmp_path / "e.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(RolloutError, match="not a readable parquet"):
        read_rollouts(tmp_path / "e.parquet")
    p = write_rollouts([row()] * 10, tmp_path / "f.parquet")
    with pytest.raises(RolloutError, match="row limit|rows, over"):
        read_rollouts(p, RolloutLimits(max_rows=5))
    with pytest.raises(RolloutError, match="byte limit"):
        read_rollouts(p, RolloutLimits(max_bytes=100))
    with pytest.raises(RolloutError, match="proofs over"):
        read_rollouts(write_rollouts([row(proofs=[b"x" * 10])], tmp_path / "g.parquet"), RolloutLimits(max_proof_bytes=4))


def test_a_file_with_the_old_advantage_column_is_refused_by_every_reader(tmp_path):
    """Rows no longer carry an advantage (the trainer computes it from the rewards by its loss's rule): a file an
    older version wrote, with its ``advantage`` column where it stood, is refused as any file whose columns differ
    from the schema, by every reader, with the reason; as a file without ``completion_mask`` is."""
    t = to_table([row(), row(group_id="g1")])
    t = t.add_column(t.schema.get_field_index("length_penalty") + 1, pa.field("advantage", pa.float32(), nullable=False),
                     pa.array([0.5, -0.5], pa.float32()))
    pq.write_table(t, tmp_path / "old.parquet")
    for reader in (read_rollouts, check_rollouts, read_group_keys):
        with pytest.raises(RolloutError, match=r"unexpected columns \['advantage'\] \(a file from before the trainer "
                                               "computed advantages itself"):
            reader(tmp_path / "old.parquet")
    both = t.drop_columns(["completion_mask"])  # older still: from before multi-turn rows too
    pq.write_table(both, tmp_path / "older.parquet")
    with pytest.raises(RolloutError, match="before multi-turn rows; a file from before the trainer computed"):
        read_rollouts(tmp_path / "older.parquet")
    assert "advantage" not in SCHEMA.names


def test_group_keys_are_the_rows_grouping_fields_and_still_bounded(tmp_path):
    """The adapter's reader of an upload the orchestrator already read whole: the same grouping fields and the
    same usable-group count as ``read_rollouts`` gives, and the file-level bounds still refuse."""
    rows = [row(group_id=f"g{i // 2}", reward=float(i % 3 == 0), policy_version=i % 2, worker_id=f"w{i // 4}")
            for i in range(12)]
    p = write_rollouts(rows, tmp_path / "a.parquet")
    keys = read_group_keys(p)
    assert [tuple(k) for k in keys] == [(r.worker_id, r.group_id, r.step, r.policy_version, r.reward)
                                        for r in read_rollouts(p)]
    assert check_rollouts(p) == keys  # the orchestrator's reader: every column checked, these fields kept
    rule = GroupRule(2)
    assert rule.count_usable(keys) == rule.count_usable(rows) > 0
    with pytest.raises(RolloutError, match="proofs over"):  # a column it does not keep is still checked
        check_rollouts(write_rollouts([row(proofs=[b"x" * 10])], tmp_path / "g.parquet"), RolloutLimits(max_proof_bytes=4))
    with pytest.raises(RolloutError, match="row limit|rows, over"):
        read_group_keys(p, RolloutLimits(max_rows=5))
    with pytest.raises(RolloutError, match="byte limit"):
        read_group_keys(p, RolloutLimits(max_bytes=100))
    (tmp_path / "e.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(RolloutError, match="not a readable parquet"):
        read_group_keys(tmp_path / "e.parquet")
    pq.write_table(to_table(rows).drop_columns(["reward"]), tmp_path / "c.parquet")
    with pytest.raises(RolloutError, match="missing columns"):
        read_group_keys(tmp_path / "c.parquet")


def _group(gid, rewards, version, step=5, worker="w0"):
    return [row(group_id=gid, reward=r, policy_version=version, step=step, worker_id=worker) for r in rewards]


def test_staleness_gate_and_filters():
    cfg = RLConfig(contract=RLContract(async_level=2, group_size=4), prompts_per_step=10)
    rows = (_group("fresh", [1, 0, 0, 1], 5) + _group("ok_old", [1, 0, 0, 0], 3)
            + _group("too_old", [1, 0, 1, 0], 2) + _group("future", [0, 1, 0, 0], 6)
            + _group("tied", [1, 1, 1, 1], 4) + _group("short", [1, 0, 1], 4)
            + _group("other_step", [1, 0, 0, 0], 4, step=6))
    usable, stats = select_groups([("f", rows)], 5, cfg)
    assert [g[0].group_id for g in usable] == ["fresh", "ok_old"]
    assert stats["stale_rows"] == 8 and stats["tied_groups"] == 1 and stats["incomplete_groups"] == 1
    assert stats["wrong_step_rows"] == 4
    # synchronous mode accepts only the current policy
    usable0, _ = select_groups([("f", rows)], 5, RLConfig(contract=RLContract(async_level=0, group_size=4)))
    assert [g[0].group_id for g in usable0] == ["fresh"]
    # without the tie filter the tied group is kept
    usable_nf, _ = select_groups([("f", rows)], 5, RLConfig(contract=RLContract(async_level=2, group_size=4, filter_ties=False)))
    assert "tied" in [g[0].group_id for g in usable_nf]


def test_same_group_id_from_two_workers_stays_separate():
    cfg = RLConfig(contract=RLContract(async_level=1, group_size=2))
    rows = _group("g", [1, 0], 5, worker="a") + _group("g", [0, 1], 5, worker="b")
    usable, _ = select_groups([("f", rows)], 5, cfg)
    assert len(usable) == 2 and all(len(g) == 2 for g in usable)


def test_config_rejects_keep_versions_below_the_async_level():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="keep_versions"):
        RLConfig(contract=RLContract(async_level=4), keep_versions=2)
