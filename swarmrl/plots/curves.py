"""Learning-curve plots of a run (PNG), from the metrics JSONL files."""

from __future__ import annotations

from pathlib import Path

from swarmrl.rundir import RunLayout, read_trainer_log
from swarmrl.utils.metrics import read_metrics


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib  # noqa: PLC0415  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  # lazy: matplotlib

    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    log = read_trainer_log(layout.trainer_metrics)
    srows = log.steps  # a resumed step keeps its last record
    evals = [(e.wall_s or 0.0, e.version, e.heldout_acc) for e in log.evals]
    workers = {}
    for f in layout.role_metrics_files("worker"):
        workers[f.stem] = read_metrics(f)
    for f in layout.role_metrics_files("node"):  # swarm mode: untrusted nodes
        workers[f.stem[:13]] = read_metrics(f)
    verdicts = [r for r in read_metrics(run_dir / "orchestrator" / "metrics.jsonl") if r.get("event") == "verdict"]
    swarm = (run_dir / "orchestrator").is_dir()

    fig, ax = plt.subplots(3 if swarm else 2, 3, figsize=(15, 12 if swarm else 8))
    a = ax[0, 0]
    if evals:
        a.plot([e[1] for e in evals], [100 * e[2] for e in evals], "o-", color="tab:green")
    a.set(title="held-out accuracy (greedy)", xlabel="policy version (= trainer steps done)", ylabel="%")
    a.grid(alpha=0.3)
    a = ax[0, 1]
    a.plot([r.step for r in srows], [r.task_reward for r in srows], label="task reward")
    a.plot([r.step for r in srows], [r.reward for r in srows], label="reward", alpha=0.6)
    a.set(title="mean reward of trained samples", xlabel="trainer step")
    a.legend()
    a.grid(alpha=0.3)
    a = ax[0, 2]
    if evals:
        a.plot([e[0] / 60 for e in evals], [100 * e[2] for e in evals], "o-", color="tab:green")
    a.set(title="held-out accuracy vs wall time", xlabel="minutes", ylabel="%")
    a.grid(alpha=0.3)
    a = ax[1, 0]
    a.plot([r.step for r in srows], [r.lag_mean for r in srows], label="mean")
    a.plot([r.step for r in srows], [r.lag_max for r in srows], label="max", alpha=0.6)
    a.set(title="off-policy age of trained samples (steps)", xlabel="trainer step")
    a.legend()
    a.grid(alpha=0.3)
    a = ax[1, 1]
    a.plot([r.step for r in srows], [r.clip_frac for r in srows], label="clip fraction")
    a.plot([r.step for r in srows], [r.entropy for r in srows], label="entropy")
    a.plot([r.step for r in srows], [r.grad_norm for r in srows], label="grad norm", alpha=0.6)
    a.set(title="optimisation", xlabel="trainer step")
    a.legend()
    a.grid(alpha=0.3)
    a = ax[1, 2]
    for name, wr in workers.items():
        t0 = wr[0]["time"] if wr else 0
        a.plot([(r["time"] - t0) / 60 for r in wr if "tokens_per_s" in r],
               [r["tokens_per_s"] for r in wr if "tokens_per_s" in r], label=name, alpha=0.7)
    a.set(title="worker generation throughput", xlabel="minutes", ylabel="tokens/s")
    if workers:
        a.legend()
    a.grid(alpha=0.3)
    if swarm:
        _swarm_panels(ax[2], verdicts, read_metrics(run_dir / "validator" / "metrics.jsonl"))
    fig.tight_layout()
    out = Path(out) if out else run_dir / "curves.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _swarm_panels(ax, verdicts: list[dict], validated: list[dict]) -> None:  # noqa: ANN001
    """Swarm mode: verdicts over time, per node, and what validation costs."""
    t0 = min([v["time"] for v in verdicts] + [v["time"] for v in validated], default=0.0)
    a = ax[0]
    for status, color in (("accepted", "tab:green"), ("rejected", "tab:red")):
        ts = [(v["time"] - t0) / 60 for v in verdicts if v.get("status") == status]
        a.step(ts, range(1, len(ts) + 1), where="post", color=color, label=f"{status} ({len(ts)})")
    a.set(title="validated submissions (cumulative)", xlabel="minutes")
    a.legend()
    a.grid(alpha=0.3)
    a = ax[1]
    nodes = sorted({v["node_id"] for v in verdicts})
    acc = [sum(v["status"] == "accepted" and v["node_id"] == n for v in verdicts) for n in nodes]
    rej = [sum(v["status"] == "rejected" and v["node_id"] == n for v in verdicts) for n in nodes]
    slashed = [sum(v.get("slashed", 0.0) for v in verdicts if v["node_id"] == n) for n in nodes]
    xs = range(len(nodes))
    a.bar(xs, acc, color="tab:green", label="accepted")
    a.bar(xs, rej, bottom=acc, color="tab:red", label="rejected")
    a.set_xticks(list(xs), [n[:8] + (f"\nslashed {s:g}" if s else "") for n, s in zip(nodes, slashed)], fontsize=8)
    a.set(title="verdicts per node", ylabel="submissions")
    if nodes:
        a.legend()
    a.grid(alpha=0.3, axis="y")
    a = ax[2]
    rows = [v for v in validated if "seconds" in v and v.get("event", "verdict") == "verdict"]  # not internal errors
    a.plot([(v["time"] - t0) / 60 for v in rows], [v["seconds"] for v in rows], ".", alpha=0.5)
    a.set(title="validator seconds per submission", xlabel="minutes", ylabel="s")
    a.grid(alpha=0.3)
