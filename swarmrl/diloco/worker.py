"""One DiLoCo (or DDP-baseline) worker process.

Run as ``python -m swarmrl.diloco.worker --config CFG.json --rank R --world W`` (the launcher does
this; torchrun-style MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE env vars are honoured too). Writes
``OUT/worker{R}.jsonl`` (metrics) and ``OUT/worker{R}.summary.json``.

The model, the inner optimizer and its schedule come from the shared builders (``swarmrl.training``): a fresh model
from ``init``, torch's own AdamW (``fused=False``: the implementation DiLoCo's figures were measured with) and the
warm-up with a cosine decay to ``min_lr_ratio`` at ``total_steps``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from swarmrl.diloco.comm import AverageResult, HivemindAverager, TorchDistributedAverager
from swarmrl.diloco.config import DilocoConfig
from swarmrl.diloco.corpus import build_corpus, describe
from swarmrl.diloco.data import answer_mask, eval_loss, masked_mean, mean_loss, seq_losses, token_losses
from swarmrl.diloco.outer import (
    OuterNesterov,
    apply_delayed,
    flatten,
    params_digest,
    pseudo_gradient,
    unflatten_into,
)
from swarmrl.diloco.overlap import AutoOverlap
from swarmrl.diloco.peers import catch_up, peers_file, validated_state, wait_for_peers
from swarmrl.diloco.traffic import TcpCounts, TcpTraffic
from swarmrl.models.io import save_model
from swarmrl.training.model import build_model, prepare_model
from swarmrl.training.optim import build_optimizer, clip_gradients
from swarmrl.training.schedule import build_scheduler
from swarmrl.utils.metrics import MetricsWriter
from swarmrl.utils.procs import adopt_parent_death

if TYPE_CHECKING:
    from swarmrl.diloco.trust.client import TamperHook


@dataclass
class _Pending:
    """An outer all-reduce in flight: its result, the parameters it was computed from, when it is due."""

    result: Future[AverageResult]
    sent_from: torch.Tensor
    due_step: int


def run_worker(cfg: DilocoConfig, rank: int, world: int, tamper: TamperHook | None = None) -> dict:
    """Train as worker ``rank`` of ``world``; returns the summary (also in ``OUT/worker{R}.summary.json``).
    ``tamper`` (backend swarm; benchmarks and tests only): what a hostile worker uploads instead."""
    w = _Worker(cfg, rank, world)
    w.tamper = tamper
    if world > 1 or cfg.backend in ("hivemind", "swarm"):
        w.connect()
    w.tcp_setup = w.tcp.sample()  # rendezvous, initial broadcast or state download: reported apart
    w.train()
    return w.finish()


class _Worker:
    """One worker's run, split by phase: set-up (``__init__``), joining the averaging (``connect``), the inner
    and outer steps (``train``) and the summary (``finish``). The attributes are the state the phases share: the
    model and its optimisers, the averager with the round state a joining peer downloads, and the counters the
    summary reports."""

    def __init__(self, cfg: DilocoConfig, rank: int, world: int) -> None:
        torch.set_num_threads(cfg.threads)
        self.cfg, self.rank, self.world = cfg, rank, world
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = torch.device(cfg.device)
        self.model, self.tok = build_model(None, cfg.init)  # a fresh model, same seed on every worker: identical start
        prepare_model(self.model.to(self.device))
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.corpus = build_corpus(cfg, self.tok)  # the stdlib source (default) or a task's text
        self.eval_batch = self.corpus.eval_batch(cfg.eval_seqs)
        # torch's own AdamW implementation (not the fused kernel): the inner steps DiLoCo's figures were measured with
        self.opt = build_optimizer(self.params, cfg.inner_lr, cfg.betas, cfg.weight_decay, fused=False)
        self.sched = build_scheduler(self.opt, cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio)  # cosine decay
        self.outer = OuterNesterov(flatten(self.params), lr=cfg.outer_lr, momentum=cfg.outer_momentum)
        self.metrics = MetricsWriter(self.out / f"worker{rank}.jsonl")
        self.evaluates = rank == 0 or cfg.backend == "hivemind"
        self.averager: TorchDistributedAverager | HivemindAverager | None = None
        self.executor: ThreadPoolExecutor | None = None
        # overlap (tau inner steps): fixed by the config, or "auto" (swarmrl.diloco.overlap; _decide_overlap)
        auto = cfg.overlap_steps == "auto" and cfg.mode == "diloco" and cfg.backend in ("torch", "hivemind")
        self.auto = AutoOverlap(cfg) if auto else None
        self.tau = cfg.overlap_steps if isinstance(cfg.overlap_steps, int) else 0
        # inner steps a round: H, lengthened by "auto" over torch.distributed when one averaging outlasts H steps
        self.h = cfg.inner_steps
        self.next_sync = cfg.inner_steps  # the step of the next outer sync (set from start_step when training starts)
        self.synced = False  # an outer round was sent at this step (default evaluation: then)
        self.start_step = 0
        self.step = 0
        self.rnd = 0
        self.joined_from: dict | None = None
        self.tamper: TamperHook | None = None  # backend swarm: an adversary's hook (run_worker)
        self.state = {"round": 0}  # what a joining peer downloads (guarded by the averager's lock)
        self.t0 = 0.0
        self.train_s = 0.0
        self.sync_time = 0.0
        # compute utilization (benchmarks/diloco/wan.py): inner_s = forward, backward, clipping and the AdamW step
        # (a DDP step's gradient all-reduce not included); eval_s = held-out evaluation and metric logging;
        # loop_s = the training loop's wall time, first inner step (or step-0 evaluation) to the last round
        self.inner_s = self.eval_s = self.loop_s = 0.0
        self.out_of_time = False  # DDP with max_wall_s: the group agreed to stop
        self.last_step_s = 0.0
        self.losses: list[float] = []
        self.evals: list[dict] = []
        self.round_rows: list[dict] = []
        self.left = False
        # the kernel's count of what this worker's TCP connections carry (the averaging's real traffic, for
        # both backends); the first sample, before any connection, is the zero point
        self.tcp = TcpTraffic()
        self.tcp.sample()
        self.tcp_setup: TcpCounts | None = None
        self.tcp_end: TcpCounts | None = None

    # -- joining the averaging

    def connect(self) -> None:
        """The averager: torch.distributed (rank 0's parameters broadcast to all) or hivemind (rank 0 publishes
        its addresses in the peers file; a joining worker loads the swarm's outer state)."""
        cfg = self.cfg
        if cfg.backend == "torch":
            port = int(os.environ.get("MASTER_PORT", cfg.master_port or 29500))
            self.averager = TorchDistributedAverager(self.rank, self.world,
                                                     os.environ.get("MASTER_ADDR", cfg.master_addr), port,
                                                     backend=cfg.dist_backend, wire=cfg.wire, device=cfg.device,
                                                     int8_chunk=cfg.int8_chunk, error_feedback=cfg.error_feedback)
            synced = self.averager.broadcast(self.outer.anchor, src=0)
            self.outer.anchor = synced
            unflatten_into(synced, self.params)
            if self.auto is not None:  # "auto": what one outer all-reduce costs on this link, timed before training
                self.auto.comm_s = self.averager.probe(self.numel)
            # every rank has all of the broadcast before anyone trains: what the kernel counts from here on
            # is training traffic (rank 0's broadcast may still be in its socket buffer when it returns)
            self.averager.barrier()
            return
        if cfg.backend == "swarm":
            self._connect_swarm()
            return
        hm = cfg.hivemind
        pfile = peers_file(self.out)
        if hm.initial_peers:
            initial = list(hm.initial_peers)
        elif self.rank == 0 and not hm.join:
            initial = []
        else:
            initial = wait_for_peers(pfile, hm.peers_file_timeout)
        self.averager = HivemindAverager(self.numel, initial, prefix=hm.prefix, wire=cfg.wire,
                                         target_group_size=self.world if self.world > 1 else None,
                                         min_group_size=hm.min_group_size, matchmaking_time=hm.matchmaking_time,
                                         round_timeout=hm.round_timeout, state_fn=self._peer_state,
                                         host=hm.host)
        if self.rank == 0 and not initial:
            tmp = pfile.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.averager.visible_maddrs()))
            tmp.replace(pfile)
        if hm.join:
            self._join()

    def _connect_swarm(self) -> None:
        """Register at the orchestrator, join the judging aggregator and start from its anchor and momentum
        (``swarmrl.diloco.trust.client``); with a ``tamper`` hook (a hostile worker: ``swarmrl.attacks.diloco``
        runs it) it uploads what the hook says instead of its pseudo-gradient."""
        from swarmrl.diloco.trust.client import SwarmAverager  # noqa: PLC0415  # lazy: the swarm backend only

        cfg, tr, tamper = self.cfg, self.cfg.trust, self.tamper
        self.averager = SwarmAverager(tr, self.numel, int8_chunk=cfg.int8_chunk, error_feedback=cfg.error_feedback,
                                      tamper=tamper)
        st = self.averager.state
        self.outer.load_state(st.anchor, st.momentum, st.outer_steps)
        unflatten_into(self.outer.anchor, self.params)
        self.rnd = self.state["round"] = st.round
        self.start_step = min(cfg.total_steps, st.round * cfg.inner_steps)
        for _ in range(self.start_step):
            self.sched.step()  # a late joiner resumes the schedule where the run is
        self.joined_from = {"round": st.round, "digest": st.digest, "node_id": self.averager.node_id,
                            "adversary": tr.adversary if tamper is not None else "none"}
        self.metrics.write(event="joined", **self.joined_from)

    def _peer_state(self) -> tuple[dict, list[torch.Tensor]]:
        """What a joining peer downloads: the round, the outer steps, the anchor and the momentum buffer."""
        buf = self.outer.buf if self.outer.buf is not None else torch.zeros(0)
        return {"round": self.state["round"], "outer_steps": self.outer.steps}, [self.outer.anchor, buf]

    def _join(self) -> None:
        """Load a valid outer state from a peer and resume the round and the schedule where the swarm is."""
        got = None
        for _ in range(10):
            loaded = self.averager.load_state_from_peers(timeout=self.cfg.hivemind.round_timeout)
            if loaded is not None:
                try:
                    got = validated_state(loaded, self.numel)
                    break
                except ValueError as e:
                    self.metrics.write(event="rejected_peer_state", reason=str(e))
            time.sleep(1.0)
        if got is None:
            raise RuntimeError("joining worker could not load a valid outer state from any peer")
        with self.averager.lock:
            self.outer.load_state(got[2], got[3], got[1])
            self.rnd = got[0]
            self.state["round"] = self.rnd
        unflatten_into(self.outer.anchor, self.params)
        self.start_step = self.rnd * self.cfg.inner_steps
        with warnings.catch_warnings():  # resume the schedule where the swarm is: stepping it before any inner
            # step is the point here, so torch's warning about the order of the two calls does not apply
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            for _ in range(self.start_step):
                self.sched.step()
        self.joined_from = {"round": self.rnd, "digest": params_digest(self.outer.anchor)}
        self.metrics.write(event="joined", round=self.rnd, step=self.start_step, digest=self.joined_from["digest"])

    # -- training

    def train(self) -> None:
        """Inner steps until ``total_steps`` (or until a hivemind worker leaves), an outer round every
        round (diloco: ``inner_steps``, or the longer rounds "auto" chose), evaluation and metrics as configured."""
        cfg = self.cfg
        self.t0 = time.perf_counter()
        self.step = self.start_step
        if self.evaluates and self.start_step == 0:
            ev = eval_loss(self.model, self.eval_batch)
            self.evals.append({"step": 0, "eval_loss": ev, "wall_s": 0.0})
            self.eval_s += time.perf_counter() - self.t0
            self.metrics.write(step=0, eval_loss=ev)
        pending: _Pending | None = None
        self.next_sync = (self.start_step // self.h + 1) * self.h
        overlapping = self.tau > 0 or self.auto is not None
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="outer") if overlapping and self.averager else None
        hm_leave = cfg.backend == "hivemind" and cfg.hivemind.leave_after_rounds
        while self.step < cfg.total_steps and not self.out_of_time:
            ts = time.perf_counter()
            self._inner_step()
            row: dict = {}
            if cfg.mode == "diloco":
                row, pending = self._outer_round(pending)
            self.train_s += time.perf_counter() - ts
            self._evaluate_and_log(row)
            if hm_leave and cfg.mode == "diloco" and self.rnd >= hm_leave and row.get("round"):
                self.left = True
                self.metrics.write(event="left", round=self.rnd, step=self.step)
                break
        if pending is not None:  # left early (hivemind leave_after_rounds) with a round in flight
            self._finish_round(pending)
        if self.executor is not None:
            self.executor.shutdown(wait=True)
        self.loop_s = time.perf_counter() - self.t0
        self.tcp_end = self.tcp.sample()

    def _inner_step(self) -> None:
        """One AdamW step on this worker's batch (DDP mode: on the gradients all-reduced first)."""
        cfg, params, averager = self.cfg, self.params, self.averager
        t_in, comm_s = time.perf_counter(), 0.0
        x = self.corpus.train_batch(self.rank, self.step, cfg.batch_size).to(self.device)
        loss = self.model(input_ids=x, labels=x).loss
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.mode == "ddp" and averager is not None:
            ta = time.perf_counter()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = flatten(grads)
            if cfg.max_wall_s is not None:  # this worker's vote to stop rides on the gradients: the group agrees
                # (stop after this step if the next one would end past max_wall_s, steps taking as long as the last:
                # the rest of this one and the next, at most two of them)
                late = ta - self.t0 + 2 * self.last_step_s >= cfg.max_wall_s
                flat = torch.cat([flat, torch.ones(1) if late else torch.zeros(1)])
            res = averager.average(flat)
            mean = res.tensor
            if cfg.max_wall_s is not None:
                self.out_of_time, mean = bool(mean[-1] > 0), mean[:-1]
            unflatten_into(mean, grads)
            for p, g in zip(params, grads):
                p.grad = g
            comm_s = time.perf_counter() - ta
            self.sync_time += comm_s
        clip_gradients(params, self.opt, cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        self.step += 1
        lv = float(loss.detach())
        if not math.isfinite(lv):
            raise FloatingPointError(f"worker {self.rank}: loss became {lv} at step {self.step}")
        self.losses.append(lv)
        self.last_step_s = time.perf_counter() - t_in
        self.inner_s += self.last_step_s - comm_s

    def _outer_round(self, pending: _Pending | None) -> tuple[dict, _Pending | None]:
        """DiLoCo after an inner step: finish the round in flight once it is due; every round (``self.h`` steps) send
        the pseudo-gradient (finished at once unless overlapped). Returns the metrics row and what is in flight."""
        cfg, step = self.cfg, self.step
        row: dict = {}
        if pending is not None and (step >= pending.due_step or step == cfg.total_steps):
            row = self._finish_round(pending)
            pending = None
        self.synced = step >= self.next_sync or step == cfg.total_steps
        if self.synced:
            ta = time.perf_counter()
            auto = self.auto if self.averager is not None else None
            if auto is not None and not auto.decided and auto.known_before_round_one(self._step_s()):
                self._decide_overlap()  # the first round may overlap too
            current = flatten(self.params)
            pg = pseudo_gradient(self.outer.anchor, current)
            timed = auto is not None and not auto.decided  # hivemind: time the first round, decide after it
            pending = _Pending(self._submit_average(pg, self.rnd, timed), current, step + self.tau)
            self.next_sync = step + self.h
            self.sync_time += time.perf_counter() - ta
            if self.tau == 0 or step == cfg.total_steps:
                if row:  # the round in flight finished at this step too (the last step): its own metrics row
                    self.metrics.write(step=step, **row)
                row = self._finish_round(pending)
                pending = None
                if timed and step < cfg.total_steps:
                    self._decide_overlap()
        return row, pending

    def _step_s(self) -> float:
        return self.inner_s / max(1, self.step - self.start_step)

    def _decide_overlap(self) -> None:
        """``overlap_steps = "auto"``: take tau (``swarmrl.diloco.overlap``; over torch.distributed the group's
        largest) and log the decision."""
        agree = self.averager.max_int if isinstance(self.averager, TorchDistributedAverager) else None
        self.tau = self.auto.decide(self._step_s(), agree)
        self.h = self.auto.round_steps
        self.metrics.write(event="overlap", step=self.step, **self.auto.decision)

    def _evaluate_and_log(self, row: dict) -> None:
        cfg, step = self.cfg, self.step
        te = time.perf_counter()
        # DiLoCo's default (eval_every None): at every outer sync, however long its rounds
        due = self.synced if cfg.mode == "diloco" and cfg.eval_every is None else step % cfg.eval_interval == 0
        if due or step == cfg.total_steps or self.out_of_time:
            if self.evaluates:
                row["eval_loss"] = eval_loss(self.model, self.eval_batch)
                self.evals.append({"step": step, "eval_loss": row["eval_loss"], "wall_s": round(te - self.t0, 3)})
            self.tcp.sample()  # a connection closed later keeps what it carried up to here
        if row or step % cfg.log_every == 0:
            recent = self.losses[-cfg.log_every:]
            self.metrics.write(step=step, loss=sum(recent) / len(recent), lr=self.sched.get_last_lr()[0],
                               train_s=round(self.train_s, 3), **row)
        self.eval_s += time.perf_counter() - te

    def _average(self, pg: torch.Tensor, round_no: int) -> AverageResult:
        averager = self.averager
        if averager is None:
            return AverageResult(pg, 1)
        return averager.average(pg, round_no) if self.cfg.backend in ("hivemind", "swarm") else averager.average(pg)

    def _submit_average(self, pg: torch.Tensor, round_no: int, timed: bool = False) -> Future[AverageResult]:
        run = self._timed_average if timed else self._average
        if self.executor is not None:
            return self.executor.submit(run, pg, round_no)  # overlapped with the next inner steps
        done: Future[AverageResult] = Future()
        done.set_result(run(pg, round_no))
        return done

    def _timed_average(self, pg: torch.Tensor, round_no: int) -> AverageResult:
        """The first round's averaging, timed (``overlap_steps = "auto"`` over hivemind: matchmaking included)."""
        t = time.perf_counter()
        res = self._average(pg, round_no)
        self.auto.comm_s = time.perf_counter() - t
        return res

    def _finish_round(self, p: _Pending) -> dict:
        """Wait for the averaged pseudo-gradient, take the outer step, move the worker's parameters."""
        averager, outer, state = self.averager, self.outer, self.state
        ta = time.perf_counter()
        res = p.result.result()
        pg, group = res.tensor, res.group_size
        behind_of = max(res.peer_rounds) if res.peer_rounds and max(res.peer_rounds) > self.rnd else None
        lock = getattr(averager, "lock", None)
        if lock is not None:
            with lock:
                outer.step(pg)
                self.rnd += 1
                state["round"] = self.rnd
        else:
            outer.step(pg)
            self.rnd += 1
        if self.cfg.backend == "swarm":
            averager.verify_anchor(outer.anchor)  # the aggregator's published anchor, or stop loudly
        if behind_of is not None:  # a peer is ahead: catch up from its state
            caught = catch_up(averager, outer, behind_of + 1, self.cfg.hivemind.round_timeout)
            if caught is not None:
                with averager.lock:
                    self.rnd = caught
                    state["round"] = self.rnd
                self.metrics.write(event="caught_up", round=self.rnd, step=self.step)
        if self.tau:
            unflatten_into(apply_delayed(outer.anchor, p.sent_from, flatten(self.params)), self.params)
        else:
            unflatten_into(outer.anchor, self.params)
        self.sync_time += time.perf_counter() - ta
        r = {"round": self.rnd, "group_size": group, "digest": params_digest(outer.anchor),
             "bytes_sent": averager.bytes_sent if averager else 0}
        self.round_rows.append({"round": self.rnd, "step": self.step, **r})
        return r

    # -- the end

    def _tcp_summary(self) -> dict:
        """Kernel-counted TCP bytes: during training (first inner step to the last round) and during set-up."""
        setup, end = self.tcp_setup, self.tcp_end
        if setup is None or end is None:
            return {"tcp_bytes_sent": None, "tcp_bytes_received": None, "tcp_setup_bytes_sent": None}
        return {"tcp_bytes_sent": end.sent - setup.sent, "tcp_bytes_received": end.received - setup.received,
                "tcp_setup_bytes_sent": setup.sent}

    def finish(self) -> dict:
        """Final evaluation, the summary (metrics, ``worker{R}.summary.json``), the model (rank 0) and the final
        parameters (``save_final_params``); then leave the averaging."""
        cfg, rank, averager, model, tok, out = self.cfg, self.rank, self.averager, self.model, self.tok, self.out
        ce = token_losses(model, self.eval_batch)  # one pass over the eval windows for every final figure
        final_eval = mean_loss(ce)
        sep, eol = (tok.encode(c, add_special_tokens=False) for c in ("=", "\n"))
        final_answer = (masked_mean(ce, answer_mask(self.eval_batch, sep[0], eol[0]))
                        if cfg.data == "task" and len(sep) == 1 and len(eol) == 1 else None)
        flat = flatten(self.params)
        step, losses = self.step, self.losses
        summary = {
            "rank": rank, "world": self.world, "mode": cfg.mode, "backend": cfg.backend, "wire": cfg.wire,
            "steps": step, "start_step": self.start_step, "rounds": self.rnd, "inner_steps": cfg.inner_steps,
            "round_steps": self.h,
            "params": self.numel, "data": describe(self.corpus, cfg), "bytes_sent": averager.bytes_sent if averager else 0,
            **self._tcp_summary(),
            "sync_calls": averager.rounds if averager else 0,
            "solo_rounds": getattr(averager, "solo_rounds", 0),
            "refused_rounds": getattr(averager, "refused_rounds", 0),
            "final_eval_loss": final_eval, "final_answer_loss": final_answer,
            # per eval sequence (rank 0 and hivemind's evaluators): for paired standard errors between runs
            "final_eval_seq_losses": [round(x, 6) for x in seq_losses(ce)] if self.evaluates else None,
            "final_train_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
            "digest": params_digest(flat), "train_s": round(self.train_s, 2), "sync_s": round(self.sync_time, 2),
            "wall_s": round(time.perf_counter() - self.t0, 2),
            # compute utilization: inner-step time over the loop's wall time less its evaluation and logging
            "inner_s": round(self.inner_s, 3), "eval_s": round(self.eval_s, 3), "loop_s": round(self.loop_s, 3),
            "utilization": round(self.inner_s / max(1e-9, self.loop_s - self.eval_s), 4),
            "stopped_at_max_wall": self.out_of_time,
            "overlap_steps": self.tau, "overlap_decision": self.auto.decision if self.auto else None,
            "tcp_peers": sorted(self.tcp.peers),  # remote addresses of its TCP connections (a WAN run: namespaces)
            "tokens": (step - self.start_step) * cfg.batch_size * cfg.seq_len,
            "evals": self.evals, "round_log": self.round_rows, "left": self.left, "joined_from": self.joined_from,
        }
        if rank == 0 and not self.left:
            model.eval()
            save_model(model, tok, out / "model")  # loadable with swarmrl.models.load_model
        if cfg.save_final_params:
            torch.save(flat, out / f"worker{rank}.params.pt")
        self.metrics.write(final=True, **{k: v for k, v in summary.items()
                                          if k not in ("evals", "round_log", "final_eval_seq_losses")})
        self.metrics.close()
        (out / f"worker{rank}.summary.json").write_text(json.dumps(summary, indent=2))
        if averager is not None:
            if cfg.backend == "torch":
                averager.barrier()
            averager.close()
        return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one swarmrl DiLoCo worker")
    ap.add_argument("--config", required=True, help="JSON file with a DilocoConfig")
    ap.add_argument("--rank", type=int, default=int(os.environ.get("RANK", 0)))
    ap.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    args = ap.parse_args(argv)
    cfg = DilocoConfig.model_validate_json(Path(args.config).read_text())
    run_worker(cfg, args.rank, args.world)


if __name__ == "__main__":
    adopt_parent_death()  # started by a launcher with child_env: die with it
    main()
