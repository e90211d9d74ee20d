"""Trainer side of swarm mode: a small process beside the unchanged trainer.

It tells the orchestrator the trainer's step (``set_step(n, n)`` whenever policy version n is
committed, with the trainer's new records from ``metrics/trainer.jsonl``: loss, reward, held-out accuracy, for
the dashboard), polls ``accepted(m)`` for the steps nodes may be working on (n .. n + async_level) and
downloads each accepted submission into ``run_dir/rollouts/step_m/`` under the ``RunDir`` name
pattern ``s<submission>.<node>-<time_ns>-g<usable groups>.parquet``. With SHARDCAST on it also
announces the weight servers (the launcher's relays, else the trainer's origin) and the origin's
manifest key, which heartbeat replies hand to the nodes. ``Trainer.collect_batch`` then works
exactly as in local mode: it only ever sees work the validator accepted (or, with the orchestrator's
``optimistic = true``, work still pending). The submission id in the name makes the adapter
restartable: files already fetched are not fetched again.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time

from pydantic import Field

from swarmrl.config import StrictModel
from swarmrl.dashboard.schemas import TrainerPoint, point_from_row
from swarmrl.protocol.client import ApiError, TrainerClient
from swarmrl.protocol.schemas import MAX_STEP_METRICS, InlineFile
from swarmrl.rl.config import RLConfig
from swarmrl.rollouts.wire import RolloutError, read_group_keys
from swarmrl.rundir.writer import RunDir
from swarmrl.utils.metrics import MetricsWriter
from swarmrl.utils.threads import set_role_threads

INLINE_FILES = 16  # accepted files asked to come inside the long poll's answer (the rest are downloaded)

log = logging.getLogger("swarmrl.swarm.adapter")

_FETCHED = re.compile(r"^s(?P<sid>\d+)\.")


class AdapterConfig(StrictModel):
    orchestrator: str = "http://127.0.0.1:8700"
    key: str = ""  # trainer key (its public key is in the orchestrator's trainer_keys)
    poll_s: float = Field(0.2, gt=0)
    # the trainer's current and next steps are polled every round; the steps beyond every ahead_every rounds and
    # at each new step (their files are needed only once the trainer gets there): a third of the adapter's
    # requests, the orchestrator's most frequent ones, off it
    ahead_every: int = Field(3, ge=1)
    # the trainer's newest version is looked at this often (a file read, no request): a new step is announced
    # and its work fetched at once instead of at the next poll (the trainer waits for that work)
    watch_s: float = Field(0.02, gt=0)
    # a thread long-polls the accepted work of the trainer's window (GET /v1/trainer/accepted: answered when a
    # verdict comes) up to this long per request instead of listing each open step every poll_s; 0, or an
    # orchestrator without that endpoint: plain polling every poll_s
    long_poll_s: float = Field(5.0, ge=0, le=10.0)
    idle_poll_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(30.0, gt=0)
    max_file_bytes: int = Field(64 << 20, gt=0)
    threads: int = Field(1, ge=0)  # CPU threads (pyarrow's pool; it loads no torch); 0: the library default


class TrainerAdapter:
    def __init__(self, rl: RLConfig, cfg: AdapterConfig, client=None) -> None:  # noqa: ANN001

        self.rl, self.cfg = rl, cfg
        set_role_threads(cfg.threads)
        self.run = RunDir(rl.run_dir)
        self.window = rl.contract.window(last_step=rl.steps - 1)
        self.rule = rl.contract.group_rule()
        self.client = client or TrainerClient(cfg.orchestrator, cfg.key, timeout=cfg.timeout_s)
        self.announced = -1
        self.fetched: set[int] = set()
        for d in self.run.rollouts.glob("step_*"):
            for p in d.iterdir():
                m = _FETCHED.match(p.name)
                if m:
                    self.fetched.add(int(m.group("sid")))
        self.metrics = MetricsWriter(self.run.metrics / "adapter.jsonl")
        self.weights_announced: dict | None = None
        self._trainer_offset = 0  # bytes of metrics/trainer.jsonl read so far
        self.unsent: list[TrainerPoint] = []  # trainer records not yet posted with set_step
        self.rounds = 0
        self._inbox: queue.Queue = queue.Queue()  # accepted work the watcher's long polls found (lists of items)
        self._watching = False  # the watcher's last long poll answered

    def _read_trainer_points(self) -> None:
        """Queue the trainer's new complete rows (steps, evaluations) as dashboard points."""
        path = self.run.trainer_metrics
        try:
            with open(path, "rb") as f:
                if f.seek(0, 2) < self._trainer_offset:  # a new file (fresh run): read it from the start
                    self._trainer_offset = 0
                f.seek(self._trainer_offset)
                data = f.read(1 << 20)
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) == 1 << 20:  # a line over 1 MiB is no record of ours: skip it
                self._trainer_offset += len(data)
            return
        self._trainer_offset += end + 1
        for line in data[:end].split(b"\n"):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            p = point_from_row(row) if isinstance(row, dict) else None
            if p is not None:
                self.unsent.append(p)

    def _announce_weights(self) -> None:
        """With SHARDCAST on, tell the orchestrator where nodes fetch weights: the relays the launcher started
        (``relays.json``), else the trainer's origin, and the origin's manifest-signing key."""
        if not self.rl.shardcast.enabled:
            return
        found = self.run.weight_servers(self.rl.shardcast.servers)
        if found is None:
            return
        servers, public_key = found
        base = (self.run.origin() or {}).get("base")  # version 0, once the origin has published it
        want = {"servers": servers, "public_key": public_key, "base": base}
        if want != self.weights_announced:
            self.client.set_weights(servers, public_key, base=base)
            self.weights_announced = want
            self.metrics.write(event="weights", **want)

    def poll_once(self, fetch: bool = True) -> int:
        """One round: announce the step, fetch newly accepted files (unless ``fetch`` is false: the watcher hands
        them over); returns the number fetched."""

        latest = self.run.latest_version()
        if latest is None:
            return 0
        if self.weights_announced is None or latest != self.announced or not self.weights_announced.get("base"):
            self._announce_weights()
        self._read_trainer_points()
        new_step = latest != self.announced
        self.rounds += 1
        if new_step or self.unsent:
            batch = self.unsent[:MAX_STEP_METRICS]
            try:
                self.client.set_step(latest, latest, metrics=batch)
            except ApiError as e:
                if e.status != 409:  # 409: the orchestrator is already there (adapter restart)
                    raise
            del self.unsent[:len(batch)]
            if latest != self.announced:
                self.announced = latest
                self.metrics.write(event="step", step=latest)
        n = 0
        if not fetch:
            return n
        for m in self.window.open_steps(latest):
            if m > latest + 1 and not new_step and self.rounds % self.cfg.ahead_every:
                continue
            for it in self.client.accepted(m).items:
                if it.submission_id in self.fetched:
                    continue
                self._fetch(m, it)
                n += 1
        return n

    def _fetch(self, step: int, it, inline: dict[int, InlineFile] | None = None) -> None:  # noqa: ANN001

        d = self.run.make_step_dir(step)
        tmp = d / f".s{it.submission_id}.tmp{os.getpid()}"
        try:
            sha = self.client.fetch_file(it.submission_id, tmp, inline, max_bytes=self.cfg.max_file_bytes)
            if sha != it.sha256:
                raise RolloutError("downloaded bytes do not match the submission's hash")
            # the orchestrator checked these bytes whole at upload (check_rollouts) and the trainer reads them whole
            # again: counting the usable groups for the file's name needs only the grouping columns
            g = len(self.rule.select([("f", read_group_keys(tmp))], step, self.window)[0])
        except (ApiError, RolloutError, OSError) as e:
            tmp.unlink(missing_ok=True)
            log.warning("submission %d not used: %s", it.submission_id, e)
            self.fetched.add(it.submission_id)
            self.metrics.write(event="unusable", submission_id=it.submission_id, step=step, reason=str(e)[:300])
            return
        name = f"s{it.submission_id}.{it.node_id[:16]}-{time.time_ns()}-g{g:04d}.parquet"
        os.replace(tmp, d / name)
        self.fetched.add(it.submission_id)
        self.metrics.write(event="fetched", submission_id=it.submission_id, node_id=it.node_id, step=step,
                           status=it.status, rows=it.n_rows, usable_groups=g)

    def _watch(self, halt: threading.Event) -> None:
        """Long-poll the accepted submissions of the trainer's window (``GET /v1/trainer/accepted``: answered when
        a verdict comes, optimistic: an upload) and hand each answer's items to the main loop's ``_inbox``."""
        seen = -1
        listed: set[int] = set()  # the previous answer's submissions: the ones of them fetched are not sent again
        with TrainerClient(self.cfg.orchestrator, self.cfg.key, timeout=self.cfg.timeout_s) as c:
            while not halt.is_set():
                try:
                    got = c.accepted_window(since=seen, wait=self.cfg.long_poll_s if seen >= 0 else 0.0,
                                            inline=INLINE_FILES, have=[i for i in listed if i in self.fetched])
                except Exception as e:  # noqa: BLE001 - an orchestrator without it, or restarting: poll meanwhile
                    if self._watching:
                        log.info("long poll of accepted work failed (%s): polling every %.1f s", e, self.cfg.poll_s)
                    self._watching, seen = False, -1
                    halt.wait(self.cfg.idle_poll_s)
                    continue
                self._watching = True
                seen = got.changes
                listed = {it.submission_id for it in got.items}
                self._inbox.put((got.items, {f.submission_id: f for f in got.files}))

    def _take_inbox(self) -> int:
        """Fetch what the watcher handed over (the steps the trainer has not passed yet); returns how many."""
        n = 0
        while True:
            try:
                items, inline = self._inbox.get_nowait()
            except queue.Empty:
                return n
            for it in items:
                if it.submission_id not in self.fetched and it.step >= self.announced:
                    self._fetch(it.step, it, inline)
                    n += 1

    def run_forever(self, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        next_poll = 0.0
        halt = threading.Event()  # ends the watcher (within one long poll; a daemon thread) when this returns
        if self.cfg.long_poll_s and self.cfg.key:
            threading.Thread(target=self._watch, args=(halt,), name="accepted", daemon=True).start()
        try:
            while not stop.is_set() and not self.run.is_done():
                watching = self._watching
                if time.monotonic() >= next_poll or self.run.latest_version() != self.announced:
                    try:  # announce a new step; list the steps' work too unless the watcher hands it over
                        got = self.poll_once(fetch=not watching)
                    except Exception as e:  # orchestrator restarting or a hiccup: keep polling
                        log.warning("adapter poll failed: %s", e)
                        got = 0
                    idle = self.cfg.idle_poll_s if watching else self.cfg.poll_s
                    next_poll = time.monotonic() + (0.0 if got else idle)
                try:
                    self._take_inbox()
                except Exception as e:  # noqa: BLE001 - a hiccup fetching: the next answer lists it again
                    log.warning("adapter fetch failed: %s", e)
                stop.wait(self.cfg.watch_s)
        finally:
            halt.set()
            self.metrics.close()


def run_adapter(rl: RLConfig, cfg: AdapterConfig) -> None:
    TrainerAdapter(rl, cfg).run_forever()
