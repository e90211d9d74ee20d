"""``swarmrl node join URL``: a machine with nothing of the run joins it from the orchestrator's URL alone.

In order, each step refusing with one line before anything is registered or half-written:

1. read the run's description (``GET /v1/run``: at most ``MAX_DESCRIPTION_BYTES``, signed by the run key of the
   join line, or the key remembered from the first join: ``swarmrl.protocol.description``);
2. check this machine: the packages that generate the run's tasks (named with their install line) and the memory
   the base model needs (``memory_factor`` times its size);
3. make the node's key if it has none (``<work_dir>/node.pem``);
4. get the base model: cached, a local copy with the same bundle hash, or SHARDCAST version 0 through the run's
   weight servers, checked against the description's hash (``swarmrl.policy.base``);
5. run a ``SwarmNode`` whose run settings are the description's: it samples with the contract of each assignment
   and verifies every version against the weight key the description names.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import httpx

from swarmrl.envs.requirements import Requirement, missing
from swarmrl.policy.base import BaseUnavailable, ensure_base
from swarmrl.protocol.description import MAX_DESCRIPTION_BYTES, DescriptionError, RunDescription, verify_description
from swarmrl.protocol.signing import node_id_for
from swarmrl.rl.config import RLConfig
from swarmrl.swarm.config import JoinConfig, SwarmNodeConfig
from swarmrl.utils.keys import load_or_make_private_key, public_key_hex

log = logging.getLogger("swarmrl.swarm.join")

RUN_KEY_FILE = "run_key"


class JoinRefused(RuntimeError):
    """This machine does not join (the message says why and what to do); ``code`` is the CLI's exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def read_description(url: str, pinned_key: str | None = None, timeout_s: float = 30.0) -> RunDescription:
    """The run's description from the orchestrator at ``url``, read up to ``MAX_DESCRIPTION_BYTES`` (one more
    and it is refused unread) and verified (``verify_description``)."""
    base = url.rstrip("/")
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False) as c, c.stream("GET", f"{base}/v1/run") as r:
            if r.status_code != 200:
                raise JoinRefused(f"{base}/v1/run answered {r.status_code} (is {base} a swarmrl orchestrator?)")
            raw = bytearray()
            for chunk in r.iter_bytes():
                raw += chunk
                if len(raw) > MAX_DESCRIPTION_BYTES:
                    raise JoinRefused(f"{base}/v1/run: the answer is over {MAX_DESCRIPTION_BYTES:,} bytes")
    except httpx.HTTPError as e:
        raise JoinRefused(f"the orchestrator at {base} does not answer: {type(e).__name__}: {e}") from None
    try:
        return verify_description(bytes(raw), pinned_key)
    except DescriptionError as e:
        raise JoinRefused(f"{base}/v1/run: {e}") from None


def available_memory() -> int | None:
    """Bytes of memory available to a new process (``MemAvailable``), None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_machine(d: RunDescription, memory_factor: float) -> None:
    """Refuse (status 2) what this machine cannot serve: packages the task needs, memory for the base model."""
    need = missing([Requirement(p.name, p.version) for p in d.requires])
    if need:
        raise JoinRefused(f"the run's task {d.contract.task.name} needs "
                          f"{', '.join(f'{r.name}=={r.version}' if r.version else r.name for r in need)}, not "
                          f"installed here ({'; '.join(r.install_line() for r in need)})", code=2)
    have = available_memory()
    if d.base is not None and have is not None and memory_factor > 0 and have < memory_factor * d.base.bytes:
        raise JoinRefused(f"the base model is {d.base.bytes / 1e9:.2f} GB and this machine has "
                          f"{have / 1e9:.2f} GB available, under the {memory_factor:g}x it needs (memory_factor)",
                          code=2)


def _run_key(cfg: JoinConfig, work: Path) -> str | None:
    if cfg.run_key:
        return cfg.run_key.strip().lower()
    f = work / RUN_KEY_FILE
    return f.read_text().strip() if f.is_file() else None


def node_key(cfg: JoinConfig, work: Path) -> tuple[Path, str]:
    """The node's key file (made on first join, mode 0600) and its public key."""
    path = Path(cfg.key) if cfg.key else work / "node.pem"
    return path, public_key_hex(load_or_make_private_key(path))


