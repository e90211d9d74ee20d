"""Hostile outsiders: the upload bomb. A few kilobytes of zstd parquet whose rows are each of legal shape
decode to gigabytes; every uploaded file is bounded after decoding (``RolloutLimits``), from its metadata
and then batch by batch, so refusing one costs next to no memory, and the orchestrator answers 413 naming
the limit that was hit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from protocol_support import make_cfg, rollouts_for, running, write

from attacks._honest import row
from swarmrl.attacks.bomb import write_bomb
from swarmrl.config import ConfigError, dump_config, load_config
from swarmrl.contract import RLContract
from swarmrl.envs.config import TaskConfig
from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.protocol.signing import generate_key
from swarmrl.rl.config import RLConfig
from swarmrl.rollouts.limits import RolloutLimits
from swarmrl.rollouts.wire import (
    SCHEMA,
    RolloutError,
    metadata_decoded_bytes,
    read_rollouts,
    to_table,
    write_rollouts,
)
from swarmrl.utils.keys import save_private_key
from swarmrl.utils.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def string_bomb(path: Path, n_rows: int = 2048, size: int = 1 << 20) -> Path:
    """Every row's group_id is the same 1 MiB string: stored once (a dictionary page), 2 GiB decoded."""
    t = to_table([row()] * n_rows)
    big = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n_rows, np.int32)), pa.array(["x" * size]))
    t = t.set_column(t.schema.get_field_index("group_id"), "group_id", big)
    pq.write_table(t, path, compression="zstd", store_schema=False)  # the file says: a plain string column
    return path


def proof_bomb(path: Path, n_rows: int = 128, per_row: int = 4096, size: int = 4096) -> Path:
    """Every row carries the most proofs of the largest size allowed, all one value: 2 GiB decoded."""
    t = to_table([row()] * n_rows)
    offsets = pa.array(np.arange(0, (n_rows + 1) * per_row, per_row, dtype=np.int32))
    values = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n_rows * per_row, np.int32)), pa.array([b"p" * size]))
    t = t.set_column(t.schema.get_field_index("proofs"), "proofs", pa.ListArray.from_arrays(offsets, values))
    pq.write_table(t, path, compression="zstd", store_schema=False)
    return path


BOMBS = {"tokens": lambda p: write_bomb(p, 2 * GiB), "strings": string_bomb, "proofs": proof_bomb}
FULL_STRENGTH = 2 * GiB  # what every bomb here decodes to (pinned: a test of a weaker bomb would pass as well)


def decoded_bytes(path: Path) -> int:
    """What ``path`` decodes to, counted without decoding it: numbers from the metadata (values x width), strings
    and binaries read as dictionaries (repeated values counted, not expanded)."""
    f = pq.ParquetFile(path)
    total = 0
    for field in f.schema_arrow:
        listed = pa.types.is_list(field.type)
        leaf = field.type.value_type if listed else field.type
        if pa.types.is_string(leaf) or pa.types.is_binary(leaf):
            col = pq.read_table(path, columns=[field.name],
                                read_dictionary=[f"{field.name}.list.element" if listed else field.name]).column(0)
            for chunk in col.chunks:
                d = chunk.values if listed else chunk
                total += pc.sum(pc.take(pc.binary_length(d.dictionary), d.indices)).as_py() or 0
        else:
            md = f.metadata
            total += sum(md.row_group(i).column(j).num_values * leaf.bit_width // 8
                         for i in range(md.num_row_groups) for j in range(md.num_columns)
                         if md.row_group(i).column(j).path_in_schema.split(".")[0] == field.name)
    return total

# a fresh process reads the file with the default limits (the orchestrator's, see below) under an address-space
# cap (so a reader that does materialise the bomb dies instead of taking the machine), and reports its peak RSS
READER = textwrap.dedent("""
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    from swarmrl.rollouts.wire import RolloutError, read_rollouts
    try:
        rows = read_rollouts(sys.argv[1])
        out = {"rows": len(rows)}
    except RolloutError as e:
        out = {"refused": str(e), "limit": getattr(e, "limit", None)}
    except MemoryError as e:
        out = {"died": repr(e)[:200]}
    hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
    out["peak_rss"] = int(hwm.split()[1]) * 1024
    print(json.dumps(out))
""")


