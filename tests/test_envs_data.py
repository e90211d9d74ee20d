"""Task splits, determinism, shipped sample files, and clear errors for bad task files."""

from __future__ import annotations

import json

import pytest

from swarmrl.envs import available_envs, make_env
from swarmrl.envs.code import DEFAULT_CODE_PATH, CodeEnv
from swarmrl.envs.datafile import DataFileError, load_records
from swarmrl.envs.math import DEFAULT_MATH_PATH, MathEnv


def test_registry_lists_all():
    assert {"add", "mul_add", "math", "code"} <= set(available_envs())
    with pytest.raises(ValueError, match="bad parameters"):
        make_env("math", nonsense=1)


@pytest.mark.parametrize("name,params", [("mul_add", {}), ("add", {"digits": 2}), ("math", {"heldout_pct": 25.0}),
                                         ("code", {"heldout_pct": 25.0})])
def test_splits_disjoint_and_deterministic(name, params):
    env = make_env(name, **params)
    held = env.heldout_set(16)
    held_ids = {t.task_id for t in held}
    assert held_ids
    for seed in range(200):
        batch = env.sample(seed, 8)
        assert len(batch) == 8
        assert not held_ids & {t.task_id for t in batch}
    assert [t.task_id for t in env.sample(7, 8)] == [t.task_id for t in make_env(name, **params).sample(7, 8)]
    assert [t.task_id for t in env.sample(7, 8)] != [t.task_id for t in env.sample(8, 8)] or name == "code"
    assert [t.task_id for t in env.heldout_set(16)] == [t.task_id for t in held]
    assert all(t.env == name or name in ("add", "mul_add") for t in held)


@pytest.mark.parametrize("cls", [MathEnv, CodeEnv])
def test_file_env_split_is_a_partition(cls):
    env = cls(heldout_pct=30.0)
    train = {t.task_id for t in env.split_tasks("train")}
    held = {t.task_id for t in env.split_tasks("heldout")}
    assert train and held and not train & held
    assert train | held == {t.task_id for t in env.tasks}
    # every held-out task is reachable by heldout sampling, never by train sampling
    seen_train = {t.task_id for s in range(50) for t in env.sample(s, len(train))}
    assert seen_train == train
    assert {t.task_id for t in env.sample(0, 10_000, "heldout")} == held  # capped, distinct
    assert len(env.sample(0, 3 * len(train))) == 3 * len(train)
    with pytest.raises(ValueError):
        env.sample(0, 1, "validation")  # type: ignore[arg-type]


def test_shipped_samples_load_and_demonstrations_verify():
    m = MathEnv()
    assert 30 <= len(m.tasks) <= 60 and m.path == DEFAULT_MATH_PATH
    assert all(t.task_type == "verifiable_math" and t.demonstration for t in m.tasks)
    for t in m.tasks:
        assert m.verify(t, t.demonstration) == 1.0, t.task_id
    c = CodeEnv()
    assert 10 <= len(c.tasks) <= 20 and c.path == DEFAULT_CODE_PATH
    for t in c.tasks:
        assert c.verify(t, t.demonstration) == 1.0, t.task_id
        assert c.verify(t, "```python\nprint('nope')\n```") < 1.0, t.task_id


def write(tmp_path, lines, name="tasks.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


GOOD_MATH = json.dumps({"prompt": "1+1?", "verification_info": {"ground_truth": "2"}})


@pytest.mark.parametrize("bad,msg", [
    ("{not json", "invalid JSON"),
    (json.dumps([1, 2]), "expected a JSON object"),
    (json.dumps({"verification_info": {"ground_truth": "1"}}), "'prompt'"),
    (json.dumps({"prompt": "q", "verification_info": "{oops"}), "verification_info"),
    (json.dumps({"prompt": "q", "verification_info": [1]}), "verification_info"),
    (json.dumps({"prompt": "q", "verification_info": {}}), "ground_truth"),
    (json.dumps({"prompt": "q", "verification_info": {"ground_truth": "1"}, "solution": 3}), "solution"),
])
def test_malformed_math_file_names_file_and_line(tmp_path, bad, msg):
    p = write(tmp_path, [GOOD_MATH, "", bad])
    with pytest.raises(DataFileError, match=msg) as ei:
        MathEnv(path=str(p))
    assert f"{p}:3" in str(ei.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataFileError, match="not found") as ei:
        MathEnv(path=str(tmp_path / "nope.jsonl"))
    assert "nope.jsonl" in str(ei.value)
    with pytest.raises(DataFileError, match="no records"):
        MathEnv(path=str(write(tmp_path, [""])))
    with pytest.raises(ValueError, match="bad parameters|not found"):
        make_env("code", path=str(tmp_path / "missing.jsonl"))


def test_duplicate_ids(tmp_path):
    p = write(tmp_path, [GOOD_MATH, GOOD_MATH])
    with pytest.raises(DataFileError, match="duplicate") as ei:
        MathEnv(path=str(p))
    assert f"{p}:2" in str(ei.value)


@pytest.mark.parametrize("vi,msg", [
    ({"language": "rust", "test_cases": [{"input": "", "output": ""}]}, "unsupported language"),
    ({"test_cases": [{"input": ""}]}, "input and output"),
    ({"test_cases": [{"input": 1, "output": "1"}]}, "must be strings"),
    ({"tests": "assert ("}, "bad verification_info"),
    ({}, "no tests"),
    ({"test_cases": [{"input": "", "output": ""}] * 100}, "over the limit"),
])
def test_malformed_code_file(tmp_path, vi, msg):
    good = json.dumps({"prompt": "q0", "verification_info": {"test_cases": [{"input": "", "output": "1"}]}})
    p = write(tmp_path, [good, json.dumps({"prompt": "q", "verification_info": vi})])
    with pytest.raises(DataFileError, match=msg) as ei:
        CodeEnv(path=str(p))
    assert f"{p}:2" in str(ei.value)


def test_parquet_and_json_string_fields(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"problem_id": f"p{i}", "prompt": f"What is {i}+{i}?", "task_type": "verifiable_math",
             "verification_info": json.dumps({"ground_truth": str(2 * i)})} for i in range(40)]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    env = MathEnv(path=str(path))
    assert len(env.tasks) == 40 and env.tasks[3].task_id == "math:p3"
    assert env.verify(env.tasks[3], r"\boxed{6}") == 1.0
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataFileError, match="bad.parquet"):
        load_records(tmp_path / "bad.parquet", "x")


def test_heldout_pct_validation():
    with pytest.raises(ValueError):
        MathEnv(heldout_pct=0)
    with pytest.raises(ValueError):
        CodeEnv(heldout_pct=100)
