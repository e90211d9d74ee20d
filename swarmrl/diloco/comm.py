"""Communication backends for DiLoCo on existing engines.

* ``TorchDistributedAverager``: a fixed group over ``torch.distributed`` (gloo on CPU, NCCL on GPU),
  rendezvous over TCP (torchrun-style MASTER_ADDR/MASTER_PORT). If a peer dies the next collective
  fails and the run stops: a fixed group cannot shrink.
* ``HivemindAverager``: elastic, decentralized averaging over a hivemind DHT
  (``hivemind.averaging.DecentralizedAverager``). Each round a worker looks for a group for a
  bounded time; peers that left are simply absent from the group, and a worker that finds nobody
  goes on with its own pseudo-gradient instead of stalling. A joining worker downloads the current
  outer state (anchor parameters, momentum, round) from a peer. hivemind is an optional extra and
  is imported lazily. hivemind's all-reduce hands every peer ``local + (mean - local)`` with the
  delta sent through the wire compression, so group members agree to rounding (not bit for bit);
  with fp16 the difference is of the order of fp16 rounding of the delta.

``bytes_sent``, counted per call, not predicted: over torch.distributed, the bytes of the tensors this
worker hands to the collectives (numel x element size of each tensor passed to ``all_reduce``; int8:
the codes plus the fp32 chunk scales of the MAX all-reduce); over hivemind, the serialized all-reduce
messages this peer sends (its compressed parts out, the averaged deltas of the part it reduces back),
counted at hivemind's stream boundary (``_hivemind.AllReduceTraffic``). What actually crosses the
network (a ring all-reduce sends about 2(W-1)/W times the tensor; gloo's headers, libp2p's framing,
matchmaking and the DHT) is measured separately from the kernel's TCP counters (``traffic.TcpTraffic``).

Wire int8: over torch.distributed, ``Int8Chunked`` with group-shared chunk scales (a MAX all-reduce
of the chunk absmax, then an int8 SUM all-reduce with ``127 // W`` levels per side) and optional
error feedback; over hivemind, hivemind's own ``Uniform8BitQuantization`` (8-bit codes plus a
256-entry fp32 codebook per part, no error feedback), with its deserializer fixed for NumPy 2
(``_hivemind.Uniform8Bit``: hivemind 1.1.12's fails on every part, and then no peer averages).
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from swarmrl.diloco.outer import Int8Chunked, WireDtype, compress, decompress, int8_levels
from swarmrl.utils.procs import die_with_parent

__all__ = ["AverageResult", "Averager", "TorchDistributedAverager", "HivemindAverager", "hivemind_available",
           "HIVEMIND_MISSING"]

HIVEMIND_MISSING = ("hivemind is not installed; install the optional extra: pip install 'swarmrl[hivemind]' "
                    "(hivemind==1.1.12 ships its p2pd binary in the wheel)")


def hivemind_available() -> bool:
    try:
        import hivemind  # noqa: F401, PLC0415  # lazy: optional
    except ImportError:
        return False
    return True


@dataclass
class AverageResult:
    tensor: torch.Tensor  # the group mean, fp32 CPU
    group_size: int  # how many workers took part (1 = no averaging happened)
    peer_rounds: list[int] | None = None  # hivemind: the round number each group member reported


class Averager(Protocol):
    bytes_sent: int
    rounds: int

    def average(self, flat: torch.Tensor) -> AverageResult: ...

    def close(self) -> None: ...


class TorchDistributedAverager:
    """Mean over a fixed ``torch.distributed`` process group; optional fp16/bf16 on the wire."""

    def __init__(self, rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int = 29500,
                 backend: str = "auto", wire: WireDtype = "fp32", timeout_s: float = 120.0,
                 device: str = "cpu", int8_chunk: int = 4096, error_feedback: bool = True) -> None:
        if backend == "auto":
            backend = "nccl" if device.startswith("cuda") else "gloo"
        self.rank, self.world_size, self.backend, self.wire = rank, world_size, backend, wire
        self.device = torch.device(device if backend == "nccl" else "cpu")
        self.bytes_sent = 0
        self.rounds = 0
        self._dist = dist
        self._int8 = Int8Chunked(int8_chunk)
        self.error_feedback = error_feedback
        self.residual: torch.Tensor | None = None  # int8 rounding left over from the last round
        dist.init_process_group(backend=backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))

    def average(self, flat: torch.Tensor) -> AverageResult:
        if self.wire == "int8":
            return self._average_int8(flat)
        # divide first, then SUM: the wire dtype never holds W times the value (fp16 range)
        t = compress(flat.float() / self.world_size, self.wire).to(self.device)
        self.bytes_sent += t.numel() * t.element_size()
        self._dist.all_reduce(t, op=self._dist.ReduceOp.SUM)
        self.rounds += 1
        return AverageResult(decompress(t.cpu()), self.world_size)

    def _average_int8(self, flat: torch.Tensor) -> AverageResult:
        x = flat.float()
        if self.error_feedback and self.residual is not None:
            x = x + self.residual
        levels = int8_levels(self.world_size)
        absmax = self._int8.absmax(x).to(self.device)
        self._dist.all_reduce(absmax, op=self._dist.ReduceOp.MAX)  # the group's shared chunk scales
        absmax = absmax.cpu()
        q = self._int8.quantize(x, absmax, levels)
        if self.error_feedback:
            self.residual = x - self._int8.dequantize(q, absmax, levels)
        qd = q.to(self.device)
        self._dist.all_reduce(qd, op=self._dist.ReduceOp.SUM)  # |sum| <= W * levels <= 127: no overflow
        self.bytes_sent += q.numel() * q.element_size() + absmax.numel() * absmax.element_size()
        self.rounds += 1
        return AverageResult(self._int8.dequantize(qd.cpu(), absmax, levels, divisor=self.world_size),
                             self.world_size)

    def broadcast(self, flat: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Everyone gets ``src``'s fp32 vector (start-of-run sync; not counted as round traffic)."""
        t = flat.float().clone().to(self.device)
        self._dist.broadcast(t, src=src)
        return t.cpu()

    def barrier(self) -> None:
        self._dist.barrier()

    def probe(self, numel: int) -> float:
        """Seconds one averaging's collectives take on zeros of a ``numel`` vector (the same dtypes and sizes as
        ``average``: int8 codes and their fp32 chunk scales, or the cast vector), after a barrier so a slower peer
        is not counted; the averaging's state and counters are left untouched."""
        self._dist.barrier()
        t = time.perf_counter()
        if self.wire == "int8":
            scales = self._int8.absmax(torch.zeros(numel)).to(self.device)
            self._dist.all_reduce(scales, op=self._dist.ReduceOp.MAX)
            codes = torch.zeros(numel, dtype=torch.int8, device=self.device)
            self._dist.all_reduce(codes, op=self._dist.ReduceOp.SUM)
        else:
            self._dist.all_reduce(compress(torch.zeros(numel), self.wire).to(self.device), op=self._dist.ReduceOp.SUM)
        return time.perf_counter() - t

    def max_int(self, value: int) -> int:
        """The largest of the workers' ``value`` (a group decision every worker takes the same way)."""
        t = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX)
        return int(t.item())

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


