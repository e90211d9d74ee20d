"""DiLoCo and DDP across continents (``swarmrl.diloco.wan``): workers in network namespaces of the harness, compute
utilization, and DDP's wall-time limit (the workers agree to stop through the gradient all-reduce).

The WAN runs need root (network namespaces) and are slow; they are skipped without the rights, as in
tests/test_join_wan.py."""

import json

import pytest
import torch

from swarmrl.diloco import DilocoConfig, run
from swarmrl.models.config import ModelInitConfig
from swarmrl.wan import netns

torch.set_num_threads(1)
_NO_RIGHTS = netns.rights_problem()


def _small(tmp_path, **kw) -> DilocoConfig:
    base = dict(out=str(tmp_path / "run"), workers=2, total_steps=40, inner_steps=20, warmup_steps=2, batch_size=4,
                seq_len=32, eval_seqs=4, timeout_s=400,
                init=ModelInitConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                     max_position_embeddings=64))
    base.update(kw)
    return DilocoConfig(**base)


def test_max_wall_s_is_for_ddp_only():
    with pytest.raises(ValueError, match="max_wall_s"):
        DilocoConfig(max_wall_s=10.0)
    assert DilocoConfig(mode="ddp", max_wall_s=10.0).max_wall_s == 10.0
    assert DilocoConfig().max_wall_s is None and DilocoConfig().hivemind.host == "127.0.0.1"


def test_ddp_stops_together_at_its_wall_time_limit_and_reports_utilization(tmp_path):
    # far more steps than fit in a second: the limit ends the run, and both workers stop after the same step
    # (a worker that went on alone would hang in its next all-reduce until the launcher's timeout)
    s = run(_small(tmp_path, mode="ddp", total_steps=100_000, max_wall_s=1.0, timeout_s=120))
    w = [json.loads((tmp_path / "run" / f"worker{r}.summary.json").read_text()) for r in (0, 1)]
    assert all(x["stopped_at_max_wall"] for x in w) and w[0]["steps"] == w[1]["steps"] < 100_000
    assert s["identical_params"]
    # one fp32 gradient vector per step, plus the one-element stop vote
    assert s["bytes_sent_per_worker"] == w[0]["steps"] * (s["params"] + 1) * 4
    # the last evaluation is at the stop, on the loop's clock
    assert s["evals"][-1]["step"] == w[0]["steps"] and s["evals"][-1]["wall_s"] <= w[0]["loop_s"]
    for x in w:
        assert 0 < x["inner_s"] <= x["loop_s"] - x["eval_s"] and 0 < x["utilization"] <= 1


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(bool(_NO_RIGHTS), reason=_NO_RIGHTS or "ok")
@pytest.mark.parametrize("backend,profile", [("torch", "wan20lossy"), ("hivemind", "wan100")])
def test_diloco_workers_run_inside_their_namespaces_across_the_link(tmp_path, backend, profile):
    from swarmrl.diloco.comm import HIVEMIND_MISSING, hivemind_available
    from swarmrl.diloco.wan import run_wan
    from swarmrl.wan.profiles import link_plan

    if backend == "hivemind" and not hivemind_available():
        pytest.skip(HIVEMIND_MISSING)
    s = run_wan(_small(tmp_path, backend=backend), profile, rtt_pings=5)
    hosts, roles = s["wan"]["hosts"], s["wan"]["roles"]
    # every TCP connection of each worker's process tree (gloo's store and pairs, p2pd's) went to the other
    # worker's addresses (its routable one; gloo's pairs use the link's first, link-local one), which exist only
    # inside the harness's namespaces
    for me, other in (("0", "w1"), ("1", "w0")):
        assert hosts[other] in s["tcp_peers"][me], s["tcp_peers"]
        assert set(s["tcp_peers"][me]) <= {hosts[other], roles[other]["host"]}, s["tcp_peers"]
    # the path between them crosses both workers' links: the wire holds every packet for the added delay
    link = link_plan(profile, ["w0", "w1"])["w0"]
    assert s["wan"]["rtt_ms_w1_w0"]["min"] >= 2 * link.rtt_ms
    # they averaged over it: two rounds, a group of two each time
    assert s["sync_calls_per_worker"] == 2 and s["solo_rounds"] == 0
    assert s["tcp_bytes_sent_per_worker"] >= s["bytes_sent_per_worker"] > 0
    if backend == "torch":
        assert s["identical_params"]
    # overlap_steps = "auto" (the default) found the link slow for these rounds: every worker ran them overlapped,
    # by the same tau
    taus = s["overlap_steps_per_worker"]
    assert len(set(taus)) == 1 and taus[0] > 0, s["overlap_decision"]
    if backend == "torch":  # an averaging that outlasts H steps lengthens the rounds to tau (hivemind: tau <= H)
        assert s["overlap_decision"]["round_steps"] == max(20, taus[0]), s["overlap_decision"]
    # and the utilization is reported for every worker
    assert len(s["utilization_per_worker"]) == 2 and all(0 < u <= 1 for u in s["utilization_per_worker"])
    assert s["evals"][-1]["step"] == 40 and s["evals"][-1]["wall_s"] <= s["loop_s"]
