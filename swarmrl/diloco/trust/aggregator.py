"""The DiLoCo aggregator's HTTP server (FastAPI under uvicorn, behind the connection guard): the API of
``swarmrl.diloco.trust`` over the round state machine ``rounds.Rounds``.

    python -m swarmrl.diloco.trust.aggregator --config CFG.json --key KEY.pem --orchestrator URL --port P

``CFG.json``: the run's ``DilocoConfig`` (``trust`` inside); ``KEY.pem``: the aggregator's Ed25519 key, whose
public key is in the orchestrator's ``validator_keys``. Prints ``diloco aggregator ready at URL`` and writes
``--ready-file`` (JSON ``{"url"}``) once it serves; dies with its parent (``adopt_parent_death``).

Every POST is signed (``swarmrl.protocol.signing``); the signature is checked from the headers before the body is
read, single-use nonces are remembered until their timestamps expire. An upload is refused, before it touches the
outer state: 413 by its Content-Length or while streaming (over ``max_upload_bytes``: the exact size plus the
header's bound), 401 unsigned / bad signature / body not the one signed, 403 not a joined active member (or
ejected), 409 round closed / not open / duplicate / another anchor, 422 malformed (``wire.check_upload``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from swarmrl.diloco.config import DilocoConfig
from swarmrl.diloco.trust import wire
from swarmrl.diloco.trust.rounds import Refused, Rounds
from swarmrl.protocol.client import ApiError, ValidatorClient
from swarmrl.protocol.orchestrator.auth import RateLimiter
from swarmrl.protocol.schemas import DilocoRejection, DilocoRoundRequest
from swarmrl.protocol.signing import SignatureError, check_timestamp, parse_headers, verify_signature
from swarmrl.utils.serving import gather_capped

log = logging.getLogger("swarmrl.diloco.trust")

MAX_WAIT_S = 60.0  # a result long poll holds a request at most this long
MAX_NONCES = 200_000
JOIN_LOOKUPS_PER_S, JOIN_LOOKUP_BURST = 2.0, 32  # joins of keys not yet members, per source address
SAFETENSORS = "application/octet-stream"


class Nonces:
    """Single-use nonces per key until their timestamp could no longer pass the skew check (bounded: 503)."""

    def __init__(self, skew_s: float) -> None:
        self.skew_s = skew_s
        self.seen: dict[tuple[str, str], float] = {}
        self.lock = threading.Lock()

    def use(self, key: str, nonce: str, ts: int) -> None:
        now = time.time()
        with self.lock:
            if len(self.seen) > MAX_NONCES // 2:
                self.seen = {k: t for k, t in self.seen.items() if t >= now}
            if len(self.seen) >= MAX_NONCES:
                raise Refused(503, "too many requests in flight; retry later")
            if (key, nonce) in self.seen:
                raise Refused(401, "replayed nonce")
            self.seen[(key, nonce)] = ts + self.skew_s + 1.0


def _signed_path(request: Request) -> str:
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if raw else request.scope["path"]
    q = request.scope.get("query_string", b"").decode("latin-1")
    return path + (f"?{q}" if q else "")


def authenticate(request: Request, nonces: Nonces, skew_s: float = 60.0):  # noqa: ANN201  # SignedHeaders
    """The signer of ``request`` from its headers alone (401): the body is checked against the signed hash later."""
    try:
        h = parse_headers(request.headers)
        check_timestamp(h.timestamp, skew_s)
        verify_signature(h, request.method, _signed_path(request))
    except SignatureError as e:
        raise Refused(401, str(e)) from None
    nonces.use(h.public_key, h.nonce, h.timestamp)
    return h


async def read_capped(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once more than ``limit`` bytes came (whatever Content-Length said)."""
    body = await gather_capped(request.stream(), limit)
    if body is None:
        raise Refused(413, f"upload over the {limit}-byte limit")
    return body


