"""A node's membership loop: register (once), heartbeat on the orchestrator's interval, hand new
assignments to a worker callback and upload what it returns. While the callback works, a keepalive thread
goes on heartbeating on the same interval (a node silent for a few intervals loses its open work to live
nodes). After finishing work it heartbeats again at once (the reply carries its next assignment), so a busy
node never idles for a heartbeat interval. A node without work whose orchestrator takes long polls
(``long_poll`` in its replies) asks again at once with ``?wait=<interval>``: the orchestrator answers when work
may have opened (a new step or policy, a rejection, work put back up) instead of the node sleeping an interval.

The inference worker plugs in as ``handler(assignment, reply) -> path | None`` (the rollout parquet
file to submit, or None to skip). Without a handler the loop only keeps the node alive.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.schemas import AssignmentSpec, HeartbeatReply

log = logging.getLogger("swarmrl.protocol.node")

MAX_HEARTBEAT_WAIT_S = 10.0  # the orchestrator holds a heartbeat at most this long (its MAX_CHANGES_WAIT_S)

Handler = Callable[[AssignmentSpec, HeartbeatReply], "Path | str | None"]


def ensure_registered(client: NodeClient, throughput: float, stake: float, hardware: dict | None = None,
                      attempts: int = 30, deposit_wait_s: float = 60.0, base_model: str | None = None) -> None:
    """Register, or find the key registered already; waits out the per-address registration limit (429), and for
    up to ``deposit_wait_s`` a stake deposit not made yet (403 with Retry-After: a node started beside its stake
    authority may ask before the deposit lands)."""
    t0 = time.monotonic()
    for i in range(attempts):
        try:
            client.register(throughput=throughput, stake=stake, hardware=hardware, base_model=base_model)
            log.info("registered as %s", client.node_id)
            return
        except ApiError as e:
            if e.status == 409:
                log.info("already registered as %s", client.node_id)
                return
            no_deposit_yet = e.status == 403 and e.retry_after is not None
            if not (e.status == 429 or no_deposit_yet) or i == attempts - 1 or \
                    (no_deposit_yet and time.monotonic() - t0 >= deposit_wait_s):
                raise
            wait = min(30.0, e.retry_after or 1.0)
            if i % 30 == 0:  # a wait for a deposit may be long: say so now and then, not every second
                log.warning("registration refused for now (%s); retrying in %.0f s", e.detail, wait)
            time.sleep(wait)


@contextlib.contextmanager
def keepalive(client: NodeClient, interval_s: float) -> Iterator[None]:
    """Heartbeat every ``interval_s`` in a thread while the body runs (replies are left to the main loop: the
    work they list stays listed until done)."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(interval_s):
            try:
                client.heartbeat()
            except Exception as e:  # the main loop reports failures; a keepalive only keeps trying
                log.debug("keepalive heartbeat failed: %s", e)

    t = threading.Thread(target=beat, name="keepalive", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(timeout=interval_s + 60.0)


def run_node(client: NodeClient, handler: Handler | None = None, stop: threading.Event | None = None,
             max_beats: int = 0, on_reply: Callable[[HeartbeatReply], None] | None = None) -> int:
    """Heartbeat until ``stop`` is set (or ``max_beats`` beats); returns the number of beats."""
    stop = stop or threading.Event()
    done: set[int] = set()
    beats = 0
    wait = 0.0  # after a reply without work from an orchestrator that takes long polls: the next heartbeat waits
    while not stop.is_set():
        interval = 10.0
        worked = False
        long_poll = False
        unserved = False  # the reply holds work this node will not do (no handler): a held poll would return at once
        try:
            reply = client.beat(wait=wait)  # the reply its last upload came with, else a heartbeat
            interval = reply.heartbeat_interval_s
            long_poll = reply.long_poll
            beats += 1
            if on_reply:
                on_reply(reply)
            for a in reply.assignments:
                if handler is None:
                    unserved = True
                    continue
                if a.assignment_id in done:
                    continue
                done.add(a.assignment_id)
                worked = True
                with keepalive(client, interval):
                    path = handler(a, reply)
                    if path is not None:
                        rep = client.submit(a.assignment_id, path)
                        log.info("submitted assignment %d: submission %d", a.assignment_id, rep.submission_id)
        except ApiError as e:
            if e.status in (401, 403):
                log.error("orchestrator refused this node: %s", e)
                raise
            log.warning("heartbeat failed: %s", e)
            if e.status in (429, 503) and e.retry_after:  # busy or rate-limited: come back when it says
                interval = min(interval, e.retry_after)
        except OSError as e:  # network: keep trying
            log.warning("orchestrator unreachable: %s", e)
        if max_beats and beats >= max_beats:
            break
        # a node that just finished work beats again at once: the reply carries its next work. An idle one asks
        # again at once too when the orchestrator holds its heartbeat until work may have opened (at most one
        # interval, so it stays as alive as one beating every interval), else it sleeps an interval.
        # A node holding work it does not do sleeps its interval: the orchestrator answers a held poll at once while
        # the node holds work, so asking again at once would beat as fast as the link allows.
        wait = min(interval, MAX_HEARTBEAT_WAIT_S) if long_poll and not worked and not unserved else 0.0
        if not worked and not wait:
            stop.wait(interval)
    return beats
