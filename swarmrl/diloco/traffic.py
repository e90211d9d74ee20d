"""TCP bytes a process tree sent and received, as the kernel counts them (Linux sock_diag + ``tcp_info``).

What is counted: for every TCP socket held open by the process or one of its descendants (hivemind's p2pd
daemon is a grandchild of a worker), the kernel's ``tcpi_bytes_sent`` (payload bytes sent, retransmissions
included; Linux >= 4.19, before that ``tcpi_bytes_acked``, which also counts the SYN) and
``tcpi_bytes_received`` (payload bytes received). These are TCP payload bytes: what the
application put on the connection, framing and encryption of the transport included (gloo's message headers,
libp2p's noise and yamux frames), IP/TCP headers not. Connections whose two ends both belong to the tree
(a process talking to itself over loopback, e.g. rank 0's TCPStore client and server) are left out: that is
not traffic between workers.

The counters live on the sockets, so a socket closed between two ``sample`` calls loses what it moved since
the last sample; the worker samples at every outer round and at the end, and the averaging connections
(gloo's pairs, p2pd's peer connections) stay open for the whole run.

Per-socket counters come from one netlink ``SOCK_DIAG_BY_FAMILY`` dump per address family (what ``ss -ti``
reads): /proc/net/tcp has no byte counters, and /proc/<pid>/io counts every read and write, unix sockets and
files included.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

__all__ = ["TcpTraffic", "TcpCounts", "tcp_sockets", "process_tree", "socket_inodes"]

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_INFO = 2
_NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_DIAG_REQ = struct.Struct("=BBBxI")  # family, protocol, extensions, pad, states (inet_diag_req_v2 head)
_SOCKID_LEN = 48  # inet_diag_sockid: sport, dport (big endian), src[16], dst[16], if, cookie[2]
_DIAG_MSG = struct.Struct("=BBBB48sIIIII")  # family, state, timer, retrans, sockid, expires, rq, wq, uid, inode
_RTA = struct.Struct("=HH")
# struct tcp_info (linux/tcp.h): 8 one-byte fields, 24 u32, then u64 pacing_rate, max_pacing_rate, bytes_acked,
# bytes_received (Linux >= 4.2), ..., u64 bytes_sent at 200 (Linux >= 4.19)
_BYTES_ACKED_AT, _BYTES_RECEIVED_AT, _BYTES_SENT_AT = 120, 128, 200


@dataclass(frozen=True)
class _Sock:
    inode: int
    local: tuple[bytes, int]  # (address bytes, port)
    remote: tuple[bytes, int]
    sent: int
    received: int


@dataclass(frozen=True)
class TcpCounts:
    sent: int
    received: int


def _dump(family: int) -> list[_Sock]:
    req = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), 0xFFFFFFFF) + bytes(_SOCKID_LEN)
    hdr = _NLMSG_HDR.pack(_NLMSG_HDR.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
    out: list[_Sock] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.sendto(hdr + req, (0, 0))
        while True:
            data = nl.recv(1 << 20)
            off = 0
            while off + _NLMSG_HDR.size <= len(data):
                length, mtype, _, _, _ = _NLMSG_HDR.unpack_from(data, off)
                if mtype == _NLMSG_DONE:
                    return out
                if mtype == _NLMSG_ERROR:
                    (err,) = struct.unpack_from("=i", data, off + _NLMSG_HDR.size)
                    raise OSError(-err, "sock_diag dump failed")
                sock = _parse(data, off + _NLMSG_HDR.size, off + length, family)
                if sock is not None:
                    out.append(sock)
                off += (length + 3) & ~3


def _parse(data: bytes, start: int, end: int, family: int) -> _Sock | None:
    _, _, _, _, sockid, _, _, _, _, inode = _DIAG_MSG.unpack_from(data, start)
    sport, dport = struct.unpack_from("!HH", sockid, 0)
    alen = 4 if family == socket.AF_INET else 16
    src, dst = sockid[4:4 + alen], sockid[20:20 + alen]
    off = start + _DIAG_MSG.size
    while off + _RTA.size <= end:
        rlen, rtype = _RTA.unpack_from(data, off)
        if rlen < _RTA.size:
            break
        if rtype == _INET_DIAG_INFO and rlen - _RTA.size >= _BYTES_RECEIVED_AT + 8:
            info = off + _RTA.size
            sent_at = _BYTES_SENT_AT if rlen - _RTA.size >= _BYTES_SENT_AT + 8 else _BYTES_ACKED_AT
            (sent,) = struct.unpack_from("=Q", data, info + sent_at)
            (received,) = struct.unpack_from("=Q", data, info + _BYTES_RECEIVED_AT)
            return _Sock(inode, (src, sport), (dst, dport), sent, received)
        off += (rlen + 3) & ~3
    return None  # listening sockets and sockets without tcp_info move no payload


def _address(raw: bytes) -> str:
    """An IPv4 or IPv6 address as text (an IPv4-mapped IPv6 address as its IPv4 form)."""
    if len(raw) == 16 and raw[:12] == bytes(10) + b"\xff\xff":
        raw = raw[12:]
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def tcp_sockets() -> list[_Sock]:
    """Every TCP socket of this network namespace (IPv4 and IPv6) with its byte counters."""
    return _dump(socket.AF_INET) + _dump(socket.AF_INET6)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (from each process's parent in /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])  # after "pid (comm) state"
        children.setdefault(ppid, []).append(int(name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, ()))
    return tree


def socket_inodes(pids: list[int]) -> set[int]:
    """Inodes of the sockets the processes ``pids`` hold open."""
    inodes: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


class TcpTraffic:
    """Bytes the TCP connections of a process tree moved since the first ``sample`` (see the module doc).

    ``available`` is False where the kernel's counters cannot be read (not Linux, no sock_diag): then every
    sample is None rather than a made-up figure.
    """

    def __init__(self, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._base: dict[int, tuple[int, int]] | None = None  # inode -> counters at the first sample
        self._last: dict[int, tuple[int, int]] = {}  # inode -> counters when last seen
        self.available = True
        self.peers: set[str] = set()  # remote addresses of the counted connections seen by any sample

    def _ours(self) -> dict[int, tuple[int, int]]:
        mine = socket_inodes(process_tree(self.pid))
        socks = [s for s in tcp_sockets() if s.inode in mine]
        ends = {(s.local, s.remote) for s in socks}
        counted = [s for s in socks if (s.remote, s.local) not in ends]
        self.peers.update(_address(s.remote[0]) for s in counted if s.remote[1])  # port 0: a listener
        return {s.inode: (s.sent, s.received) for s in counted}

    def sample(self) -> TcpCounts | None:
        """Bytes sent and received since the first sample, over every connection seen since then."""
        if not self.available:
            return None
        try:
            now = self._ours()
        except OSError:
            self.available = False
            return None
        if self._base is None:
            self._base = dict(now)
        self._last.update(now)
        sent = sum(v[0] - self._base.get(k, (0, 0))[0] for k, v in self._last.items())
        received = sum(v[1] - self._base.get(k, (0, 0))[1] for k, v in self._last.items())
        return TcpCounts(sent, received)
