"""Clients of the orchestrator API: every call is signed with the caller's Ed25519 key (httpx).

``NodeClient`` is what an inference worker uses (register, heartbeat, submit); ``ValidatorClient``,
``TrainerClient`` and ``AuthorityClient`` (stake deposits) add the calls of those roles. Errors come back as ``ApiError`` carrying the
HTTP status and the server's reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarmrl.dashboard.schemas import TrainerPoint
from swarmrl.protocol.schemas import (
    MAX_DECLINE_REASON,
    AcceptedList,
    Balance,
    DeclineReply,
    DeclineRequest,
    DepositReply,
    DepositRequest,
    DilocoRoundReply,
    DilocoRoundRequest,
    HeartbeatReply,
    HeartbeatRequest,
    InlineFile,
    PendingList,
    RegisterReply,
    RegisterRequest,
    StepReply,
    StepRequest,
    SubmissionDetail,
    SubmitReply,
    VerdictReply,
    VerdictRequest,
    WeightsReply,
    WeightsRequest,
)
from swarmrl.protocol.signing import load_private_key, node_id_for, public_key_hex, sign_request

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import subprocess


class ApiError(RuntimeError):
    def __init__(self, status: int, detail: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail
        self.retry_after = retry_after  # seconds, from a Retry-After header (429, 503; a 403 that may pass later)


class SignedClient:
    def __init__(self, base_url: str, key: Ed25519PrivateKey | str | Path, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.key = key if isinstance(key, Ed25519PrivateKey) else load_private_key(key)
        self.public_key = public_key_hex(self.key)
        self.node_id = node_id_for(self.public_key)
        self.http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout, transport=transport)

    def close(self) -> None:
        self.http.close()

    def __enter__(self):  # noqa: ANN204
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _check(r: httpx.Response) -> httpx.Response:
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except (ValueError, AttributeError):
                detail = r.text
            retry = r.headers.get("retry-after", "")
            raise ApiError(r.status_code, detail if isinstance(detail, str) else json.dumps(detail),
                           float(retry) if retry.isdigit() else None)
        return r

    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None,
                timeout: float | None = None) -> httpx.Response:
        """Sign and send; ``path`` plus the encoded query is what gets signed."""
        data = b"" if body is None else (body.model_dump_json().encode() if hasattr(body, "model_dump_json")
                                         else json.dumps(body).encode())
        url = httpx.URL(path, params=params)
        signed_path = url.raw_path.decode("ascii")
        headers = sign_request(self.key, method, signed_path, data)
        if data:
            headers["Content-Type"] = "application/json"
        extra = {} if timeout is None else {"timeout": timeout}
        return self._check(self.http.request(method, signed_path, content=data, headers=headers, **extra))


class NodeClient(SignedClient):
    def register(self, throughput: float, stake: float, hardware: dict[str, Any] | None = None,
                 base_model: str | None = None) -> RegisterReply:
        """Join; ``base_model``: the BLAKE3 of the base model bundle this node serves (refused if not the run's)."""
        req = RegisterRequest(hardware=hardware or {}, throughput=throughput, stake=stake, base_model=base_model)
        return RegisterReply.model_validate_json(self.request("POST", "/v1/nodes/register", req).content)

    def heartbeat(self, status: dict[str, Any] | None = None, wait: float = 0.0) -> HeartbeatReply:
        """With ``wait`` (an idle node): a reply without work comes only once work may have opened or after
        ``wait`` seconds (orchestrators that say ``long_poll`` in their replies; others answer at once)."""
        req = HeartbeatRequest(status=status or {})
        read = self.http.timeout.read
        return HeartbeatReply.model_validate_json(self.request(
            "POST", "/v1/nodes/heartbeat", req, params={"wait": wait} if wait else None,
            timeout=None if not wait or read is None else wait + read).content)

    def submit(self, assignment_id: int, path: str | Path) -> SubmitReply:
        """Upload a rollout parquet file (streamed) for an assignment."""
        path = Path(path)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digest = h.hexdigest()
        url = f"/v1/submissions/upload/{int(assignment_id)}?next=1"  # answered with the next heartbeat's reply
        headers = sign_request(self.key, "PUT", url, content_sha256=digest)
        headers["Content-Type"] = "application/octet-stream"

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as f:
                yield from iter(lambda: f.read(1 << 20), b"")

        headers["Content-Length"] = str(path.stat().st_size)
        r = self._check(self.http.put(url, content=chunks(), headers=headers))
        rep = SubmitReply.model_validate_json(r.content)
        if rep.next is not None:
            self._next = (time.monotonic(), rep.next)
        return rep

    def decline(self, assignment_id: int, reason: str = "") -> DeclineReply:
        """Decline an open assignment this node cannot serve: it goes back up for other nodes at once and is not
        handed back to this one (``reason``: at most 500 characters, cut to fit)."""
        self._next = None  # a reply held from the last upload may list it still
        req = DeclineRequest(reason=reason[:MAX_DECLINE_REASON])
        return DeclineReply.model_validate_json(
            self.request("POST", f"/v1/assignments/{int(assignment_id)}/decline", req).content)

    def beat(self, max_age_s: float = 2.0, wait: float = 0.0) -> HeartbeatReply:
        """The heartbeat reply the last upload came with (if it is at most ``max_age_s`` old and not used yet),
        else a heartbeat (a long poll with ``wait``)."""
        got, self._next = getattr(self, "_next", None), None
        if got is not None and time.monotonic() - got[0] <= max_age_s:
            return got[1]
        return self.heartbeat(wait=wait)

    def submission(self, submission_id: int) -> SubmissionDetail:
        r = self._check(self.http.get(f"/v1/submissions/{int(submission_id)}"))
        return SubmissionDetail.model_validate_json(r.content)

    def ledger(self, node_id: str | None = None) -> Balance:
        r = self._check(self.http.get(f"/v1/nodes/{node_id or self.node_id}/ledger"))
        return Balance.model_validate_json(r.content)


class ValidatorClient(SignedClient):
    def pending(self, limit: int = 16, wait: float = 0.0, inline: int = 0) -> PendingList:
        """Pending submissions; with ``wait``, an empty answer comes only after an upload or ``wait`` seconds; with
        ``inline``, the files of that many listed come along (``files``; orchestrators without it send none)."""
        params: dict[str, Any] = {"limit": limit}
        if wait:
            params["wait"] = wait
        if inline:
            params["inline"] = inline
        read = self.http.timeout.read
        return PendingList.model_validate_json(self.request(
            "GET", "/v1/validator/pending", params=params,
            timeout=None if not wait or read is None else wait + read).content)

    def fetch_file(self, submission_id: int, out: str | Path, inline: dict[int, InlineFile] | None = None,
                   max_bytes: int = 256 << 20) -> str:
        """The submission's file to ``out`` (from ``inline``, a listing's ``files`` by id, when it came along, else
        downloaded); returns its sha256. Inline bytes over ``max_bytes`` or not base64: downloaded instead."""
        got = (inline or {}).get(submission_id)
        if got is not None:
            try:
                data = got.decoded(max_bytes)
            except ValueError as e:
                log.warning("submission %d: inline file not used (%s): downloading it", submission_id, e)
            else:
                Path(out).write_bytes(data)
                return hashlib.sha256(data).hexdigest()
        return self.download(submission_id, out, max_bytes=max_bytes)

    def download(self, submission_id: int, out: str | Path, max_bytes: int = 256 << 20) -> str:
        """Fetch a submission's file to ``out``; returns its sha256."""
        url = f"/v1/submissions/{int(submission_id)}/file"
        headers = sign_request(self.key, "GET", url)
        h = hashlib.sha256()
        size = 0
        with self.http.stream("GET", url, headers=headers) as r:
            if r.status_code >= 400:
                r.read()
                self._check(r)
            with open(out, "wb") as f:
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise ApiError(413, f"file over {max_bytes} bytes")
                    h.update(chunk)
                    f.write(chunk)
        return h.hexdigest()

    def verdict(self, req: VerdictRequest) -> VerdictReply:
        return VerdictReply.model_validate_json(self.request("POST", "/v1/validator/verdicts", req).content)

    def diloco_round(self, req: DilocoRoundRequest) -> DilocoRoundReply:
        """Report a DiLoCo round's judgements (credit the accepted, slash and eject the rejected; idempotent)."""
        return DilocoRoundReply.model_validate_json(
            self.request("POST", "/v1/validator/diloco/rounds", req).content)


class TrainerClient(ValidatorClient):
    def set_step(self, step: int, policy_version: int, metrics: list[TrainerPoint] | None = None) -> StepReply:
        req = StepRequest(step=step, policy_version=policy_version, metrics=metrics or [])
        return StepReply.model_validate_json(self.request("POST", "/v1/trainer/step", req).content)

    def set_weights(self, servers: list[str], public_key: str, base: dict | None = None) -> WeightsReply:
        """Announce the weight servers, their manifest key and (``base``: ``{"blake3", "bytes"}``) version 0."""
        req = WeightsRequest(servers=servers, public_key=public_key, base=base)
        return WeightsReply.model_validate_json(self.request("POST", "/v1/trainer/weights", req).content)

    def accepted_window(self, since: int = -1, wait: float = 0.0, inline: int = 0,
                        have: Iterable[int] = ()) -> AcceptedList:
        """Accepted submissions of the trainer's current step and its async window, once the verdict counter is no
        longer ``since`` or after ``wait`` seconds (pass the answer's ``changes`` as the next ``since``); with
        ``inline``, the files of that many listed ones not in ``have`` come along (``files``)."""
        read = self.http.timeout.read
        params: dict[str, Any] = {"since": since, "wait": wait}
        if inline:
            params["inline"] = inline
            held = ",".join(str(int(i)) for i in sorted(set(have)))
            if held:
                params["have"] = held
        return AcceptedList.model_validate_json(self.request(
            "GET", "/v1/trainer/accepted", params=params, timeout=None if read is None else wait + read).content)

    def accepted(self, step: int) -> AcceptedList:
        return AcceptedList.model_validate_json(
            self.request("GET", f"/v1/trainer/steps/{int(step)}/submissions").content)


class AuthorityClient(SignedClient):
    """A stake authority (its key in the orchestrator's ``stake_authority_keys``): deposits stake for nodes."""

    def deposit(self, amount: float, node_id: str | None = None, public_key: str | None = None,
                note: str = "") -> DepositReply:
        req = DepositRequest(node_id=node_id, public_key=public_key, amount=amount, note=note)
        return DepositReply.model_validate_json(self.request("POST", "/v1/ledger/deposits", req).content)


def wait_until_up(url: str, proc: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    """Block until the orchestrator at ``url`` answers ``/v1/health``; fail early if ``proc`` (its process) exits."""

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"orchestrator exited with {proc.returncode} while starting")
        try:
            if httpx.get(url.rstrip("/") + "/v1/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"orchestrator at {url} did not come up within {timeout:.0f}s")
