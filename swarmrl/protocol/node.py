"""A node's membership loop: register (once), heartbeat on the orchestrator's interval, hand new
assignments to a worker callback and upload what it returns. After finishing work it heartbeats again
at once (the reply carries its next assignment), so a busy node never idles for a heartbeat interval.

The inference worker plugs in as ``handler(assignment, reply) -> path | None`` (the rollout parquet
file to submit, or None to skip). Without a handler the loop only keeps the node alive.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from swarmrl.protocol.client import ApiError, NodeClient
from swarmrl.protocol.schemas import AssignmentSpec, HeartbeatReply

log = logging.getLogger("swarmrl.protocol.node")

Handler = Callable[[AssignmentSpec, HeartbeatReply], "Path | str | None"]


def ensure_registered(client: NodeClient, throughput: float, stake: float, hardware: dict | None = None) -> None:
    try:
        client.register(throughput=throughput, stake=stake, hardware=hardware)
        log.info("registered as %s", client.node_id)
    except ApiError as e:
        if e.status != 409:
            raise
        log.info("already registered as %s", client.node_id)


def run_node(client: NodeClient, handler: Handler | None = None, stop: threading.Event | None = None,
             max_beats: int = 0, on_reply: Callable[[HeartbeatReply], None] | None = None) -> int:
    """Heartbeat until ``stop`` is set (or ``max_beats`` beats); returns the number of beats."""
    stop = stop or threading.Event()
    done: set[int] = set()
    beats = 0
    while not stop.is_set():
        interval = 10.0
        worked = False
        try:
            reply = client.heartbeat()
            interval = reply.heartbeat_interval_s
            beats += 1
            if on_reply:
                on_reply(reply)
            for a in reply.assignments:
                if a.assignment_id in done or handler is None:
                    continue
                done.add(a.assignment_id)
                worked = True
                path = handler(a, reply)
                if path is not None:
                    rep = client.submit(a.assignment_id, path)
                    log.info("submitted assignment %d: submission %d", a.assignment_id, rep.submission_id)
        except ApiError as e:
            if e.status in (401, 403):
                log.error("orchestrator refused this node: %s", e)
                raise
            log.warning("heartbeat failed: %s", e)
        except OSError as e:  # network: keep trying
            log.warning("orchestrator unreachable: %s", e)
        if max_beats and beats >= max_beats:
            break
        if not worked:  # a node that just finished work beats again at once: the reply carries its next work
            stop.wait(interval)
    return beats
