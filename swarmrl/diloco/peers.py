"""hivemind peers of a DiLoCo run: the peers file rank 0 publishes its addresses in, and the outer state a joining
(or lagging) worker downloads from a peer, checked before use (the peer may be hostile)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from swarmrl.diloco.outer import OuterNesterov

__all__ = ["peers_file", "wait_for_peers", "validated_state", "catch_up"]


def peers_file(out: Path) -> Path:
    return out / "hivemind_peers.json"


def wait_for_peers(path: Path, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file():
            try:
                peers = json.loads(path.read_text())
                if isinstance(peers, list) and peers and all(isinstance(p, str) for p in peers):
                    return peers
            except (json.JSONDecodeError, OSError):
                pass  # being written
        time.sleep(0.2)
    raise TimeoutError(f"no hivemind peers file at {path} after {timeout:.0f}s")


def validated_state(loaded, numel: int) -> tuple[int, int, torch.Tensor, torch.Tensor | None]:
    """Check a state downloaded from a (possibly hostile) peer: (round, outer_steps, anchor, buf)."""
    meta, tensors = loaded
    if not isinstance(meta, dict) or not isinstance(meta.get("round"), int) or not isinstance(meta.get("outer_steps"), int):
        raise ValueError("peer state metadata must be a dict with integer round and outer_steps")
    if meta["round"] < 0 or meta["outer_steps"] < 0:
        raise ValueError("peer state has a negative round")
    if len(tensors) != 2:
        raise ValueError(f"peer state must hold 2 tensors (anchor, momentum), got {len(tensors)}")
    anchor, buf = tensors
    if anchor.shape != (numel,) or buf.numel() not in (0, numel):
        raise ValueError("peer state tensors do not match this model")
    if not torch.isfinite(anchor).all() or not torch.isfinite(buf).all():
        raise ValueError("peer state holds non-finite values")
    return meta["round"], meta["outer_steps"], anchor.float(), (buf.float() if buf.numel() else None)


def catch_up(averager, outer: OuterNesterov, want_round: int, timeout: float) -> int | None:
    """Download a peer's outer state once it has reached ``want_round``; returns the new round."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loaded = averager.load_state_from_peers(timeout=timeout)
        if loaded is not None:
            try:
                rnd, steps, anchor, buf = validated_state(loaded, outer.anchor.numel())
            except ValueError:
                loaded = None  # a bad peer: ask again (hivemind picks peers by priority, then at random)
            else:
                if rnd >= want_round:
                    with averager.lock:
                        outer.load_state(anchor, buf, steps)
                    return rnd
        time.sleep(0.3)
    return None
