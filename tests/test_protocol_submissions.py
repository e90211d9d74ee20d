"""Uploads: byte cap, schema check, hash binding, replays and duplicates; content-addressed storage."""

from __future__ import annotations

import httpx
import pytest
from protocol_support import make_cfg, rollouts_for, running, write

from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.signing import generate_key, sign_request


@pytest.fixture()
def setup(tmp_path):
    cfg, keys = make_cfg(tmp_path, rollout_limits={"max_bytes": 64 * 1024})
    with running(cfg, run_sweeper=False) as srv:
        a, b = NodeClient(srv.url, generate_key()), NodeClient(srv.url, generate_key())
        a.register(throughput=10.0, stake=100.0)
        b.register(throughput=10.0, stake=100.0)
        yield srv, a, b, tmp_path


def test_honest_upload_is_stored_by_hash(setup):
    srv, a, b, tmp = setup
    asg = a.heartbeat().assignments[0]
    path = write(rollouts_for(a.node_id, asg), tmp / "a.parquet")
    rep = a.submit(asg.assignment_id, path)
    assert rep.status == "pending" and rep.n_rows == len(asg.tasks) * asg.contract.group_size
    stored = srv.orch.store.path_for(rep.sha256)
    assert stored.read_bytes() == path.read_bytes()
    # the same file again (a retry after a lost reply: the orchestrator stopped after its commit) gets the same
    # submission back, not a refusal, and stores nothing new
    again = a.submit(asg.assignment_id, path)
    assert (again.submission_id, again.sha256, again.status) == (rep.submission_id, rep.sha256, "pending")
    assert [x.submission.submission_id for x in srv.orch.submissions.pending(16).items] == [rep.submission_id]
    # ...but the node's file uploaded for another node's work, or another file for this one, is refused
    b_asg = b.heartbeat().assignments[0]
    with pytest.raises(ApiError) as e:
        a.submit(b_asg.assignment_id, path)
    assert e.value.status == 404
    # the assignment is now closed: a second upload of a different file is refused
    path2 = write(rollouts_for(a.node_id, asg, correct=False), tmp / "a2.parquet")
    with pytest.raises(ApiError) as e:
        a.submit(asg.assignment_id, path2)
    assert e.value.status == 409
    assert list(srv.orch.store.tmp.iterdir()) == []  # no temp files left behind


def test_oversized_upload_refused(setup):
    srv, a, b, tmp = setup
    asg = a.heartbeat().assignments[0]
    big = tmp / "big.parquet"
    big.write_bytes(b"\0" * (80 * 1024))
    with pytest.raises(ApiError) as e:
        a.submit(asg.assignment_id, big)
    assert e.value.status == 413
    # a lying Content-Length does not get past the streaming cap either
    url = f"/v1/submissions/upload/{asg.assignment_id}"
    import hashlib

    data = b"\0" * (80 * 1024)
    h = sign_request(a.key, "PUT", url, content_sha256=hashlib.sha256(data).hexdigest())

    def gen():
        for i in range(0, len(data), 8192):
            yield data[i:i + 8192]
    r = httpx.put(srv.url + url, content=gen(), headers=h)  # chunked, no Content-Length
    assert r.status_code == 413
    assert not any(p.is_file() for p in srv.orch.store.root.rglob("*") if p.parent != srv.orch.store.tmp)


def test_malformed_and_wrong_schema_refused(setup):
    srv, a, b, tmp = setup
    asg = a.heartbeat().assignments[0]
    junk = tmp / "junk.parquet"
    junk.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(ApiError) as e:
        a.submit(asg.assignment_id, junk)
    assert e.value.status == 422 and "parquet" in e.value.detail
    import pyarrow as pa
    import pyarrow.parquet as pq

    wrong = tmp / "wrong.parquet"
    pq.write_table(pa.table({"worker_id": [a.node_id], "reward": [1.0]}), wrong)
    with pytest.raises(ApiError) as e:
        a.submit(asg.assignment_id, wrong)
    assert e.value.status == 422 and "schema" in e.value.detail
    # rows claiming another worker
    other = write(rollouts_for(b.node_id, asg), tmp / "other.parquet")
    with pytest.raises(ApiError) as e:
        a.submit(asg.assignment_id, other)
    assert e.value.status == 422 and "worker_id" in e.value.detail
    # nothing stored, the assignment is still open
    assert [x.assignment_id for x in a.heartbeat().assignments] == [asg.assignment_id]


def test_wrong_hash_refused(setup):
    srv, a, b, tmp = setup
    asg = a.heartbeat().assignments[0]
    path = write(rollouts_for(a.node_id, asg), tmp / "a.parquet")
    url = f"/v1/submissions/upload/{asg.assignment_id}"
    h = sign_request(a.key, "PUT", url, content_sha256="ab" * 32)
    r = httpx.put(srv.url + url, content=path.read_bytes(), headers=h)
    assert r.status_code == 401 and "content hash" in r.json()["detail"]


def test_replay_of_another_nodes_file(setup):
    srv, a, b, tmp = setup
    asg_a = a.heartbeat().assignments[0]
    asg_b = b.heartbeat().assignments[0]
    path = write(rollouts_for(a.node_id, asg_a), tmp / "a.parquet")
    a.submit(asg_a.assignment_id, path)
    with pytest.raises(ApiError) as e:
        b.submit(asg_b.assignment_id, path)
    assert e.value.status == 409 and "another node" in e.value.detail
    # and a node cannot upload to someone else's assignment
    with pytest.raises(ApiError) as e:
        b.submit(asg_a.assignment_id, path)
    assert e.value.status in (404, 409)
