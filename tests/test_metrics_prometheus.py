"""Prometheus ``GET /metrics`` of the orchestrator and of SHARDCAST servers: real servers on loopback, real
traffic, scraped over HTTP and parsed with prometheus_client's parser; counters must move by exact amounts."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest
from _shardcast_util import make_file
from prometheus_client.parser import text_string_to_metric_families
from protocol_support import make_cfg, rollouts_for, running, write

from swarmrl.protocol.client import ApiError, NodeClient, TrainerClient, ValidatorClient
from swarmrl.protocol.orchestrator.metrics import OrchestratorMetrics
from swarmrl.protocol.schemas import VerdictRequest
from swarmrl.protocol.signing import generate_key
from swarmrl.shardcast import FetchOptions, Origin, Relay, fetch_async
from swarmrl.shardcast.layout import shard_name

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def val(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return val(after, name, **labels) - val(before, name, **labels)


def scrape(url: str) -> Samples:
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), (r.status_code, r.text)
    return parse(r.text)


def test_orchestrator_metrics_follow_real_traffic(tmp_path):
    cfg, keys = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        srv.orch.telemetry.prom.state.ttl_s = 0.0  # read the database gauges on every scrape here
        before = scrape(srv.url)
        assert val(before, "swarmrl_orchestrator_nodes", status="active") == 0
        a, b = NodeClient(srv.url, generate_key()), NodeClient(srv.url, generate_key())
        a.register(throughput=10.0, stake=100.0)
        b.register(throughput=10.0, stake=100.0)
        asg_a = a.heartbeat().assignments[0]
        a.heartbeat()
        a.heartbeat()
        asg_b = b.heartbeat().assignments[0]  # 4 heartbeats, 2 new assignments (one per node and step)

        good = write(rollouts_for(a.node_id, asg_a), tmp_path / "a.parquet")
        sub_a = a.submit(asg_a.assignment_id, good)
        junk = tmp_path / "junk.parquet"
        junk.write_bytes(b"PAR1 this is not parquet PAR1")
        with pytest.raises(ApiError) as e:
            b.submit(asg_b.assignment_id, junk)  # received in full, then refused (422)
        assert e.value.status == 422
        other = write(rollouts_for(a.node_id, asg_a, correct=False), tmp_path / "a2.parquet")
        with pytest.raises(ApiError) as e:  # another file for done work: refused before a byte is read (409)
            a.submit(asg_a.assignment_id, other)
        assert e.value.status == 409
        wrong = write(rollouts_for(b.node_id, asg_b, correct=False), tmp_path / "b.parquet")
        sub_b = b.submit(asg_b.assignment_id, wrong)

        v = ValidatorClient(srv.url, keys["validator"])
        v.download(sub_a.submission_id, tmp_path / "dl.parquet")
        v.verdict(VerdictRequest(submission_id=sub_a.submission_id, accepted=True))
        rej = v.verdict(VerdictRequest(submission_id=sub_b.submission_id, accepted=False, reason="wrong answers"))
        assert rej.ejected and rej.slashed > 0
        TrainerClient(srv.url, keys["trainer"]).set_step(3, 2)
        after = scrape(srv.url)

    d = lambda name, **kw: delta(after, before, name, **kw)  # noqa: E731
    # 4 heartbeats, and the 2 accepted uploads were answered with the node's next heartbeat reply (?next=1)
    assert d("swarmrl_orchestrator_heartbeats_total") == 6
    assert d("swarmrl_orchestrator_assignments_created_total", kind="new") == 2
    assert d("swarmrl_orchestrator_assignments_created_total", kind="reassigned") == 0
    assert d("swarmrl_orchestrator_submissions_total", outcome="uploaded") == 2
    assert d("swarmrl_orchestrator_submissions_total", outcome="refused") == 2
    assert d("swarmrl_orchestrator_submissions_total", outcome="accepted") == 1
    assert d("swarmrl_orchestrator_submissions_total", outcome="rejected") == 1
    assert d("swarmrl_orchestrator_submissions_total", outcome="challenged") == 0
    assert d("swarmrl_orchestrator_refused_requests_total", status="422") == 1
    assert d("swarmrl_orchestrator_refused_requests_total", status="409") == 1
    sizes = good.stat().st_size + junk.stat().st_size + wrong.stat().st_size
    assert d("swarmrl_orchestrator_upload_bytes_received_total") == sizes
    assert d("swarmrl_orchestrator_submission_bytes_served_total") == good.stat().st_size
    assert d("swarmrl_orchestrator_validation_latency_seconds_count") == 2
    assert 0 < d("swarmrl_orchestrator_validation_latency_seconds_sum") < 60
    assert d("swarmrl_orchestrator_validation_latency_seconds_bucket", le="+Inf") == 2
    assert d("swarmrl_orchestrator_slashes_total") == 1
    assert d("swarmrl_orchestrator_stake_slashed_total") == pytest.approx(rej.slashed)
    assert val(after, "swarmrl_orchestrator_nodes", status="active") == 1
    assert val(after, "swarmrl_orchestrator_nodes", status="ejected") == 1
    assert val(after, "swarmrl_orchestrator_nodes", status="dead") == 0
    assert val(after, "swarmrl_orchestrator_step") == 3
    assert val(after, "swarmrl_orchestrator_policy_version") == 2


def test_orchestrator_metrics_are_rate_limited_and_per_instance(tmp_path):
    cfg, _ = make_cfg(tmp_path, public_rate_per_s=0.01, public_burst=2)
    with running(cfg, run_sweeper=False) as srv:
        assert [httpx.get(srv.url + "/metrics").status_code for _ in range(3)] == [200, 200, 429]
        # another orchestrator in the same process has its own registry: nothing counted here shows there
        NodeClient(srv.url, generate_key()).register(throughput=1.0, stake=100.0)
        other = OrchestratorMetrics()
        srv.orch.telemetry.prom.heartbeats.inc(5)
        assert val(parse(other.exposition().decode()), "swarmrl_orchestrator_heartbeats_total") == 0
        assert val(parse(srv.orch.telemetry.prom.exposition().decode()), "swarmrl_orchestrator_heartbeats_total") == 5


def test_orchestrator_state_gauges_are_cached():
    calls = []

    def read():
        calls.append(1)
        return 7, 6, {"active": 100_000, "retired": 1}

    m = OrchestratorMetrics(read, gauge_ttl_s=60.0)
    for _ in range(5):
        s = parse(m.exposition().decode())
    assert len(calls) == 1  # one database query for five scrapes
    assert val(s, "swarmrl_orchestrator_nodes", status="active") == 100_000
    assert val(s, "swarmrl_orchestrator_nodes", status="retired") == 1
    assert ("swarmrl_orchestrator_nodes", frozenset({("status", "dead")})) in s  # known statuses always shown
    assert val(s, "swarmrl_orchestrator_step") == 7


SHARD = 64 * 1024
SIZE = 20 * SHARD + 1234  # 21 shards, last one short


def test_shardcast_origin_and_relay_metrics(tmp_path):
    ckpt = make_file(tmp_path / "model.safetensors", SIZE, seed=3)
    origin = Origin(tmp_path / "origin", keep=3, shard_size=SHARD)
    origin_url = origin.serve()

    async def get(session, url, method="GET"):
        async with session.request(method, url) as r:
            return r.status, await r.read()

    async def main():
        relay = Relay(tmp_path / "r", [origin_url], origin.public_key)
        url = await relay.start()
        relay.server.metrics.cache_s = 0.0
        origin.publish(ckpt, version=5).result(30)
        res = await fetch_async([url], tmp_path / "out.bin", origin.public_key, version=5,
                                options=FetchOptions(wait_s=20, parallel=4))
        assert res.version == 5 and (tmp_path / "out.bin").read_bytes() == ckpt.read_bytes()
        async with aiohttp.ClientSession() as s:
            st, text = await get(s, url + "/metrics")
            assert st == 200
            before, first_len = parse(text.decode()), len(text)
            shard1 = (tmp_path / "r" / "v5" / shard_name(1)).stat().st_size
            assert (await get(s, f"{url}/v5/{shard_name(1)}"))[0] == 200
            assert (await get(s, f"{url}/v5/{shard_name(1)}", "HEAD"))[0] == 200  # no body: no bytes
            assert (await get(s, f"{url}/nope"))[0] == 404
            assert (await get(s, f"{url}/v5/shard_00001.bin", "POST"))[0] == 405
            st, text = await get(s, url + "/metrics")
            after = parse(text.decode())
            st, otext = await get(s, origin_url + "/metrics")
            assert st == 200
            at_origin = parse(otext.decode())
        await relay.stop()
        return before, after, at_origin, first_len, shard1

    try:
        before, after, at_origin, first_len, shard1 = asyncio.run(main())
    finally:
        origin.close()
    n = 21
    # the relay: everything it mirrored came from the origin, every shard verified
    assert val(before, "swarmrl_shardcast_relay_shards_verified_total") == n
    assert val(before, "swarmrl_shardcast_relay_versions_synced_total") == 1
    assert val(before, "swarmrl_shardcast_relay_upstream_bytes_total", upstream=origin_url) == SIZE
    assert val(before, "swarmrl_shardcast_relay_upstream_transfers_total", upstream=origin_url) == n
    assert val(before, "swarmrl_shardcast_versions", state="complete") == 1
    assert val(before, "swarmrl_shardcast_latest_version") == 5
    # the client's fetch: at least the whole file went out of the relay
    assert val(before, "swarmrl_shardcast_bytes_served_total") >= SIZE
    # between the two scrapes: the first scrape's body, one shard (the HEAD adds nothing); 3 OKs, a 404, a 405
    assert delta(after, before, "swarmrl_shardcast_bytes_served_total") == shard1 + first_len
    assert delta(after, before, "swarmrl_shardcast_requests_total", status="200") == 3
    assert delta(after, before, "swarmrl_shardcast_requests_total", status="404") == 1
    assert delta(after, before, "swarmrl_shardcast_requests_total", status="405") == 1
    # the origin served the relay the whole file (and counts requests; it has no relay metrics)
    assert val(at_origin, "swarmrl_shardcast_bytes_served_total") >= SIZE
    assert val(at_origin, "swarmrl_shardcast_requests_total", status="200") >= n
    assert val(at_origin, "swarmrl_shardcast_latest_version") == 5
    assert not any(name.startswith("swarmrl_shardcast_relay_") for name, _ in at_origin)
