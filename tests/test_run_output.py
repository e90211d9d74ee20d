"""What `swarmrl run` prints when its output is not a terminal: a plain progress line every N steps and, at the
end, a short summary under 80 columns pointing at RUN_DIR/summary.json (swarmrl.job.report)."""

from __future__ import annotations

from swarmrl.job.report import PlainProgress, heldout_se, progress_line, summary_lines


def _snap(step: int, acc: float | None = None, **kw) -> dict:
    return {"elapsed_s": 3.0 * step, "step": step, "reward": 0.25, "lag": 0.5, "heldout_acc": acc, "first_acc": acc,
            "tokens_per_s": 900.0, "wait_frac": 0.1, **kw}


def test_progress_lines_every_tenth_of_the_run_and_on_new_accuracy():
    out: list[str] = []
    p = PlainProgress(300, swarm=True, emit=out.append)
    assert p.every == 10
    for step in [0, 0, 1, 1, 5, 9, 10, 10, 12, 19, 20, 35, 299, 300, 300]:
        p(_snap(step, accepted=step, rejected=1))
    assert [ln.split()[1] for ln in out] == ["1/300", "10/300", "20/300", "35/300", "299/300", "300/300"]
    p(_snap(300, acc=0.42, accepted=300, rejected=1))  # a new held-out accuracy is news
    assert out[-1] == "step 300/300  reward 0.250  held-out acc 42.0%  accepted 300 rejected 1  900s"
    assert all(len(ln) < 80 for ln in out)
    assert PlainProgress(20, swarm=False, emit=out.append).every == 2


def test_a_quiet_run_still_prints():
    out: list[str] = []
    p = PlainProgress(100, swarm=False, emit=out.append, quiet_s=0.0)
    p(_snap(0))  # the clock starts at the first snapshot (not during a warm start)
    assert out == []
    p(_snap(0))
    assert out == ["step   0/100  reward 0.250  lag 0.50  0s"]
    assert progress_line(_snap(4, acc=0.3, accepted=7, rejected=2, slashed_nodes=1), 100, True) == (
        "step   4/100  reward 0.250  held-out acc 30.0%  accepted 7 rejected 2  slashed 1  12s")


def test_summary_fits_80_columns_and_names_the_json():
    s = {"run_dir": "runs/rl", "final_model": "runs/rl/final_model", "curves": "runs/rl/curves.png", "steps": 300,
         "wall_s": 281.4, "heldout_acc_initial": 0.287, "heldout_acc_final": 0.5512, "heldout_n": 512,
         "async_level": 2, "workers": 2, "trainer_wait_frac": 0.12, "mean_lag": 0.81, "curve": [],
         "swarm": {"orchestrator": "http://127.0.0.1:1", "totals": {"accepted": 1012, "rejected": 3, "slashed_nodes": 1},
                   "nodes": {"n0": {"adversary": None, "accepted": 500, "rejected": 0, "slashed": 0.0},
                             "x0-forge_rewards": {"adversary": "forge_rewards", "caught": True, "accepted": 0,
                                                  "rejected": 3, "slashed": 30.0, "status": "ejected"}}}}
    lines = summary_lines(s)
    assert all(len(ln) <= 78 for ln in lines), lines
    text = "\n".join(lines)
    assert "held-out acc    28.7% -> 55.1% on 512 tasks" in text
    assert "1012 accepted, 3 rejected, 1 node slashed" in text
    assert "x0-forge_rewards: caught (3 rejected, slashed 30, ejected)" in text
    assert lines[-1] == "full summary    runs/rl/summary.json"
    # with the standard errors a run's summary.json holds (binomial, from the score and the item count)
    s.update(heldout_se_initial=heldout_se(0.287, 512), heldout_se_final=heldout_se(0.5512, 512))
    assert "held-out acc    28.7% ± 2.0 -> 55.1% ± 2.2 on 512 tasks" in "\n".join(summary_lines(s))
    assert heldout_se(0.0, 256) == 0.0 and heldout_se(0.5, 100) == 0.05
