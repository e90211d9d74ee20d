"""hivemind's ``DecentralizedAverager`` with swarmrl's state sharing and a count of the all-reduce's messages.

Imported only by ``comm.HivemindAverager`` (hivemind is an optional extra), so hivemind is imported at the top
here: hivemind reads the ``rpc_*`` methods' type hints to register them, and a hint can only be resolved from
names at module level.

What ``AllReduceTraffic`` counts: the serialized size (``ByteSize()``) of every ``averaging_pb2.AveragingData``
message of the all-reduce this peer sends or receives: the compressed tensor parts it sends to the peers that
reduce them (client side) and the averaged deltas it sends back for the part it reduces (server side), and the
same messages in the other direction. That is what hivemind hands to its libp2p streams for the averaging,
measured at the stream boundary; the daemon's framing and encryption, matchmaking, the DHT and state downloads
are not in it (``traffic.TcpTraffic`` measures all of that on the daemon's TCP connections). It also counts
the results that came back as an error code instead of an averaged part: hivemind logs those and keeps the
peer's own values for that part, but its ``step`` still reports the whole group.

``Uniform8Bit``: hivemind 1.1.12's 8-bit codec reads the codebook length with ``int()`` of a one-element array,
which NumPy 2 refuses (TypeError: only 0-dimensional arrays can be converted to Python scalars). The reducer then
fails on every part it receives, answers INTERNAL_ERROR, and every peer keeps its own values: no averaging at
all, silently. Importing this module registers a deserializer that reads the length as a scalar (same format,
same values) in place of hivemind's, in this process and in the averager it forks.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from typing import Any, AsyncIterator  # noqa: UP035  # typing's: hivemind spots a streaming handler by typing's alias

import numpy as np
import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.compression import Uniform8BitQuantization, serialization
from hivemind.p2p import P2P, P2PContext, PeerID, StubBase
from hivemind.proto import averaging_pb2, runtime_pb2

__all__ = ["AllReduceTraffic", "Uniform8Bit", "averager_class"]

_SENT, _RECEIVED, _REFUSED = 0, 1, 2
_ALL_REDUCE_CODES = (averaging_pb2.NO_CODE, averaging_pb2.PART_FOR_AVERAGING, averaging_pb2.AVERAGED_PART)


class Uniform8Bit(Uniform8BitQuantization):
    """hivemind's ``Uniform8BitQuantization`` whose ``extract`` works with NumPy 2 (see the module doc)."""

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        buf = serialized_tensor.buffer
        codebook_size = int(np.frombuffer(buf, count=1, dtype=np.int64)[0])
        codebook = np.frombuffer(buf, offset=8, count=codebook_size, dtype=self.codebook_dtype)
        quantized = np.frombuffer(buf, offset=8 + codebook.nbytes, dtype=self.indices_dtype)
        quantized = torch.as_tensor(quantized, dtype=torch.int64).reshape(tuple(serialized_tensor.size))
        codebook = torch.as_tensor(codebook).to(dtype=getattr(torch, serialized_tensor.dtype))
        return codebook[quantized].requires_grad_(serialized_tensor.requires_grad)


# hivemind deserializes by the message's compression type through this table, whoever compressed it
serialization._BASE_COMPRESSION_TYPES["UNIFORM_8BIT"] = Uniform8Bit()


class AllReduceTraffic:
    """Bytes of the all-reduce messages sent and received, in shared memory: hivemind runs the averager in a
    forked child process, which counts, while the worker reads in its own process."""

    def __init__(self) -> None:
        self._bytes = multiprocessing.Array("q", 3)  # created before the fork: the child shares it

    def add(self, which: int, n: int) -> None:
        with self._bytes.get_lock():
            self._bytes[which] += n

    @property
    def sent(self) -> int:
        return int(self._bytes[_SENT])

    @property
    def received(self) -> int:
        return int(self._bytes[_RECEIVED])

    @property
    def refused(self) -> int:
        """Results this peer asked for that came back as an error code (that part kept its own values)."""
        return int(self._bytes[_REFUSED])


async def _counted(stream: AsyncIterator[averaging_pb2.AveragingData], traffic: AllReduceTraffic,
                   which: int, refusals: bool = False) -> AsyncIterator[averaging_pb2.AveragingData]:
    async for msg in stream:
        traffic.add(which, msg.ByteSize())
        if refusals and msg.code not in _ALL_REDUCE_CODES:
            traffic.add(_REFUSED, 1)
        yield msg


class _CountingStub:
    """A peer's stub whose ``rpc_aggregate_part`` (this peer as a client: its parts out, the deltas back) is
    counted; every other call goes to hivemind's stub unchanged."""

    def __init__(self, stub: StubBase, traffic: AllReduceTraffic) -> None:
        self._stub, self._traffic = stub, traffic

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    async def rpc_aggregate_part(self, input: AsyncIterator[averaging_pb2.AveragingData],  # noqa: A002  # hivemind's name
                                 timeout: float | None = None) -> AsyncIterator[averaging_pb2.AveragingData]:
        stream = await self._stub.rpc_aggregate_part(_counted(input, self._traffic, _SENT), timeout=timeout)
        return _counted(stream, self._traffic, _RECEIVED, refusals=True)


def averager_class(traffic: AllReduceTraffic, state_fn: Callable[[], tuple[dict, list[torch.Tensor]]] | None,
                   lock: threading.Lock) -> type[DecentralizedAverager]:
    """A ``DecentralizedAverager`` subclass bound to this worker's counters and state. Every peer must use a class
    of the same name: hivemind names its RPC handlers after it."""

    class _Averager(DecentralizedAverager):
        def get_current_state(self):  # runs in our process (background thread)
            if state_fn is None:
                return super().get_current_state()
            with lock:
                meta, tensors = state_fn()
                return meta, [t.detach().cpu().clone() for t in tensors]

        async def rpc_aggregate_part(self, stream: AsyncIterator[averaging_pb2.AveragingData],
                                     context: P2PContext) -> AsyncIterator[averaging_pb2.AveragingData]:
            # this peer as the reducer of its part: the peers' parts in, the averaged deltas out
            async for msg in super().rpc_aggregate_part(_counted(stream, traffic, _RECEIVED), context):
                traffic.add(_SENT, msg.ByteSize())
                yield msg

        @classmethod
        def get_stub(cls, p2p: P2P, peer: PeerID, *, namespace: str | None = None) -> StubBase:
            return _CountingStub(super().get_stub(p2p, peer, namespace=namespace), traffic)  # type: ignore[return-value]

    return _Averager