class MemberCheck:
    """Asks the orchestrator whether a node is an active registered worker (``GET /v1/nodes/{id}``)."""

    def __init__(self, client: ValidatorClient) -> None:
        self.client = client

    def __call__(self, node_id: str) -> None:
        try:
            r = self.client.http.get(f"/v1/nodes/{node_id}")
        except Exception as e:  # httpx transport errors
            raise Refused(503, f"the orchestrator cannot be reached: {e}") from None
        if r.status_code == 404:
            raise Refused(403, f"node {node_id} is not registered with the orchestrator")
        if r.status_code != 200:
            raise Refused(503, f"the orchestrator answered {r.status_code} for node {node_id}")
        info = r.json()
        if info.get("role") != "worker" or info.get("status") != "active":
            raise Refused(403, f"node {node_id} is a {info.get('role')} with status {info.get('status')}, "
                               "not an active worker")


def create_app(rounds: Rounds, member_check, skew_s: float = 60.0) -> FastAPI:  # noqa: ANN001
    """The aggregator's app over ``rounds``; ``member_check(node_id)`` raises ``Refused`` unless the node may join."""
    nonces = Nonces(skew_s)
    lookups = RateLimiter(JOIN_LOOKUPS_PER_S, JOIN_LOOKUP_BURST)  # per source address: joins that ask the orchestrator

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        async def closer() -> None:  # the round timeout
            while True:
                await asyncio.sleep(0.2)
                if rounds.due():
                    with contextlib.suppress(Exception):  # logged by close_logged; keep timing rounds out
                        await run_in_threadpool(rounds.close_logged)
        task = asyncio.create_task(closer())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        rounds.stop()

    app = FastAPI(title="swarmrl DiLoCo aggregator", lifespan=lifespan)
    app.state.rounds = rounds

    @app.exception_handler(Refused)
    async def refused(_req: Request, e: Refused) -> JSONResponse:
        return JSONResponse({"detail": e.detail}, status_code=e.status)

    @app.exception_handler(wire.WireError)
    async def bad_wire(_req: Request, e: wire.WireError) -> JSONResponse:
        return JSONResponse({"detail": e.detail}, status_code=e.status)

    @app.get("/v1/diloco/run")
    async def run() -> dict:
        return rounds.describe()

    @app.get("/v1/diloco/state")
    async def state() -> Response:
        return Response(await run_in_threadpool(rounds.state), media_type=SAFETENSORS)

    @app.post("/v1/diloco/join")
    async def join(request: Request) -> dict:
        h = authenticate(request, nonces, skew_s)
        body = await read_capped(request, 1024)
        if hashlib.sha256(body).hexdigest() != h.content_sha256:
            raise Refused(401, "body does not match the signed content hash")
        if not rounds.is_member(h.node_id):
            host = request.client.host if request.client else "?"
            if not lookups.allow(host):
                raise Refused(429, f"joins from {host} faster than {JOIN_LOOKUPS_PER_S:g}/s")
            await run_in_threadpool(member_check, h.node_id)
        return {"node_id": h.node_id, "round": rounds.add_member(h.node_id, h.public_key)}

    @app.post("/v1/diloco/rounds/{round_no}/contributions", status_code=202)
    async def contribute(round_no: int, request: Request) -> dict:
        limit = rounds.max_upload_bytes
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise Refused(413, f"upload of {length} bytes is over the {limit}-byte limit")
        h = authenticate(request, nonces, skew_s)
        rounds.check_member(h.node_id)
        digest = rounds.admissible(h.node_id, round_no)
        body = await read_capped(request, limit)
        if hashlib.sha256(body).hexdigest() != h.content_sha256:
            raise Refused(401, "body does not match the signed content hash")
        up = await run_in_threadpool(wire.check_upload, body, rounds.numel, rounds.chunk, run_id=rounds.run_id,
                                     round_no=round_no, digest=digest)
        if rounds.take(h.node_id, up):
            asyncio.get_running_loop().run_in_executor(None, rounds.close_logged)  # judged off the event loop
        return {"node_id": h.node_id, "round": round_no}

    @app.get("/v1/diloco/rounds/{round_no}/result")
    async def result(round_no: int, wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0) -> Response:
        deadline = time.monotonic() + wait
        while True:
            body = rounds.result(round_no)
            if body is not None:
                return Response(body, media_type=SAFETENSORS)
            if time.monotonic() >= deadline:
                return Response(status_code=204)
            await asyncio.sleep(0.05)

    return app


