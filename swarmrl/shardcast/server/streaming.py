"""What a SHARDCAST server needs to send shards other than by sendfile: an upload cap shared by all responses
(``Pacer``) and shards a relay is still receiving, served onward as they arrive (``Growing``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pacer", "Growing"]


class Pacer:
    """An upload budget shared by every response that uses it: bytes leave at most ``bps`` per second in all.
    Each chunk reserves the next free slot (FIFO), so concurrent downloads share the rate fairly; unused
    time is not saved up (no bursts after an idle spell)."""

    def __init__(self, bps: float) -> None:
        if not bps > 0:
            raise ValueError("upload rate must be positive")
        self.bps = float(bps)
        self._next = 0.0

    async def take(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = max(now, self._next)
        self._next = start + n / self.bps
        if start > now:
            await asyncio.sleep(start - now)


@dataclass
class Growing:
    """A shard a relay is receiving: served onward while it arrives (``have`` contiguous bytes of ``path``).
    Its bytes are not verified yet; every reader checks the shard's signed BLAKE3 itself, and a reset
    (``gen`` bumped: a bad or restarted transfer) cuts off every response streaming it."""

    path: Path
    size: int
    have: int = 0
    gen: int = 0
    final: bool = False
    waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
        self.waiter = None

    async def wait(self, timeout: float) -> bool:
        if self.waiter is None or self.waiter.done():
            self.waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self.waiter), timeout)
            return True
        except TimeoutError:
            return False
