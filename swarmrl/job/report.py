"""What a run shows while it runs (``snapshot``) and leaves behind (``finish``: final model, curves, held-out
evaluation, ``summary.json``; in swarm mode the per-node report from the orchestrator's ledger)."""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from swarmrl.job.commands import eval_settings
from swarmrl.job.config import RunConfig
from swarmrl.models.adapter_file import ADAPTER_FILE, MODEL_FILE
from swarmrl.rundir import RunLayout, read_trainer_log
from swarmrl.rundir.layout import MASTER_DIR, STATE_DIR
from swarmrl.rundir.writer import RunDir
from swarmrl.utils.metrics import read_metrics


def _recent_tps(files: list[Path]) -> float | None:
    tps = []
    for f in files:
        w = [r for r in read_metrics(f) if "tokens_per_s" in r]
        if w:
            tps.append(sum(r["tokens_per_s"] for r in w[-5:]) / len(w[-5:]))
    return sum(tps) if tps else None


def snapshot(root: Path, t0: float, swarm: bool = False) -> dict:
    layout = RunLayout(root)
    log = read_trainer_log(layout.trainer_metrics)
    steps, evals = log.steps, log.evals
    last = steps[-1] if steps else None
    s = {"elapsed_s": time.monotonic() - t0, "step": last.step + 1 if last else 0,
         "reward": last.task_reward if last else None, "lag": last.lag_mean if last else None,
         "heldout_acc": evals[-1].heldout_acc if evals else None,
         "first_acc": evals[0].heldout_acc if evals else None,
         "tokens_per_s": _recent_tps(layout.role_metrics_files("node" if swarm else "worker")),
         "wait_frac": (sum(r.wait_s or 0.0 for r in steps) / max(1e-9, last.wall_s or 0.0)) if last else None}
    if swarm:
        s.update(orchestrator_counts(root))
    return s


def orchestrator_counts(root: Path) -> dict:
    rows = [r for r in read_metrics(root / "orchestrator" / "metrics.jsonl") if r.get("event") == "snapshot"]
    last = rows[-1] if rows else {}
    return {"accepted": last.get("submissions_accepted", 0), "rejected": last.get("submissions_rejected", 0),
            "pending": last.get("submissions_pending", 0), "slashed_nodes": last.get("nodes_ejected", 0),
            "active_nodes": last.get("nodes_active", 0), "refused_requests": last.get("refused", 0)}


# An idle_connections attack is judged as an attacker is: it held (failed) if the honest nodes' calls kept their
# latency while it ran. For heartbeats (those that do not wait) and uploads apart, with at least HELD_MIN_CALLS
# of each kind both during its rounds and outside them (before the first and between rounds): the median during
# is at most HELD_FACTOR x the median outside + HELD_SLACK_S, and no honest call went unserved (no answer, 429,
# 5xx) during a round. A kind with too few calls is not judged; with no kind judged, neither is the attack.
HELD_FACTOR = 2.0
HELD_SLACK_S = 0.05
HELD_MIN_CALLS = 5


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.9 * len(xs)))]


def honest_latency(calls: list[dict], windows: list[tuple[float, float]]) -> dict[str, dict]:
    """The honest nodes' timed calls (``{"call", "s", "ok", "time"}`` rows, ``time`` their start) by kind, split
    into those that overlapped an attack window and those entirely outside every window; per side: count,
    median and p90 seconds, unserved calls; and per kind whether it held (None: too few calls to judge)."""
    out: dict[str, dict] = {}
    for kind in ("heartbeat", "upload"):
        sides: dict[str, list[dict]] = {"quiet": [], "during": []}
        for c in calls:
            if c.get("call") != kind:
                continue
            t0, t1 = c["time"], c["time"] + c["s"]
            sides["during" if any(t0 < end and t1 > start for start, end in windows) else "quiet"].append(c)
        row: dict = {}
        for side, cs in sides.items():
            served = [c["s"] for c in cs if c.get("ok", True)]
            row[f"{side}_n"] = len(cs)
            row[f"{side}_unserved"] = len(cs) - len(served)
            row[f"{side}_p50_s"] = round(_median(served), 4) if served else None
            row[f"{side}_p90_s"] = round(_p90(served), 4) if served else None
        judged = row["quiet_n"] >= HELD_MIN_CALLS and row["during_n"] >= HELD_MIN_CALLS
        row["held"] = None if not judged else (
            row["during_unserved"] == 0 and row["during_p50_s"] is not None and row["quiet_p50_s"] is not None
            and row["during_p50_s"] <= HELD_FACTOR * row["quiet_p50_s"] + HELD_SLACK_S)
        out[kind] = row
    return out


