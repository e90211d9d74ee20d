"""Swarm mode vs local mode of the async GRPO loop, same model, task and settings.

The local run (trainer + N file-based workers) is the baseline measured in the same invocation; the
swarm run adds the orchestrator, signed uploads, the validator (schema/seed/tasks/policy/rewards,
logprob spot check, TOPLOC proofs) and the adapter, with N honest nodes. Both run the same number of steps.

Passes, all in one invocation (ratios are only compared within one):

1. ``local``: N local workers, ``--steps`` steps (the baseline);
2. ``swarm``: N honest nodes, ``--steps`` steps: wall time, trainer idle fraction, held-out accuracy;
3. ``swarm+adv`` (unless ``--no-adversaries``): N honest nodes plus one node per ``--adversary`` (default:
   forge_rewards, edit_tokens, random_model, replay, late_edit_tokens), ``--adversary-steps`` steps: were they
   caught (rejected and slashed, at once or later by a challenge of an accepted submission), was any honest node
   slashed. ``late_edit_tokens`` is honest for its first 3 uploads (past the validator's always-full first 2),
   then edits tokens: under sampled validation only the secret draw or an audit can catch it.
   A separate pass, so that the timing of pass 2 is not the 4 extra processes competing for the same cores.

"Same held-out accuracy" here means: the same number of steps, and the final held-out accuracies (``--eval-n``
tasks each) differ by less than two standard errors of their difference (binomial, ``sqrt(p1 q1/n + p2 q2/n)``;
~0.06 at n = 512 and p ~ 0.4). ``same_heldout`` in the JSON line says whether that held. The wall time of a run
is the launcher's: from the first role started until the trainer's last step is committed (startup included,
final evaluation not).

The last line of stdout is ONE JSON object: ``swarm_over_local_wall``, ``heldout_local``, ``heldout_swarm``,
``trainer_idle_frac`` (the swarm run's share of trainer time spent waiting for rollouts), ``adversaries_caught``,
``honest_slashed`` (honest nodes slashed in either swarm pass), plus context (``adversaries``, ``same_heldout``,
``heldout_2se``, ``trainer_idle_frac_local``, ``steps``).

With ``--zygote-baseline`` the local and the swarm pass each run twice, first with ``zygote=false`` (every role
spawned plainly, each importing torch and transformers itself: the baseline) and then as configured, and the JSON
line gains ``zygote``: both wall times per mode and their ratio (zygote / plain).

    python benchmarks/swarm/bench.py --config configs/run.toml --model runs/warmstart/model --steps 100
    python benchmarks/swarm/bench.py --model /tmp/sft5/model --steps 15 --no-adversaries
    python benchmarks/swarm/bench.py --config configs/run.toml --model runs/warmstart/model --steps 100 \
        --no-adversaries --zygote-baseline
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

from swarmrl.config import load_config
from swarmrl.job import RunConfig
from swarmrl.job.launch import launch

DEFAULT_ADVERSARIES = ["forge_rewards", "edit_tokens", "random_model", "replay", "late_edit_tokens"]


def one(name: str, mode: str, model: Path, out: Path, a: argparse.Namespace, steps: int,
        adversaries: list[str], extra: tuple[str, ...] = ()) -> dict:
    sets = [f'mode="{mode}"', f'rl.model="{model}"', f'rl.run_dir="{out / name}"', f"rl.steps={steps}",
            f"rl.workers.num={a.workers}", f"swarm.nodes={a.workers}", f"swarm.adversaries={json.dumps(adversaries)}",
            "warmstart.enabled=false", f"final_eval_n={a.eval_n}", f"rl.eval.n={a.eval_n}", *a.set, *extra]
    cfg = load_config(RunConfig, a.config, sets)
    print(f"--- {name} run", file=sys.stderr)
    s = launch(cfg, progress=lambda m: print(m, file=sys.stderr))
    row = {"run": name, "mode": mode, "steps": s["steps"], "wall_s": s["wall_s"], "acc_initial": s["heldout_acc_initial"],
           "acc_final": s["heldout_acc_final"], "heldout_n": s["heldout_n"], "trainer_wait_frac": s["trainer_wait_frac"],
           "mean_lag": s["mean_lag"]}
    if mode == "swarm":
        row.update(s["swarm"]["totals"])
        row["nodes"] = {k: {x: v.get(x) for x in ("adversary", "status", "accepted", "rejected", "refused_uploads",
                                                   "slashed", "caught", "reject_reasons")}
                        for k, v in s["swarm"]["nodes"].items()}
    return row


def honest_slashed(row: dict) -> int:
    return sum(1 for v in row.get("nodes", {}).values()
               if not v["adversary"] and (v["rejected"] or (v["slashed"] or 0) > 0 or v["status"] == "ejected"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/tmp/sft5/model", help="warm-started model (copied, not modified)")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--workers", type=int, default=2, help="local workers = honest swarm nodes")
    ap.add_argument("--eval-n", type=int, default=512)
    ap.add_argument("--adversary", action="append", default=[],
                    help=f"adversary kinds of pass 3 (default: {', '.join(DEFAULT_ADVERSARIES)})")
    ap.add_argument("--adversary-steps", type=int, default=30, help="steps of the adversary pass")
    ap.add_argument("--no-adversaries", action="store_true", help="skip the adversary pass")
    ap.add_argument("--out", default="runs/bench_swarm")
    ap.add_argument("--set", action="append", default=[], help="extra RunConfig overrides (every pass)")
    ap.add_argument("--config", default=None, help="base RunConfig TOML (e.g. configs/run.toml; default: built-in)")
    ap.add_argument("--zygote-baseline", action="store_true",
                    help="run the local and swarm passes with zygote=false first too (start-up baseline)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = out / "model"
    if model.exists():
        shutil.rmtree(model)
    shutil.copytree(a.model, model)
    advs = a.adversary or DEFAULT_ADVERSARIES
    plain: dict[str, dict] = {}
    if a.zygote_baseline:
        plain["local"] = one("local_plain", "local", model, out, a, a.steps, [], ("zygote=false",))
    res = [one("local", "local", model, out, a, a.steps, [])]
    if a.zygote_baseline:
        plain["swarm"] = one("swarm_plain", "swarm", model, out, a, a.steps, [], ("zygote=false",))
    res.append(one("swarm", "swarm", model, out, a, a.steps, []))
    if not a.no_adversaries:
        res.append(one("swarm_adv", "swarm", model, out, a, a.adversary_steps, advs))
    (out / "results.json").write_text(json.dumps(res + list(plain.values()), indent=2))
    print(f"\n{'run':>9} {'steps':>5} {'wall s':>7} {'acc before':>10} {'acc after':>9} {'wait':>6} {'lag':>5} "
          f"{'accepted':>8} {'rejected':>8} {'slashed':>7}")
    for r in res:
        print(f"{r['run']:>9} {r['steps']:>5} {r['wall_s']:>7.1f} {r['acc_initial']:>10.3f} {r['acc_final']:>9.3f} "
              f"{100 * r['trainer_wait_frac']:>5.0f}% {r['mean_lag']:>5.2f} {r.get('accepted', '-'):>8} "
              f"{r.get('rejected', '-'):>8} {r.get('slashed_nodes', '-'):>7}")
    loc, sw = res[0], res[1]
    adv_nodes = {k: v for r in res[2:] for k, v in r["nodes"].items() if v["adversary"]}
    for k, v in adv_nodes.items():
        print(f"  {k}: caught={v['caught']} accepted={v['accepted']} rejected={v['rejected']} "
              f"{'; '.join(v['reject_reasons'] or [])[:160]}")
    ratio = sw["wall_s"] / max(1e-9, loc["wall_s"])
    print(f"\nswarm/local wall time for {a.steps} steps: {ratio:.2f}x; "
          f"per step {sw['wall_s'] / max(1, sw['steps']):.2f}s vs {loc['wall_s'] / max(1, loc['steps']):.2f}s")
    p1, p2, n1, n2 = loc["acc_final"], sw["acc_final"], loc["heldout_n"], sw["heldout_n"]
    se2 = 2 * math.sqrt(p1 * (1 - p1) / max(1, n1) + p2 * (1 - p2) / max(1, n2))
    line = {"swarm_over_local_wall": round(ratio, 3), "heldout_local": p1, "heldout_swarm": p2,
            "trainer_idle_frac": sw["trainer_wait_frac"],
            "adversaries_caught": sum(bool(v["caught"]) for v in adv_nodes.values()),
            "honest_slashed": sum(honest_slashed(r) for r in res[1:]),
            "adversaries": len(adv_nodes), "same_heldout": abs(p1 - p2) < se2, "heldout_2se": round(se2, 4),
            "trainer_idle_frac_local": loc["trainer_wait_frac"], "steps": a.steps,
            "wall_s": {r["run"]: r["wall_s"] for r in res}}
    if plain:
        line["zygote"] = {m: {"plain_s": plain[m]["wall_s"], "zygote_s": r["wall_s"],
                              "zygote_over_plain": round(r["wall_s"] / max(1e-9, plain[m]["wall_s"]), 3)}
                          for m, r in (("local", loc), ("swarm", sw))}
    print(json.dumps(line))


if __name__ == "__main__":
    main()