@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_reading_a_bomb_is_refused_in_little_memory(tmp_path, kind):
    path = BOMBS[kind](tmp_path / f"{kind}.parquet")
    assert path.stat().st_size < 64 * 1024  # kilobytes on disk ...
    assert decoded_bytes(path) >= FULL_STRENGTH  # ... gigabytes decoded: the bomb at its full strength
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True, env=env,
                       timeout=300)
    lines = r.stdout.strip().splitlines()
    assert lines, f"reader died: rc={r.returncode} {r.stderr[-500:]}"
    out = json.loads(lines[-1])
    # ... gigabytes decoded: refused for its decoded size, never materialised
    assert out.get("limit") == "max_decoded_bytes" and "max_decoded_bytes" in out.get("refused", ""), out
    assert out["peak_rss"] < GiB, out


def test_the_bomb_decodes_to_the_legal_rows_it_describes(tmp_path, monkeypatch):
    """The bomb is written page by page (not by a parquet writer): a small one, over several row groups, reads
    back with pyarrow as exactly the rows it describes, each of legal shape (read_rollouts with room for them),
    and decodes to the size its metadata states (what the orchestrator refuses it for)."""
    import swarmrl.attacks.bomb as bomb_mod  # noqa: PLC0415

    # the full-size bomb: a few kilobytes, 2 GiB decoded by its metadata
    big = write_bomb(tmp_path / "big.parquet", 2 * GiB)
    assert big.stat().st_size < 16 * 1024 and metadata_decoded_bytes(pq.ParquetFile(big).metadata) >= 2 * GiB
    monkeypatch.setattr(bomb_mod, "ROWS_PER_GROUP", 2)
    path = write_bomb(tmp_path / "small.parquet", 5 * bomb_mod.ROW_BYTES, worker_id="w1", step=3, policy_version=2,
                      seed=11, env="add", task_ids=["ta", "tb"], group_size=2, group_prefix="a7")
    md = pq.ParquetFile(path).metadata
    assert (md.num_rows, md.num_row_groups) == (5, 3)
    table = pq.read_table(path)
    assert table.schema.equals(SCHEMA)
    flat = sum(table.column(c).combine_chunks().flatten().nbytes
               for c in ("prompt_ids", "completion_ids", "logprobs", "completion_mask"))
    assert flat == 5 * bomb_mod.ROW_BYTES <= metadata_decoded_bytes(md)
    rows = read_rollouts(path, RolloutLimits(max_decoded_bytes=GiB))
    assert [(r.task_id, r.group_id) for r in rows] == [("ta", "a7-0"), ("ta", "a7-0"), ("tb", "a7-1"),
                                                       ("tb", "a7-1"), ("ta", "a7-0")]
    r = rows[4]
    assert (r.worker_id, r.step, r.policy_version, r.seed, r.env) == ("w1", 3, 2, 11, "add")
    assert r.prompt_ids == [7] * bomb_mod.TOKENS and r.completion_ids == [7] * bomb_mod.TOKENS
    assert r.logprobs == [-0.5] * bomb_mod.TOKENS and r.proofs == [] and r.target_length is None
    assert r.completion_mask is None  # all ones: single-turn rows


