"""What every orchestrator service shares: the refusal it raises (``ProtocolError``) and the caller it admitted
(``Principal``)."""

from __future__ import annotations

from dataclasses import dataclass


class ProtocolError(Exception):
    """A request refused with an HTTP status and a reason (becomes ``{"detail": reason}``); a 429 may say when
    to come back (``retry_after`` seconds, the ``Retry-After`` header)."""

    def __init__(self, status: int, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.retry_after = retry_after


@dataclass(frozen=True)
class Principal:
    node_id: str
    public_key: str
    role: str
    content_sha256: str