def reporter_for(client: ValidatorClient, run_id: str):  # noqa: ANN201
    """``send(round, accepted, rejected)`` for ``Rounds``: a refusal (4xx but 429) is final, logged, not retried."""
    def send(round_no: int, accepted: list[str], rejected: list[dict]) -> None:
        req = DilocoRoundRequest(run_id=run_id, round=round_no, accepted=accepted,
                                 rejected=[DilocoRejection(**r) for r in rejected])
        try:
            client.diloco_round(req)
        except ApiError as e:
            if e.status == 429 or e.status >= 500:
                raise
            log.error("the orchestrator refused round %d's report: %s", round_no, e)
    return send


def build(cfg: DilocoConfig, key: str, orchestrator: str, run_id: str, log_path: Path | None = None,
          score: bool = True) -> tuple[FastAPI, Rounds, ValidatorClient]:
    """The app, its state machine (anchor: the freshly built model) and the orchestrator client."""
    from swarmrl.diloco.trust.scoring import ScoringModel  # noqa: PLC0415  # lazy: builds the model

    scorer = ScoringModel(cfg)
    client = ValidatorClient(orchestrator, key, timeout=30.0)

    def loss_for(seed: int, round_no: int):  # noqa: ANN202
        return scorer.loss_fn(scorer.batch(1_000 + seed, round_no, cfg.trust.score_seqs))

    rounds = Rounds(cfg, run_id, scorer.initial(), loss_for if score else None, reporter_for(client, run_id),
                    log_path)
    return create_app(rounds, MemberCheck(client)), rounds, client


def main(argv: list[str] | None = None) -> None:
    from swarmrl.utils.procs import adopt_parent_death  # noqa: PLC0415

    adopt_parent_death()
    ap = argparse.ArgumentParser(description="the DiLoCo aggregator (judges signed pseudo-gradients)")
    ap.add_argument("--config", required=True, help="JSON file with the run's DilocoConfig")
    ap.add_argument("--key", required=True, help="the aggregator's Ed25519 PEM key (a validator key)")
    ap.add_argument("--orchestrator", default="", help="orchestrator URL (default: trust.orchestrator_url)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--run-id", default="", help="default: a random one")
    ap.add_argument("--ready-file", default="")
    ap.add_argument("--log", default="", help="JSONL of every round's statistics and verdicts")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s aggregator %(levelname)s %(message)s")
    cfg = DilocoConfig.model_validate_json(Path(args.config).read_text())
    import torch  # noqa: PLC0415

    torch.set_num_threads(cfg.threads)
    run_id = args.run_id or f"diloco-{secrets.token_hex(4)}"
    orchestrator = args.orchestrator or cfg.trust.orchestrator_url
    if not orchestrator:
        ap.error("no orchestrator: pass --orchestrator URL or set trust.orchestrator_url")
    app, _rounds, _client = build(cfg, args.key, orchestrator, run_id, Path(args.log) if args.log else None)
    serve(app, args.host, args.port, args.ready_file)


def serve(app: FastAPI, host: str, port: int, ready_file: str = "") -> None:
    import uvicorn  # noqa: PLC0415

    from swarmrl.protocol.orchestrator.guard import server_config  # noqa: PLC0415
    from swarmrl.utils.serving import ConnLimits  # noqa: PLC0415

    limits = ConnLimits(max_connections=1024, max_connections_per_ip=256, reserved_connections=0)
    server = uvicorn.Server(server_config(app, limits, host=host, port=port, name="diloco-aggregator",
                                          log_level="warning", access_log=False))

    def announce() -> None:
        while not server.started:
            time.sleep(0.05)
        bound = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://{host}:{bound}"
        if ready_file:
            tmp = Path(ready_file).with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
            tmp.replace(ready_file)
        print(f"diloco aggregator ready at {url}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    server.run()


if __name__ == "__main__":
    main()