def test_bomb_upload_refused_with_413_naming_the_limit_then_honest_work_accepted(tmp_path):
    cfg, _ = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        a = node.heartbeat().assignments[0]
        # rows of legal shape naming this node, step and seed: only their decoded size gives them away
        bomb = write_bomb(tmp_path / "bomb.parquet", 128 << 20, worker_id=node.node_id, step=a.step,
                          policy_version=a.policy_version, seed=a.seed, env=a.contract.task.name,
                          task_ids=[t.task_id for t in a.tasks], group_size=a.contract.group_size)
        with pytest.raises(ApiError) as e:
            node.submit(a.assignment_id, bomb)
        assert e.value.status == 413 and "max_decoded_bytes" in e.value.detail, e.value
        assert list(srv.orch.store.tmp.iterdir()) == []  # nothing kept
        assert srv.orch.stats.health().ok
        # the node is neither ejected nor slashed (the file was never accepted), and honest work still goes in
        assert srv.orch.membership.node_info(node.node_id).status == "active"
        assert srv.orch.ledger.balance(node.node_id).stake == pytest.approx(100.0)
        honest = write(rollouts_for(node.node_id, a), tmp_path / "honest.parquet")
        rep = node.submit(a.assignment_id, honest)
        assert rep.status == "pending" and rep.n_rows == len(a.tasks) * a.contract.group_size


def test_orchestrator_limits_come_from_its_config(tmp_path):
    # the orchestrator's defaults are the readers' defaults (validator, adapter, trainer): a file the orchestrator
    # admitted is never refused downstream for its size, and so never slashed for it
    ocfg, limits = OrchestratorConfig(), RolloutLimits()
    assert ocfg.rollout_limits == limits  # every field: the orchestrator holds the one declaration of the limits
    for name in ("max_bytes", "max_rows", "max_decoded_bytes", "max_string_bytes", "max_prompt_tokens",
                 "max_completion_tokens", "max_proofs_per_row", "max_proof_bytes", "max_footer_bytes"):
        assert getattr(ocfg.rollout_limits, name) == getattr(limits, name), name
    cfg, _ = make_cfg(tmp_path, rollout_limits={"max_prompt_tokens": 4, "max_string_bytes": 40})
    with running(cfg, run_sweeper=False) as srv:
        node = NodeClient(srv.url, generate_key())
        node.register(throughput=10.0, stake=100.0)
        a = node.heartbeat().assignments[0]
        rows = rollouts_for(node.node_id, a)
        assert all(len(r.prompt_ids) > 4 for r in rows)
        with pytest.raises(ApiError) as e:
            node.submit(a.assignment_id, write(rows, tmp_path / "long.parquet"))
        assert e.value.status == 413 and "max_prompt_tokens" in e.value.detail, e.value
        for r in rows:
            r.prompt_ids, r.task_id = r.prompt_ids[:4], "t" * 41
        with pytest.raises(ApiError) as e:
            node.submit(a.assignment_id, write(rows, tmp_path / "name.parquet"))
        assert e.value.status == 413 and "max_string_bytes" in e.value.detail, e.value


def test_an_old_limit_key_says_where_it_moved(tmp_path):
    """The limits were fields of the orchestrator's config; a config still setting one is refused, naming the new
    place, from a TOML file as from an override."""
    with pytest.raises(ValueError, match=r"max_upload_bytes -> rollout_limits\.max_bytes"):
        OrchestratorConfig(max_upload_bytes=1 << 20)
    f = tmp_path / "orchestrator.toml"
    f.write_text("max_decoded_bytes = 1048576\n")
    with pytest.raises(ConfigError, match=r"max_decoded_bytes -> rollout_limits\.max_decoded_bytes"):
        load_config(OrchestratorConfig, f)
    with pytest.raises(ConfigError, match=r"max_rows -> rollout_limits\.max_rows"):
        load_config(OrchestratorConfig, None, ["max_rows=5"])
    assert load_config(OrchestratorConfig, None, ["rollout_limits.max_rows=5"]).rollout_limits.max_rows == 5
    with pytest.raises(ValueError, match="frozen"):  # one object shared by every read: nobody changes it under them
        RolloutLimits().max_rows = 5  # type: ignore[misc]