def _idle_held(info: dict, root: Path, nid: str, honest: list[str]) -> bool:
    """Did the honest nodes' heartbeats and uploads keep their latency through this node's idle-connection
    rounds (and did the rounds hold connections at all)? Fills in the figures it is judged by."""
    layout = RunLayout(root)
    rounds = [r for r in read_metrics(layout.role_metrics("idle", nid)) if r.get("event") == "idle_round"]
    windows = [(r["start"], r["end"]) for r in rounds if "start" in r]
    calls = [r for h in honest for r in read_metrics(layout.role_metrics("node", h)) if r.get("event") == "call"]
    lat = honest_latency(calls, windows)
    info.update(idle_rounds=len(rounds), idle_addresses=max((r.get("addresses", 1) for r in rounds), default=0),
                idle_attempted=sum(r.get("attempted", 0) for r in rounds),
                idle_peak_open=max((r.get("peak_open", 0) for r in rounds), default=0),
                idle_closed_by_server=sum(r.get("closed_by_server", 0) for r in rounds),
                idle_refused_503=sum(r.get("refused_503", 0) for r in rounds), honest_latency=lat)
    judged = [v["held"] for v in lat.values() if v["held"] is not None]
    info["held"] = bool(judged) and all(judged) and info["idle_peak_open"] > 0
    return info["held"]


def _caught(info: dict, root: Path, nid: str, honest: list[str]) -> bool:
    """Was this adversary stopped: rejected (slashed, ejected) or refused at upload; a flood node: none of its
    sybils got in; an idle-connections node: its attack held, i.e. failed (``_idle_held``)."""
    if info["adversary"] == "idle_connections":
        return _idle_held(info, root, nid, honest)
    if info["rejected"] or info.get("status") == "ejected" or (info["refused_uploads"] and not info["accepted"]):
        return True
    if info["adversary"] == "flood":
        bursts = [r for r in read_metrics(RunLayout(root).role_metrics("flood", nid)) if r.get("event") == "flood"]
        info["sybils_attempted"] = sum(r.get("attempted", 0) for r in bursts)
        info["sybils_registered"] = sum(r.get("registered", 0) for r in bursts)
        return info["sybils_attempted"] > 0 and info["sybils_registered"] == 0
    return False


def swarm_report(root: Path, url: str, members: dict[str, dict]) -> dict:
    """Per node: adversary kind, status and stake from the ledger, submissions by verdict, reasons, refusals,
    and for an adversary whether it was caught (an idle-connections node: whether the honest nodes held)."""
    verdicts = [r for r in read_metrics(root / "orchestrator" / "metrics.jsonl") if r.get("event") == "verdict"]
    honest = [m["node_id"] for m in members.values() if not m["adversary"]]
    out: dict[str, dict] = {}
    for name, m in members.items():
        nid = m["node_id"]
        mine = [v for v in verdicts if v.get("node_id") == nid]
        node_rows = read_metrics(RunLayout(root).role_metrics("node", nid))
        refused = [r for r in node_rows if r.get("submitted") is False]
        info = {"node_id": nid, "adversary": m["adversary"] or None,
                "accepted": sum(v["status"] == "accepted" for v in mine),
                "rejected": sum(v["status"] == "rejected" for v in mine),
                "reject_reasons": sorted({v["reason"][:200] for v in mine if v["status"] == "rejected"}),
                "refused_uploads": len(refused),
                "refusals": sorted({f"{r.get('refused_status')}: {r.get('refused', '')[:120]}" for r in refused})[:3],
                "slashed": sum(v.get("slashed", 0.0) for v in mine)}
        try:
            b = httpx.get(f"{url}/v1/nodes/{nid}/ledger", timeout=5.0)
            if b.status_code == 200:
                j = b.json()
                info.update(status=j["status"], stake=j["stake"], credits_locked=j["credits_locked"])
            else:
                info.update(status="unregistered")
        except httpx.HTTPError:
            info.update(status="unknown")
        if m["adversary"]:
            info["caught"] = _caught(info, root, nid, honest)
        out[name] = info
    return {"orchestrator": url, "totals": orchestrator_counts(root), "nodes": out}