def node_settings(cfg: JoinConfig, d: RunDescription, work: Path, key: Path, base_dir: Path
                  ) -> tuple[SwarmNodeConfig, RLConfig]:
    """The node's settings and the run settings it works under: the description's contract and weight key, this
    machine's backend, threads and directories."""
    rl = RLConfig(run_dir=str(work), model=str(base_dir), contract=d.contract, inference=cfg.inference,
                  keep_versions=max(4, d.contract.async_level + 1), workers={"proofs": True})
    stake = d.min_stake if cfg.stake is None else cfg.stake
    node = SwarmNodeConfig(orchestrator=cfg.orchestrator, key=str(key), stake=stake, timeout_s=cfg.timeout_s,
                           threads=cfg.threads, policy_source=f"shardcast:{d.weights.public_key}",
                           work_dir=str(work), stop_file=str(work / "STOP"),
                           policy_timeout_s=cfg.policy_timeout_s, hold_policy=cfg.hold_policy,
                           hold_grace_s=cfg.hold_grace_s, inference=cfg.inference,
                           deposit_wait_s=cfg.deposit_wait_s)
    return node, rl


def join(cfg: JoinConfig) -> int:
    """Join and work until stopped (module docstring); returns the node's exit status. Raises ``JoinRefused``."""
    if not cfg.orchestrator:
        raise JoinRefused("no orchestrator URL (swarmrl node join URL)", code=2)
    t0 = time.time()
    work = Path(cfg.work_dir)
    pinned = _run_key(cfg, work)
    try:
        d = read_description(cfg.orchestrator, pinned, cfg.timeout_s)
    except JoinRefused as e:
        if pinned is not None and not cfg.run_key and "not the run key" in str(e):
            raise JoinRefused(f"{e} (remembered in {work / RUN_KEY_FILE} from an earlier join: for another run, "
                              "give its --run-key or use another --work-dir)") from None
        raise
    if pinned is None:
        log.warning("trusting run key %s on first use (remembered in %s)", d.orchestrator_key, work / RUN_KEY_FILE)
    check_machine(d, cfg.memory_factor)
    waited = time.monotonic()
    while d.base is None:  # the trainer publishes version 0 as it starts: a node started beside it waits
        if time.monotonic() - waited > cfg.base_wait_s:
            raise JoinRefused(f"the run has not published its base model (version 0) within {cfg.base_wait_s:g} s; "
                              "try again later")
        log.info("waiting for the run's base model (version 0) to be published")
        time.sleep(2.0)
        d = read_description(cfg.orchestrator, d.orchestrator_key, cfg.timeout_s)
    work.mkdir(parents=True, exist_ok=True)
    key, pub = node_key(cfg, work)
    log.info("node key %s (node id %s): registration waits up to %g s for a stake deposited for it", pub,
             node_id_for(pub), cfg.deposit_wait_s)
    local = [cfg.model_dir] if cfg.model_dir else []
    try:
        base_dir, got = ensure_base(d.base.blake3, d.base.bytes, d.weights.servers, d.weights.public_key,
                                    work / "cache", local=local)
    except BaseUnavailable as e:
        raise JoinRefused(str(e)) from None
    log.info("base model %s... (%s): %s", d.base.blake3[:16], got["source"], base_dir)
    if pinned is None:
        (work / RUN_KEY_FILE).write_text(d.orchestrator_key + "\n")
    node_cfg, rl = node_settings(cfg, d, work, key, base_dir)
    from swarmrl.swarm.node import SwarmNode  # noqa: PLC0415  # lazy: torch and the backend, once all checks passed

    node = SwarmNode(node_cfg, rl=rl, base_model=d.base.blake3)
    node.metrics.write(event="join", time=t0, base_source=got["source"], base_s=got.get("seconds"),
                       base_bytes=got.get("bytes"), pid=os.getpid())
    return node.run()


__all__ = ["JoinRefused", "available_memory", "check_machine", "join", "read_description"]
