"""The worker's side of DiLoCo trusting no one: ``SwarmAverager`` (the ``Averager`` protocol of ``comm``).

On connect it registers at the orchestrator as a worker with its key and stake (``ensure_registered``; the stake
was deposited for its key by a stake authority, or the orchestrator takes self-declared stake on a local run) and
keeps heartbeating (a silent member is swept as dead), joins the aggregator (signed ``POST /v1/diloco/join``) and
downloads the aggregator's state (``GET /v1/diloco/state``: anchor and momentum, its digest checked), so every
worker starts from the aggregator's anchor.

Each round (``average(pg, round)``) it quantizes its pseudo-gradient to int8 with its own chunk scales (error
feedback: the rounding residual is added to the next round's), signs the upload (``swarmrl.protocol.signing``),
binds it to the round and the anchor digest, long-polls the round's published update and returns it dequantized
(``group_size``: how many uploads the aggregator accepted). Every party dequantizes the same bytes and applies the
same Nesterov step: after the worker's outer step, ``verify_anchor`` checks its anchor's digest against the
published ``anchor_digest_after`` and stops the run loudly on a mismatch (``AnchorMismatch``).

A worker whose upload is refused with 403 because the orchestrator ejected it (slashed for a hostile
contribution) stops with a clear message and exit status ``EJECTED_EXIT`` (``Ejected``).

``bytes_sent`` counts the upload bodies this worker hands to HTTP (int8 codes, fp32 scales, the safetensors
header); what crosses the network is measured apart (``traffic.TcpTraffic``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
import torch

from swarmrl.diloco.comm import AverageResult
from swarmrl.diloco.config import TrustConfig
from swarmrl.diloco.trust import wire
from swarmrl.protocol.client import ApiError, NodeClient, SignedClient
from swarmrl.protocol.node import ensure_registered
from swarmrl.protocol.signing import sign_request

__all__ = ["EJECTED_EXIT", "Ejected", "AnchorMismatch", "SwarmAverager", "SwarmState", "TamperHook",
           "read_round_log"]

log = logging.getLogger("swarmrl.diloco.trust.client")

UPLOAD_ATTEMPTS = 4  # one upload, sent again after a transport error (a reset keep-alive connection, a refused connect)


def post_retrying(http: httpx.Client, path: str, body: bytes, headers: Callable[[], dict[str, str]],
                  attempts: int = UPLOAD_ATTEMPTS,
                  backoff_s: float = 0.25) -> httpx.Response:
    """POST ``body``, signed afresh by ``headers()`` for every attempt, again after a transport error: an idle
    keep-alive connection the server closed as the request went out resets it, which must not end an honest worker's
    run. A retry of an upload that did arrive is answered 409 (already uploaded), which the caller takes as sent."""
    for attempt in range(attempts):
        try:
            return http.post(path, content=body, headers=headers())
        except httpx.TransportError as e:
            if attempt == attempts - 1:
                raise
            log.warning("POST %s: %s; sending it again (%d of %d)", path, e, attempt + 2, attempts)
            time.sleep(backoff_s * (attempt + 1))
    raise AssertionError("unreachable")

EJECTED_EXIT = 3  # a worker's exit status once the orchestrator ejected it
CONNECT_S = 120.0  # how long a worker waits for the aggregator to answer at all (it may be starting)


class Ejected(SystemExit):
    """This worker was ejected (slashed) by the orchestrator: it stops with ``EJECTED_EXIT``."""

    def __init__(self, message: str) -> None:
        super().__init__(EJECTED_EXIT)
        self.message = message

    def __str__(self) -> str:
        return self.message


class AnchorMismatch(RuntimeError):
    """This worker's anchor after the outer step is not the one the aggregator published."""


Int8Vector = tuple[torch.Tensor, torch.Tensor]  # (codes int8, scales fp32): ``wire.quantize``


class TamperHook(Protocol):
    """An adversary (benchmarks and tests: ``swarmrl.attacks.diloco``): what to upload instead of ``pg``."""

    def upload(self, rnd: int, pg: torch.Tensor) -> torch.Tensor | Int8Vector | None: ...

    def sent(self, rnd: int, up: Int8Vector) -> None: ...

    def published(self, rnd: int, up: Int8Vector) -> None: ...


@dataclass(frozen=True)
class SwarmState:
    """The aggregator's outer state as downloaded (checked against its digest)."""

    round: int
    outer_steps: int
    anchor: torch.Tensor
    momentum: torch.Tensor | None
    digest: str


