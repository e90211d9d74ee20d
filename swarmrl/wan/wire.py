"""The user-space wire: forwards IP packets between the two TUN devices of each delaying link (one in the role's
namespace, one in the core namespace), holding each packet for the link's one-way delay and dropping each with
the link's loss chance (a seeded generator per direction), so the role's TCP sees real round trips and real
losses. The kernel's netem would do this; this kernel has none. Rates are tc's (token bucket filter on both
TUN devices, set by the harness): the wire forwards as fast as packets come.

``python -m swarmrl.wan.wire SPEC.json``; the spec: ``{"links": [{"a_ns", "a_dev", "b_ns", "b_dev", "delay_s",
"loss", "seed"}], "cleanup": [namespaces], "max_s": seconds}``. It prints ``ready`` once every device is open,
and on its way out one JSON line on stderr with each direction's packets in, lost, dropped on overflow and out.
It is the harness's keeper too: it receives SIGTERM when the process that started it dies (``PR_SET_PDEATHSIG``)
and then, as on any SIGTERM or SIGINT or after ``max_s``, removes the ``cleanup`` namespaces before it exits, so a
launcher killed with SIGKILL leaves no namespace behind.

Bounds: a direction holds at most ``QUEUE_BYTES`` (more is dropped, as a full router queue would), a round reads
at most ``BATCH`` packets per device, and the process ends after ``max_s``.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import select
import signal
import struct
import sys
import time
from collections import deque

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
QUEUE_BYTES = 16 << 20
BATCH = 64


def open_tun(ns: str, dev: str) -> int:
    """A non-blocking fd on TUN device ``dev`` of namespace ``ns`` (this process enters ``ns`` to open it: a TUN
    device is looked up in the namespace of the process that opens /dev/net/tun)."""
    from swarmrl.wan.netns import enter  # noqa: PLC0415

    enter(ns)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TUN | IFF_NO_PI))
    return fd


class Direction:
    """Packets read from ``src``, written to ``dst`` ``delay_s`` later unless lost."""

    def __init__(self, src: int, dst: int, delay_s: float, loss: float, seed: int, name: str = "") -> None:
        self.src, self.dst, self.delay_s, self.loss = src, dst, delay_s, loss
        self.rng = random.Random(seed)
        self.queue: deque[tuple[float, bytes]] = deque()
        self.held = 0
        self.stats = {"name": name, "in": 0, "lost": 0, "overflow": 0, "out": 0}

    def take(self, now: float) -> None:
        for _ in range(BATCH):
            try:
                pkt = os.read(self.src, 65536)
            except BlockingIOError:
                return
            except OSError:  # the device went away (its namespace is being removed)
                return
            self.stats["in"] += 1
            if self.loss and self.rng.random() < self.loss:
                self.stats["lost"] += 1
            elif self.held + len(pkt) > QUEUE_BYTES:
                self.stats["overflow"] += 1
            else:
                self.queue.append((now + self.delay_s, pkt))
                self.held += len(pkt)

    def release(self, now: float) -> float | None:
        """Write every packet that is due; the time the next one is due (None: none held)."""
        q = self.queue
        while q and q[0][0] <= now:
            _, pkt = q.popleft()
            self.held -= len(pkt)
            try:
                os.write(self.dst, pkt)
                self.stats["out"] += 1
            except OSError:  # the device is down or gone: the packet is lost, as on a cut cable
                self.stats["lost"] += 1
        return q[0][0] if q else None


def _cleanup(names: list[str]) -> None:
    import subprocess  # noqa: PLC0415

    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def forward(directions: list[Direction], deadline: float) -> None:
    """The wire's loop, until ``deadline`` (monotonic)."""
    poller = select.epoll()
    by_fd: dict[int, list[Direction]] = {}
    for d in directions:
        by_fd.setdefault(d.src, []).append(d)
    for fd in by_fd:
        poller.register(fd, select.EPOLLIN)
    while True:
        now = time.monotonic()
        if now >= deadline:
            return
        due = [t for d in directions if (t := d.release(now)) is not None]
        timeout = min([*(t - now for t in due), deadline - now, 1.0])
        for fd, _ in poller.poll(max(0.0, timeout)):
            now = time.monotonic()
            for d in by_fd.get(fd, ()):
                d.take(now)


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())

    def _stop(_sig, _frame):  # noqa: ANN001, ANN202
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    directions = []
    try:
        parent = int(os.environ.pop("SWARMRL_PARENT_PID", "0") or 0)
        if parent:  # the keeper's SIGTERM when the harness's process dies: clean up, then exit
            from swarmrl.utils.procs import die_with_parent  # noqa: PLC0415

            die_with_parent(parent, signal.SIGTERM)
        for i, link in enumerate(spec["links"]):
            a, b = open_tun(link["a_ns"], link["a_dev"]), open_tun(link["b_ns"], link["b_dev"])
            half, seed = float(link["delay_s"]), int(link.get("seed", 0)) * 1000 + 2 * i
            directions += [Direction(a, b, half, float(link["loss"]), seed, f"{link['a_ns']} up"),
                           Direction(b, a, half, float(link["loss"]), seed + 1, f"{link['a_ns']} down")]
        print("ready", flush=True)
        forward(directions, time.monotonic() + float(spec.get("max_s", 86400.0)))
    finally:
        stats = [d.stats for d in directions]
        print(json.dumps({"stats": stats}), file=sys.stderr, flush=True)
        _cleanup(list(spec.get("cleanup", [])))


if __name__ == "__main__":
    main(sys.argv[1])
