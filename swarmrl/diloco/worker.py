"""One DiLoCo (or DDP-baseline) worker process.

Run as ``python -m swarmrl.diloco.worker --config CFG.json --rank R --world W`` (the launcher does
this; torchrun-style MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE env vars are honoured too). Writes
``OUT/worker{R}.jsonl`` (metrics) and ``OUT/worker{R}.summary.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from swarmrl.diloco.comm import AverageResult, HivemindAverager, TorchDistributedAverager
from swarmrl.diloco.config import DilocoConfig
from swarmrl.diloco.data import PackedCorpus, answer_mask, eval_loss, masked_eval_loss
from swarmrl.diloco.outer import (
    OuterNesterov,
    apply_delayed,
    flatten,
    params_digest,
    pseudo_gradient,
    unflatten_into,
    warmup_cosine,
)
from swarmrl.models.io import save_model
from swarmrl.models.tiny import init_model
from swarmrl.utils.metrics import MetricsWriter


def peers_file(out: Path) -> Path:
    return out / "hivemind_peers.json"


def _wait_for_peers(path: Path, timeout: float) -> list[str]:
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


def _validated_state(loaded, numel: int) -> tuple[int, int, torch.Tensor, torch.Tensor | None]:
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


def _catch_up(averager, outer: OuterNesterov, want_round: int, timeout: float) -> int | None:
    """Download a peer's outer state once it has reached ``want_round``; returns the new round."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loaded = averager.load_state_from_peers(timeout=timeout)
        if loaded is not None:
            try:
                rnd, steps, anchor, buf = _validated_state(loaded, outer.anchor.numel())
            except ValueError:
                loaded = None  # a bad peer: ask again (hivemind picks peers by priority, then at random)
            else:
                if rnd >= want_round:
                    with averager.lock:
                        outer.load_state(anchor, buf, steps)
                    return rnd
        time.sleep(0.3)
    return None


@dataclass
class _Pending:
    """An outer all-reduce in flight: its result, the parameters it was computed from, when it is due."""

    result: Future[AverageResult]
    sent_from: torch.Tensor
    due_step: int