class SwarmAverager:
    """Signed int8 uploads to a judging aggregator; the published update back (see the module docstring)."""

    def __init__(self, trust: TrustConfig, numel: int, *, int8_chunk: int, error_feedback: bool = True,
                 tamper: TamperHook | None = None, timeout_s: float = 30.0, poll_s: float = 10.0) -> None:
        """``trust``: the orchestrator's and the aggregator's URLs, this worker's key file and stake, the round
        timeout; ``int8_chunk``: elements per scale (the run's); ``tamper``: an adversary (tests only)."""
        if not (trust.orchestrator_url and trust.aggregator_url and trust.key):
            raise ValueError("the swarm backend needs trust.orchestrator_url, trust.aggregator_url and trust.key "
                             "(swarmrl diloco --backend swarm starts both services and makes the keys)")
        self.numel, self.int8_chunk, self.error_feedback = numel, int8_chunk, error_feedback
        self.round_timeout_s, self.poll_s, self.tamper = trust.round_timeout_s, poll_s, tamper
        self.bytes_sent = 0
        self.rounds = 0
        self.accepted_rounds = 0  # rounds whose published update counted this worker's upload
        self.residual: torch.Tensor | None = None
        self.node = NodeClient(trust.orchestrator_url, Path(trust.key), timeout=timeout_s)
        self.node_id = self.node.node_id
        self.agg = SignedClient(trust.aggregator_url, self.node.key, timeout=timeout_s)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        try:
            ensure_registered(self.node, throughput=1.0, stake=trust.stake, hardware={"role": "diloco"})
            self._start_heartbeats()
            self.run_info = self._run_info()
            joined = self.agg.request("POST", "/v1/diloco/join").json()
            log.info("joined the aggregator as %s at round %s", joined.get("node_id"), joined.get("round"))
            self.state = self.download_state()
        except ApiError as e:
            self.close()
            if e.status == 403:
                self._raise_if_ejected(e)
            raise
        except BaseException:
            self.close()
            raise
        self.anchor_digest = self.state.digest  # the anchor the next upload is bound to

    # -- joining

    def _run_info(self) -> dict:
        """The run's settings (``GET /v1/diloco/run``), once the aggregator answers (it may be starting)."""
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                info = self.agg._check(self.agg.http.get("/v1/diloco/run")).json()
                break
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        if info.get("numel") != self.numel:
            raise ValueError(f"the aggregator trains {info.get('numel')} parameters, this worker's model has "
                             f"{self.numel}: not the same model")
        if info.get("int8_chunk") != self.int8_chunk:
            raise ValueError(f"the aggregator's int8_chunk is {info.get('int8_chunk')}, this worker's "
                             f"{self.int8_chunk}")
        return info

    def download_state(self) -> SwarmState:
        """The aggregator's anchor and momentum (``GET /v1/diloco/state``), refused unless its digest checks."""
        r = self.agg._check(self.agg.http.get("/v1/diloco/state"))
        st = wire.decode_state(r.content, self.numel)
        if wire.anchor_digest(st.anchor) != st.anchor_digest:
            raise ValueError(f"the aggregator's state does not match its digest {st.anchor_digest}: refused")
        return SwarmState(round=st.round, outer_steps=st.outer_steps, anchor=st.anchor, momentum=st.momentum,
                          digest=st.anchor_digest)

    def _start_heartbeats(self) -> None:
        interval = 5.0

        def beat() -> None:
            while not self._stop.wait(interval):
                try:
                    self.node.heartbeat()
                except ApiError as e:
                    if e.status in (401, 403):
                        log.warning("heartbeat refused: %s", e.detail)
                        return
                except (OSError, httpx.HTTPError) as e:
                    log.debug("heartbeat failed: %s", e)

        self._beat = threading.Thread(target=beat, name="diloco-heartbeat", daemon=True)
        self._beat.start()

    # -- a round

    def _quantize(self, x: torch.Tensor) -> Int8Vector:
        return wire.quantize(x, self.int8_chunk)

    def _payload(self, rnd: int, pg: torch.Tensor) -> Int8Vector:
        """What this worker uploads for round ``rnd``: its pseudo-gradient (plus the last rounding residual) in
        int8, or what an adversary sends instead (then the residual is left as it was)."""
        hostile = self.tamper.upload(rnd, pg) if self.tamper is not None else None
        if isinstance(hostile, torch.Tensor):
            return self._quantize(hostile)
        if hostile is not None:
            return hostile
        x = pg.float()
        if self.error_feedback and self.residual is not None:
            x = x + self.residual
        q = self._quantize(x)
        if self.error_feedback:
            self.residual = x - wire.dequantize(*q, self.int8_chunk)
        return q

    def average(self, flat: torch.Tensor, round_no: int = 0) -> AverageResult:
        """Upload this round's pseudo-gradient and return the round's published update."""
        rnd = int(round_no)
        up = self._payload(rnd, flat)
        body = wire.encode_upload(*up, run_id=self.run_info["run_id"], round_no=rnd, digest=self.anchor_digest)
        path = f"/v1/diloco/rounds/{rnd}/contributions"

        def signed() -> dict[str, str]:
            self.bytes_sent += len(body)
            return {**sign_request(self.node.key, "POST", path, body), "Content-Type": "application/octet-stream"}

        r = post_retrying(self.agg.http, path, body, signed)
        if r.status_code == 403:
            self._raise_if_ejected(ApiError(403, _detail(r)))
            raise ApiError(403, _detail(r))
        if r.status_code == 409:  # the round closed without this upload (late): not punished, take its result
            log.warning("round %d: upload refused (%s); taking the published update", rnd, _detail(r))
        elif r.status_code >= 400:
            raise ApiError(r.status_code, f"round {rnd}: upload refused: {_detail(r)}")
        if self.tamper is not None:
            self.tamper.sent(rnd, up)
        res = self._result(rnd)
        if self.tamper is not None:
            self.tamper.published(rnd, (res.codes, res.scales))
        self.rounds += 1
        mine = self.node_id in res.accepted
        self.accepted_rounds += int(mine)
        for rej in res.rejected:
            if rej.get("node_id") == self.node_id:
                log.warning("round %d: the aggregator rejected this worker's upload: %s", rnd, rej.get("reason"))
        self.anchor_digest = res.anchor_digest_after
        return AverageResult(res.vector(self.int8_chunk), max(1, len(res.accepted)))

    def _result(self, rnd: int) -> wire.Result:
        """Long-poll round ``rnd``'s published update."""
        deadline = time.monotonic() + self.round_timeout_s + 60.0
        path = f"/v1/diloco/rounds/{rnd}/result"
        read = self.agg.http.timeout.read or 30.0
        while time.monotonic() < deadline:
            try:
                r = self.agg.http.get(path, params={"wait": self.poll_s}, timeout=self.poll_s + read)
            except httpx.TransportError as e:  # a reset connection: poll again until the deadline
                log.warning("round %d: polling the result: %s; again", rnd, e)
                time.sleep(0.25)
                continue
            if r.status_code == 200:
                res = wire.decode_result(r.content, self.numel, self.int8_chunk)
                if res.round != rnd or res.anchor_digest != self.anchor_digest:
                    raise AnchorMismatch(f"round {rnd}: the aggregator published round {res.round} from anchor "
                                         f"{res.anchor_digest}, this worker holds {self.anchor_digest}")
                vec = res.vector(self.int8_chunk)
                if not torch.isfinite(vec).all():
                    raise ValueError(f"round {rnd}: the published update is not finite: refused")
                return res
            if r.status_code != 204:
                raise ApiError(r.status_code, f"round {rnd}: no result: {_detail(r)}")
        raise TimeoutError(f"round {rnd}: no published update within {self.round_timeout_s + 60.0:.0f}s")

    def verify_anchor(self, anchor: torch.Tensor) -> None:
        """After the outer step: this worker's anchor must be the one the aggregator published."""
        got = wire.anchor_digest(anchor)
        if got != self.anchor_digest:
            msg = (f"worker {self.node_id}: anchor digest {got} after the outer step is not the aggregator's "
                   f"{self.anchor_digest}: this worker's outer state diverged from the swarm's")
            log.error(msg)
            raise AnchorMismatch(msg)

    def _raise_if_ejected(self, e: ApiError) -> None:
        try:
            status = self.node.ledger().status
        except (ApiError, OSError, httpx.HTTPError):
            status = "unknown"
        if status == "ejected" or "eject" in e.detail:
            msg = (f"worker {self.node_id} was ejected by the orchestrator (its stake slashed for a contribution "
                   f"judged hostile): stopping. Aggregator said: {e.detail}")
            log.error(msg)
            raise Ejected(msg)

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=10.0)
        self.agg.close()
        self.node.close()


def _detail(r: httpx.Response) -> str:
    try:
        d = r.json().get("detail", r.text)
    except (ValueError, AttributeError):
        d = r.text
    return d if isinstance(d, str) else str(d)


def read_round_log(aggregator_url: str, timeout: float = 30.0) -> list[dict]:
    """Every published round's ``{round, accepted, rejected}`` the aggregator still serves (from the results'
    metadata), in order."""
    rows = []
    with httpx.Client(base_url=aggregator_url.rstrip("/"), timeout=timeout) as http:
        info = http.get("/v1/diloco/run")
        info.raise_for_status()
        numel, chunk, current = info.json()["numel"], info.json()["int8_chunk"], int(info.json()["round"])
        for rnd in range(current):
            r = http.get(f"/v1/diloco/rounds/{rnd}/result", params={"wait": 0})
            if r.status_code != 200:
                continue  # no longer kept
            res = wire.decode_result(r.content, numel, chunk)
            rows.append({"round": rnd, "accepted": res.accepted, "rejected": res.rejected})
    return rows
