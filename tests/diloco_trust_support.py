"""Shared pieces of the DiLoCo trust tests: a tiny run's config, a real orchestrator (tests/protocol_support.py)
with registered worker keys, a real aggregator served by uvicorn on a free loopback port, signed requests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from protocol_support import ThreadedApp, make_cfg, running

from swarmrl.diloco.config import DilocoConfig, TrustConfig
from swarmrl.diloco.trust import wire
from swarmrl.diloco.trust.aggregator import build
from swarmrl.diloco.trust.rounds import Rounds
from swarmrl.models.config import ModelInitConfig
from swarmrl.protocol.client import NodeClient
from swarmrl.protocol.signing import generate_key, node_id_for, public_key_hex, sign_request


def tiny_cfg(**trust) -> DilocoConfig:
    """A run small enough for the default suite: a 19k-parameter model on the mul_add text, H = 5."""
    init = ModelInitConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                           max_position_embeddings=64)
    return DilocoConfig(data="task", init=init, seq_len=32, batch_size=4, inner_steps=5, total_steps=60,
                        warmup_steps=2, int8_chunk=1024, trust=TrustConfig(**{"score_seqs": 4, **trust}))


class Aggregator(ThreadedApp):
    """A real aggregator app (``aggregator.build``) under uvicorn on a free port, in a thread of this process."""

    def __init__(self, cfg: DilocoConfig, key, orchestrator_url: str, run_id: str = "test-run") -> None:  # noqa: ANN001
        app, self.rounds, self.client = build(cfg, key, orchestrator_url, run_id)
        super().__init__(app)

    def stop(self) -> None:
        super().stop()
        self.client.close()


@dataclass
class Swarm:
    orch: object  # protocol_support.Server
    agg: Aggregator
    rounds: Rounds
    workers: list  # Ed25519 keys, registered as workers
    keys: dict  # the orchestrator's principals (validator = the aggregator, trainer, authority)
    http: httpx.Client

    @property
    def url(self) -> str:
        return self.agg.url


@contextmanager
def swarm(tmp: Path, cfg: DilocoConfig, n_workers: int = 4, **orch_kw) -> Iterator[Swarm]:
    """An orchestrator whose validator key is the aggregator's, ``n_workers`` registered workers (not joined)."""
    ocfg, keys = make_cfg(tmp, min_stake=10.0, **orch_kw)
    with running(ocfg) as orch:
        workers = [generate_key() for _ in range(n_workers)]
        for k in workers:
            with NodeClient(orch.url, k) as c:
                c.register(throughput=10.0, stake=100.0)
        agg = Aggregator(cfg, keys["validator"], orch.url).start()
        try:
            with httpx.Client(base_url=agg.url, timeout=30.0) as http:
                yield Swarm(orch, agg, agg.rounds, workers, keys, http)
        finally:
            agg.stop()


def signed_post(http: httpx.Client, key, path: str, body: bytes = b"", headers: dict | None = None,  # noqa: ANN001
                sign_body: bytes | None = None) -> httpx.Response:
    """POST ``body`` signed by ``key`` (``sign_body``: sign other bytes than those sent)."""
    h = sign_request(key, "POST", path, body if sign_body is None else sign_body)
    return http.post(path, content=body, headers={**h, **(headers or {})})


def join(s: Swarm, key) -> httpx.Response:  # noqa: ANN001
    return signed_post(s.http, key, "/v1/diloco/join")


def upload(s: Swarm, key, vector, round_no: int | None = None, digest: str | None = None,  # noqa: ANN001
           run_id: str | None = None) -> httpx.Response:
    run = s.http.get("/v1/diloco/run").json()
    r = run["round"] if round_no is None else round_no
    codes, scales = wire.quantize(vector, run["int8_chunk"])
    body = wire.encode_upload(codes, scales, run_id or run["run_id"], r, digest or run["anchor_digest"])
    return signed_post(s.http, key, f"/v1/diloco/rounds/{r}/contributions", body)


def result(s: Swarm, round_no: int, wait: float = 30.0) -> wire.Result:
    r = s.http.get(f"/v1/diloco/rounds/{round_no}/result", params={"wait": wait}, timeout=wait + 10)
    assert r.status_code == 200, (r.status_code, r.text)
    return wire.decode_result(r.content, s.rounds.numel, s.rounds.chunk)


def ledger(s: Swarm, key, until=None, timeout: float = 20.0):  # noqa: ANN001, ANN201
    """A worker's ledger at the orchestrator (polled until ``until(balance)`` holds: reports are asynchronous)."""
    nid = node_id_for(public_key_hex(key))
    deadline = time.monotonic() + timeout
    while True:
        b = httpx.get(f"{s.orch.url}/v1/nodes/{nid}/ledger").json()
        if until is None or until(b) or time.monotonic() > deadline:
            return b
        time.sleep(0.1)