def run_worker(cfg: DilocoConfig, rank: int, world: int) -> dict:
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(cfg.device)
    model, tok = init_model(cfg.init)  # same seed on every worker: identical start
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    corpus = PackedCorpus(cfg.task.build(), tok, seq_len=cfg.seq_len, seed=cfg.seed)
    eval_batch = corpus.eval_batch(cfg.eval_seqs)
    opt = torch.optim.AdamW(params, lr=cfg.inner_lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_cosine(s, cfg.warmup_steps, cfg.total_steps, cfg.min_lr_ratio))
    outer = OuterNesterov(flatten(params), lr=cfg.outer_lr, momentum=cfg.outer_momentum)
    metrics = MetricsWriter(out / f"worker{rank}.jsonl")
    evaluates = rank == 0 or cfg.backend == "hivemind"

    averager = None
    start_step = 0
    rnd = 0
    joined_from: dict | None = None
    state = {"round": 0}  # what a joining peer downloads (guarded by the averager's lock)
    if world > 1 or cfg.backend == "hivemind":
        if cfg.backend == "torch":
            port = int(os.environ.get("MASTER_PORT", cfg.master_port or 29500))
            averager = TorchDistributedAverager(rank, world, os.environ.get("MASTER_ADDR", cfg.master_addr), port,
                                                backend=cfg.dist_backend, wire=cfg.wire, device=cfg.device,
                                                int8_chunk=cfg.int8_chunk, error_feedback=cfg.error_feedback)
            synced = averager.broadcast(outer.anchor, src=0)
            outer.anchor = synced
            unflatten_into(synced, params)
        else:
            hm = cfg.hivemind
            pfile = peers_file(out)
            if hm.initial_peers:
                initial = list(hm.initial_peers)
            elif rank == 0 and not hm.join:
                initial = []
            else:
                initial = _wait_for_peers(pfile, hm.peers_file_timeout)
            def state_fn() -> tuple[dict, list[torch.Tensor]]:
                buf = outer.buf if outer.buf is not None else torch.zeros(0)
                return {"round": state["round"], "outer_steps": outer.steps}, [outer.anchor, buf]

            averager = HivemindAverager(numel, initial, prefix=hm.prefix, wire=cfg.wire,
                                        target_group_size=world if world > 1 else None,
                                        min_group_size=hm.min_group_size, matchmaking_time=hm.matchmaking_time,
                                        round_timeout=hm.round_timeout, state_fn=state_fn)
            if rank == 0 and not initial:
                tmp = pfile.with_suffix(".tmp")
                tmp.write_text(json.dumps(averager.visible_maddrs()))
                tmp.replace(pfile)
            if hm.join:
                got = None
                for _ in range(10):
                    loaded = averager.load_state_from_peers(timeout=hm.round_timeout)
                    if loaded is not None:
                        try:
                            got = _validated_state(loaded, numel)
                            break
                        except ValueError as e:
                            metrics.write(event="rejected_peer_state", reason=str(e))
                    time.sleep(1.0)
                if got is None:
                    raise RuntimeError("joining worker could not load a valid outer state from any peer")
                with averager.lock:
                    outer.load_state(got[2], got[3], got[1])
                    rnd = got[0]
                    state["round"] = rnd
                unflatten_into(outer.anchor, params)
                start_step = rnd * cfg.inner_steps
                for _ in range(start_step):
                    sched.step()  # resume the schedule where the swarm is
                joined_from = {"round": rnd, "digest": params_digest(outer.anchor)}
                metrics.write(event="joined", round=rnd, step=start_step, digest=joined_from["digest"])

    t0 = time.perf_counter()
    train_s = 0.0
    losses: list[float] = []
    step = start_step
    evals: list[dict] = []
    round_rows: list[dict] = []
    left = False
    if evaluates and start_step == 0:
        ev = eval_loss(model, eval_batch)
        evals.append({"step": 0, "eval_loss": ev})
        metrics.write(step=0, eval_loss=ev)
    sync_time = 0.0
    pending: _Pending | None = None
    executor = ThreadPoolExecutor(1, thread_name_prefix="outer") if cfg.overlap_steps and averager else None

    def average(pg: torch.Tensor, round_no: int) -> AverageResult:
        if averager is None:
            return AverageResult(pg, 1)
        return averager.average(pg, round_no) if cfg.backend == "hivemind" else averager.average(pg)

    def submit_average(pg: torch.Tensor, round_no: int) -> Future[AverageResult]:
        if executor is not None:
            return executor.submit(average, pg, round_no)  # overlapped with the next inner steps
        done: Future[AverageResult] = Future()
        done.set_result(average(pg, round_no))
        return done

    def finish_round(p: _Pending) -> dict:
        """Wait for the averaged pseudo-gradient, take the outer step, move the worker's parameters."""
        nonlocal rnd, sync_time
        ta = time.perf_counter()
        res = p.result.result()
        pg, group = res.tensor, res.group_size
        behind_of = max(res.peer_rounds) if res.peer_rounds and max(res.peer_rounds) > rnd else None
        lock = getattr(averager, "lock", None)
        if lock is not None:
            with lock:
                outer.step(pg)
                rnd += 1
                state["round"] = rnd
        else:
            outer.step(pg)
            rnd += 1
        if behind_of is not None:  # a peer is ahead: catch up from its state
            caught = _catch_up(averager, outer, behind_of + 1, cfg.hivemind.round_timeout)
            if caught is not None:
                with averager.lock:
                    rnd = caught
                    state["round"] = rnd
                metrics.write(event="caught_up", round=rnd, step=step)
        if cfg.overlap_steps:
            unflatten_into(apply_delayed(outer.anchor, p.sent_from, flatten(params)), params)
        else:
            unflatten_into(outer.anchor, params)
        sync_time += time.perf_counter() - ta
        r = {"round": rnd, "group_size": group, "digest": params_digest(outer.anchor),
             "bytes_sent": averager.bytes_sent if averager else 0}
        round_rows.append({"round": rnd, "step": step, **r})
        return r

    while step < cfg.total_steps:
        ts = time.perf_counter()
        x = corpus.train_batch(rank, step, cfg.batch_size).to(device)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.mode == "ddp" and averager is not None:
            ta = time.perf_counter()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            res = averager.average(flatten(grads))
            unflatten_into(res.tensor, grads)
            for p, g in zip(params, grads):
                p.grad = g
            sync_time += time.perf_counter() - ta
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        sched.step()
        step += 1
        lv = float(loss.detach())
        if not math.isfinite(lv):
            raise FloatingPointError(f"worker {rank}: loss became {lv} at step {step}")
        losses.append(lv)
        row: dict = {}
        if cfg.mode == "diloco":
            if pending is not None and (step >= pending.due_step or step == cfg.total_steps):
                row = finish_round(pending)
                pending = None
            if step % cfg.inner_steps == 0 or step == cfg.total_steps:
                ta = time.perf_counter()
                current = flatten(params)
                pg = pseudo_gradient(outer.anchor, current)
                pending = _Pending(submit_average(pg, rnd), current, step + cfg.overlap_steps)
                sync_time += time.perf_counter() - ta
                if cfg.overlap_steps == 0 or step == cfg.total_steps:
                    row = finish_round(pending)
                    pending = None
        train_s += time.perf_counter() - ts
        if step % cfg.eval_interval == 0 or step == cfg.total_steps:
            if evaluates:
                row["eval_loss"] = eval_loss(model, eval_batch)
                evals.append({"step": step, "eval_loss": row["eval_loss"]})
        if row or step % cfg.log_every == 0:
            recent = losses[-cfg.log_every:]
            metrics.write(step=step, loss=sum(recent) / len(recent), lr=sched.get_last_lr()[0],
                          train_s=round(train_s, 3), **row)
        hm_leave = cfg.backend == "hivemind" and cfg.hivemind.leave_after_rounds
        if hm_leave and cfg.mode == "diloco" and rnd >= hm_leave and row.get("round"):
            left = True
            metrics.write(event="left", round=rnd, step=step)
            break
    if pending is not None:  # left early (hivemind leave_after_rounds) with a round in flight
        finish_round(pending)
    if executor is not None:
        executor.shutdown(wait=True)
    final_eval = eval_loss(model, eval_batch)
    sep, eol = (tok.encode(c, add_special_tokens=False) for c in ("=", "\n"))
    final_answer = (masked_eval_loss(model, eval_batch, answer_mask(eval_batch, sep[0], eol[0]))
                    if len(sep) == 1 and len(eol) == 1 else None)
    flat = flatten(params)
    summary = {
        "rank": rank, "world": world, "mode": cfg.mode, "backend": cfg.backend, "wire": cfg.wire,
        "steps": step, "start_step": start_step, "rounds": rnd, "inner_steps": cfg.inner_steps,
        "params": numel, "bytes_sent": averager.bytes_sent if averager else 0,
        "sync_calls": averager.rounds if averager else 0,
        "solo_rounds": getattr(averager, "solo_rounds", 0),
        "final_eval_loss": final_eval, "final_answer_loss": final_answer, "final_train_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "digest": params_digest(flat), "train_s": round(train_s, 2), "sync_s": round(sync_time, 2),
        "wall_s": round(time.perf_counter() - t0, 2), "tokens": (step - start_step) * cfg.batch_size * cfg.seq_len,
        "evals": evals, "round_log": round_rows, "left": left, "joined_from": joined_from,
    }
    if rank == 0 and not left:
        model.eval()
        save_model(model, tok, out / "model")  # loadable with swarmrl.models.load_model
    if cfg.save_final_params:
        torch.save(flat, out / f"worker{rank}.params.pt")
    metrics.write(final=True, **{k: v for k, v in summary.items() if k not in ("evals", "round_log")})
    metrics.close()
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
    main()
