"""Learning-curve plots of a run (PNG), from the metrics JSONL files."""

from __future__ import annotations

from pathlib import Path

from swarmrl.utils.metrics import read_metrics


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics" / "trainer.jsonl")
    steps = {}
    for r in rows:  # a resumed step keeps its last row
        if "step" in r and "reward" in r:
            steps[r["step"]] = r
    srows = [steps[k] for k in sorted(steps)]
    evals = [(r.get("wall_s", 0.0), r["version"], r["heldout_acc"])
             for r in rows if "heldout_acc" in r]
    workers = {}
    for f in sorted((run_dir / "metrics").glob("worker-*.jsonl")):
        workers[f.stem] = read_metrics(f)

    fig, ax = plt.subplots(2, 3, figsize=(15, 8))
    a = ax[0, 0]
    if evals:
        a.plot([e[1] for e in evals], [100 * e[2] for e in evals], "o-", color="tab:green")
    a.set(title="held-out accuracy (greedy)", xlabel="policy version (= trainer steps done)", ylabel="%")
    a.grid(alpha=0.3)
    a = ax[0, 1]
    a.plot([r["step"] for r in srows], [r["task_reward"] for r in srows], label="task reward")
    a.plot([r["step"] for r in srows], [r["reward"] for r in srows], label="reward", alpha=0.6)
    a.set(title="mean reward of trained samples", xlabel="trainer step")
    a.legend()
    a.grid(alpha=0.3)
    a = ax[0, 2]
    if evals:
        a.plot([e[0] / 60 for e in evals], [100 * e[2] for e in evals], "o-", color="tab:green")
    a.set(title="held-out accuracy vs wall time", xlabel="minutes", ylabel="%")
    a.grid(alpha=0.3)
    a = ax[1, 0]
    a.plot([r["step"] for r in srows], [r["lag_mean"] for r in srows], label="mean")
    a.plot([r["step"] for r in srows], [r["lag_max"] for r in srows], label="max", alpha=0.6)
    a.set(title="off-policy age of trained samples (steps)", xlabel="trainer step")
    a.legend()
    a.grid(alpha=0.3)
    a = ax[1, 1]
    a.plot([r["step"] for r in srows], [r["clip_frac"] for r in srows], label="clip fraction")
    a.plot([r["step"] for r in srows], [r["entropy"] for r in srows], label="entropy")
    a.plot([r["step"] for r in srows], [r["grad_norm"] for r in srows], label="grad norm", alpha=0.6)
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
    fig.tight_layout()
    out = Path(out) if out else run_dir / "curves.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