def finish(cfg: RunConfig, root: Path, wall_s: float, extra: dict | None = None) -> dict:
    """Copy the final model out, draw the curves, evaluate initial and final model held-out, write the summary."""
    from swarmrl.eval.heldout import EvalConfig, evaluate_path  # noqa: PLC0415  # lazy: torch
    from swarmrl.plots.curves import plot_run  # noqa: PLC0415  # lazy: matplotlib

    run = RunDir(root)
    final_dir = root / "final_model"
    if final_dir.exists():
        shutil.rmtree(final_dir)
    latest = run.version_dir(run.latest_version())
    if (latest / ADAPTER_FILE).is_file():  # a LoRA run: the final model is its base with the adapter merged
        from swarmrl.models.lora import export_merged  # noqa: PLC0415  # lazy: torch

        export_merged(cfg.rl.model, latest, final_dir)
    else:
        master = latest / MASTER_DIR / MODEL_FILE  # the trainer's own float32 weights, when the version is a cast
        skip = [STATE_DIR, MASTER_DIR] + ([MODEL_FILE] if master.is_file() else [])
        shutil.copytree(latest, final_dir, ignore=shutil.ignore_patterns(*skip))
        if master.is_file():
            shutil.copy2(master, final_dir / MODEL_FILE)
    png = plot_run(root)
    log = read_trainer_log(run.trainer_metrics)
    steps = log.steps
    ev = EvalConfig.model_validate({**eval_settings(cfg), "model": str(final_dir)})  # as `swarmrl eval -c` runs it
    final = evaluate_path(ev)
    init = evaluate_path(ev.model_copy(update={"model": cfg.rl.model}))
    last_wall = max((r.wall_s or 0.0 for r in steps), default=1e-9)
    summary = {
        "run_dir": str(root), "final_model": str(final_dir), "curves": str(png), "steps": len(steps),
        "wall_s": round(wall_s, 1), "heldout_acc_initial": init["accuracy"], "heldout_acc_final": final["accuracy"],
        "heldout_n": final["n"], "heldout_se_initial": heldout_se(init["accuracy"], init["n"]),
        "heldout_se_final": heldout_se(final["accuracy"], final["n"]), "async_level": cfg.rl.contract.async_level, "workers": cfg.rl.workers.num,
        "trainer_wait_frac": round(sum(r.wait_s or 0.0 for r in steps) / max(1e-9, last_wall), 3),
        "mean_lag": round(sum(r.lag_mean or 0.0 for r in steps) / max(1, len(steps)), 3),
        "curve": [{"version": e.version, "wall_s": e.wall_s, "heldout_acc": e.heldout_acc} for e in log.evals],
        **(extra or {}),
    }
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


# --- what `swarmrl run` prints when its output is not a terminal (piped, nohup, a log file) ---------------------


_SHORT = {"heartbeat": "beat"}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1000 * v:.0f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def progress_line(s: dict, total_steps: int, swarm: bool) -> str:
    """One plain line (under 80 columns) from a ``snapshot``: step, held-out acc if known, reward, accepted /
    rejected (swarm mode), elapsed."""
    parts = [f"step {s['step']:>{len(str(total_steps))}}/{total_steps}",
             f"reward {'-' if s.get('reward') is None else format(s['reward'], '.3f')}"]
    if s.get("heldout_acc") is not None:
        parts.append(f"held-out acc {_pct(s['heldout_acc'])}")
    if swarm:
        parts.append(f"accepted {s.get('accepted', 0)} rejected {s.get('rejected', 0)}")
        if s.get("slashed_nodes"):
            parts.append(f"slashed {s['slashed_nodes']}")
    elif s.get("lag") is not None:
        parts.append(f"lag {s['lag']:.2f}")
    parts.append(f"{s['elapsed_s']:.0f}s")
    return "  ".join(parts)