_FORK_HOOK = False


def _forks_die_with_parent() -> None:
    """Every process forked from here on (hivemind's DHT and averager processes, and theirs) gets SIGKILLed when
    the process that forked it dies: without it a killed worker left them running (seen after a killed bench)."""
    global _FORK_HOOK
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=lambda: die_with_parent(os.getppid()))
        _FORK_HOOK = True


class HivemindAverager:
    """Elastic averaging of a flat vector over a hivemind DHT.

    ``state_fn`` returns ``(metadata, [tensors])`` for peers that join and call
    ``load_state_from_peers``; it runs in a background thread of this process.
    """

    def __init__(self, numel: int, initial_peers: list[str], prefix: str = "swarmrl_diloco",
                 wire: WireDtype = "fp32", target_group_size: int | None = None, min_group_size: int = 2,
                 matchmaking_time: float = 3.0, round_timeout: float = 30.0,
                 state_fn: Callable[[], tuple[dict, list[torch.Tensor]]] | None = None,
                 host: str = "127.0.0.1") -> None:
        try:
            import hivemind  # noqa: PLC0415  # lazy: optional
            from hivemind.compression import Float16Compression, NoCompression  # noqa: PLC0415  # lazy: optional

            from swarmrl.diloco._hivemind import (  # noqa: PLC0415  # lazy: optional
                AllReduceTraffic,
                Uniform8Bit,
                averager_class,
            )
        except ImportError as e:
            raise RuntimeError(HIVEMIND_MISSING) from e

        # hivemind runs its averager as a forked child process; a process that was itself spawned
        # (spawn start method) would try to pickle it and fail.
        if multiprocessing.get_start_method(allow_none=True) != "fork":
            multiprocessing.set_start_method("fork", force=True)
        if wire == "fp16":
            compression = Float16Compression()
        elif wire == "fp32":
            compression = NoCompression()
        elif wire == "int8":
            compression = Uniform8Bit()
        else:
            raise ValueError(f"hivemind backend supports wire fp32, fp16 or int8, not {wire!r}")
        self.wire, self.round_timeout = wire, round_timeout
        self.rounds = 0
        self.solo_rounds = 0
        self.refused_rounds = 0  # a group formed but some part came back as an error: those values stayed local
        self._lock = threading.Lock()
        self._traffic = AllReduceTraffic()  # before the averager forks: its child process counts into it
        _forks_die_with_parent()  # hivemind forks its DHT and averager: they must not outlive this process
        self.dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=[f"/ip4/{host}/tcp/0"], start=True)
        averager = averager_class(self._traffic, state_fn, self._lock)
        self._avg = averager([torch.zeros(numel)], dht=self.dht, prefix=prefix, start=True,
                             target_group_size=target_group_size, min_group_size=min_group_size,
                             min_matchmaking_time=matchmaking_time, request_timeout=min(1.0, matchmaking_time / 2),
                             # without it a step whose all-reduce stalls (a peer that stops answering but keeps
                             # its connection) waits forever; with it the round fails and the worker goes on alone
                             allreduce_timeout=round_timeout,
                             compression=compression, state_compression=NoCompression(),
                             allow_state_sharing=state_fn is not None, declare_state_period=5.0)

    @property
    def bytes_sent(self) -> int:
        """Serialized bytes of the all-reduce messages this peer has sent (measured: see ``_hivemind``). Read just
        after ``average`` it may lack the last delta this peer sends back as a reducer, which can go out after
        its own result is in; the total at the end of a run has it."""
        return self._traffic.sent

    @property
    def bytes_received(self) -> int:
        return self._traffic.received

    def visible_maddrs(self) -> list[str]:
        return [str(a) for a in self.dht.get_visible_maddrs()]

    @property
    def lock(self) -> threading.Lock:
        """Hold while changing what ``state_fn`` returns, so a peer never downloads a half-updated state."""
        return self._lock

    def average(self, flat: torch.Tensor, round_no: int = 0) -> AverageResult:
        with self._avg.get_tensors() as ts:
            ts[0].copy_(flat.float())
        refused = self._traffic.refused
        try:
            group = self._avg.step(gather=int(round_no), timeout=self.round_timeout)
        except Exception:  # no group formed in time, or a peer vanished mid-all-reduce
            group = None
        self.rounds += 1
        if not group or len(group) < 2:
            self.solo_rounds += 1
            return AverageResult(flat.float().clone(), 1)
        if self._traffic.refused > refused:
            self.refused_rounds += 1
        with self._avg.get_tensors() as ts:
            out = ts[0].clone()
        rounds = [int(v) for v in group.values() if isinstance(v, int)]
        return AverageResult(out, len(group), rounds)

    def load_state_from_peers(self, timeout: float = 30.0) -> tuple[Any, list[torch.Tensor]] | None:
        res = self._avg.load_state_from_peers(timeout=timeout)
        if res is None:
            return None
        meta, tensors = res
        return meta, list(tensors)

    def close(self) -> None:
        try:
            self._avg.shutdown()
        finally:
            self.dht.shutdown()