@pytest.mark.parametrize("bad,limit", [
    (dict(prompt_ids=[1] * 33), "max_prompt_tokens"),
    (dict(completion_ids=[1] * 33, logprobs=[-0.5] * 33), "max_completion_tokens"),
    (dict(group_id="g" * 65), "max_string_bytes"),
    (dict(worker_id="w" * 65), "max_string_bytes"),
    (dict(proofs=[b"p"] * 5), "max_proofs_per_row"),
    (dict(proofs=[b"p" * 9]), "max_proof_bytes"),
])
def test_each_limit_is_named(tmp_path, bad, limit):
    small = RolloutLimits(max_prompt_tokens=32, max_completion_tokens=32, max_string_bytes=64, max_proofs_per_row=4,
                          max_proof_bytes=8)
    p = write_rollouts([row(), row(**bad)], tmp_path / "x.parquet")
    with pytest.raises(RolloutError, match=rf"row 1: .*\({limit}\)") as e:
        read_rollouts(p, small)
    assert getattr(e.value, "limit", None) == limit
    assert read_rollouts(write_rollouts([row()], tmp_path / "ok.parquet"), small) == [row()]


def test_many_row_groups_bounded_by_the_footer(tmp_path):
    """One row per row group: the footer (parsed whole) grows with the groups; it is bounded before parsing."""
    t = to_table([row()] * 200)
    pq.write_table(t, tmp_path / "groups.parquet", row_group_size=1, compression="zstd")
    with pytest.raises(RolloutError, match=r"footer .*\(max_footer_bytes\)"):
        read_rollouts(tmp_path / "groups.parquet", RolloutLimits(max_footer_bytes=16 * 1024))
    assert len(read_rollouts(tmp_path / "groups.parquet")) == 200  # within the default


def test_honest_file_of_normal_size_reads_back(tmp_path):
    rng = np.random.default_rng(0)
    rows = [row(group_id=f"g{i // 8}", task_id=f"t{i // 8}", prompt_ids=rng.integers(0, 300, 200).tolist(),
                completion_ids=rng.integers(0, 300, 500).tolist(), logprobs=[-0.25] * 500,
                proofs=[bytes(rng.integers(0, 256, 258, dtype=np.uint8)) for _ in range(16)]) for i in range(1000)]
    p = write_rollouts(rows, tmp_path / "honest.parquet")
    assert read_rollouts(p) == rows  # 1000 rows over several batches, each checked


def test_bomb_adversary_is_refused_at_upload(tmp_path, tiny_model_dir):
    from swarmrl.attacks.adversaries import make_adversary  # noqa: PLC0415  # lazy: torch
    from swarmrl.attacks.config import AdversaryConfig  # noqa: PLC0415  # lazy: keeps the module light

    rl = RLConfig(run_dir=str(tmp_path / "run"), model=str(tiny_model_dir), contract=RLContract(task=TaskConfig(name="add"), group_size=2),
                  )
    (tmp_path / "rl.toml").write_text(dump_config(rl))
    cfg, _ = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        key = save_private_key(generate_key(), tmp_path / "bomb.pem")
        node = make_adversary(AdversaryConfig(adversary="bomb", orchestrator=srv.url, key=str(key),
                                              rl_config=str(tmp_path / "rl.toml"), throughput=10.0,
                                              work_dir=str(tmp_path / "work")))  # the default: 2 GiB decoded
        node.register()
        reply = node.client.heartbeat()
        node.handle(reply.assignments[0], reply)
        node.metrics.close()
        assert node.stats["refused"] == 1 and node.stats["submitted"] == 0
        [ev] = [r for r in read_metrics(tmp_path / "run" / "metrics" / f"node-{node.node_id}.jsonl")
                if r.get("event") == "assignment"]
        assert ev["refused_status"] == 413 and "max_decoded_bytes" in ev["refused"], ev
        # at its full strength: the refusal names what the file decodes to, from its metadata
        assert int(re.search(r"decodes to at least (\d+) bytes", ev["refused"]).group(1)) >= FULL_STRENGTH, ev
        assert not list((tmp_path / "work").glob("*.parquet"))  # the node cleans up its bomb
        # refused, not judged: no slash, no ejection; the orchestrator is up and took nothing
        assert srv.orch.membership.node_info(node.node_id).status == "active"
        assert srv.orch.ledger.balance(node.node_id).stake == pytest.approx(100.0)
        assert srv.orch.stats.health().ok and srv.orch.telemetry.counters["uploads"] == 0