class PlainProgress:
    """Feeds ``progress_line``s to ``emit``: the first step, then every ``every`` steps (default: 10 steps or
    a tenth of the run, whichever is fewer), the last step, a new held-out accuracy, and a line after ``quiet_s``
    without one (a warm-up or a slow step still shows the run is alive)."""

    def __init__(self, total_steps: int, swarm: bool, emit: Callable[[str], None], every: int | None = None,
                 quiet_s: float = 60.0) -> None:
        self.total, self.swarm, self.emit = total_steps, swarm, emit
        self.every = every or max(1, min(10, -(-total_steps // 10)))
        self.quiet_s = quiet_s
        self.last_step: int | None = None
        self.last_acc: float | None = None
        self.last_t: float | None = None  # from the first snapshot on (a warm start before it prints its own lines)

    def __call__(self, s: dict) -> None:
        step, now = s["step"], time.monotonic()
        quiet = self.last_t is not None and now - self.last_t >= self.quiet_s
        if self.last_t is None:
            self.last_t = now
        due = (self.last_step is None and step > 0) or (self.last_step is not None and (
            step // self.every > self.last_step // self.every or (step >= self.total > self.last_step)))
        due = due or (s.get("heldout_acc") is not None and s["heldout_acc"] != self.last_acc)
        if due or quiet:
            self.emit(progress_line(s, self.total, self.swarm))
            self.last_step, self.last_acc, self.last_t = step, s.get("heldout_acc"), now


def heldout_se(acc: float, n: int) -> float:
    """The standard error of a held-out mean score over ``n`` items: sqrt(p (1 - p) / n), the binomial one (for
    scores with partial credit, in [0, 1], an upper bound)."""
    return round(math.sqrt(max(0.0, acc * (1 - acc)) / max(1, n)), 4)


def summary_lines(summary: dict) -> list[str]:
    """The end of a run for a human, in under 80 columns (paths aside): steps and time, held-out accuracy,
    the swarm's verdicts and each adversary's fate, where the model, the curves and the full ``summary.json``
    are."""
    w = 16
    se0, se1 = summary.get("heldout_se_initial"), summary.get("heldout_se_final")
    pm0 = f" ± {100 * se0:.1f}" if se0 is not None else ""
    pm1 = f" ± {100 * se1:.1f}" if se1 is not None else ""
    acc = f"{_pct(summary['heldout_acc_initial'])}{pm0} -> {_pct(summary['heldout_acc_final'])}{pm1}"
    lines = [f"{'steps':<{w}}{summary['steps']} in {summary['wall_s']:.0f}s (async_level {summary['async_level']})",
             f"{'held-out acc':<{w}}{acc} on {summary['heldout_n']} tasks",
             f"{'trainer':<{w}}waited {100 * summary['trainer_wait_frac']:.0f}% of the time, mean policy lag "
             f"{summary['mean_lag']:.2f}"]
    sw = summary.get("swarm")
    if sw:
        t = sw["totals"]
        slashed = t.get("slashed_nodes", 0)
        lines.append(f"{'submissions':<{w}}{t.get('accepted', 0)} accepted, {t.get('rejected', 0)} rejected, "
                     f"{slashed} node{'' if slashed == 1 else 's'} slashed")
        for name, n in sw["nodes"].items():
            if n.get("adversary") == "idle_connections":  # judged by the honest nodes' latency (_idle_held)
                lat = n.get("honest_latency") or {}
                ms = ", ".join(f"{_SHORT.get(k, k)} {_ms(v.get('quiet_p50_s'))}->{_ms(v.get('during_p50_s'))}"
                               for k, v in lat.items() if v.get("held") is not None)
                lines.append(f"{'adversary':<{w}}{name}: {'held' if n.get('held') else 'NOT held'}")
                lines.append(f"{'':<{w}}{'honest p50 ms ' + ms + ' (outside->during)' if ms else 'not judged'}")
            elif n.get("adversary"):
                fate = "caught" if n.get("caught") else "NOT caught"
                lines.append(f"{'adversary':<{w}}{name}: {fate} ({n['rejected']} rejected, slashed "
                             f"{n['slashed']:g}, {n.get('status', '?')})")
    root = Path(summary["run_dir"])
    lines += [f"{'final model':<{w}}{summary['final_model']}", f"{'curves':<{w}}{summary['curves']}",
              f"{'full summary':<{w}}{root / 'summary.json'}"]
    return lines
