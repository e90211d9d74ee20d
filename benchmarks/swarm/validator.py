"""What the validator's TOPLOC check costs per submission, batched vs one prefill per row.

A 128-row submission (16 tasks x 8 completions, two-digit addition, proofs attached) sampled from a model;
the baseline is how the validator worked before (``verify_rollout`` per row: one prefill and one proof
comparison per row); then the validator's ``toploc`` check (proofs + sampling claim of every row: prefills of
``toploc_batch_size`` rows, every proof compared in one vectorised pass), in the same run. Then the recompute
alone (``swarmrl.toploc.rollout.recompute`` of the 128 rows, 64 rows a batch as the validator's default): one
prefill of each distinct prompt and the completions on its cached keys and values (``shared_prompts=True``, the
default) against one prefill of every row's prompt and completion (``shared_prompts=False``, the code before),
alternating call by call. Ends with one JSON line (seconds, medians).

With ``--config`` (a run config: its model, task, chat template, group size, prompts per step and sampling shape
the submission, as a node of that run makes it), the model checks a full check runs (logprobs, TOPLOC and
sampling), per second of generating the submission (the node's sampling loop, proofs included), alternating: each
check with its own forward (the validator before 2026-11-28: the logprob check packed its rows into a forward of
its own, the TOPLOC check prefilled every row again) against one forward shared by the three (``model_states``).

    python benchmarks/swarm/validator.py [--model runs/warmstart/model] [--reps 5] [--threads 1]
    python benchmarks/swarm/validator.py --config configs/smollm2.toml --reps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from swarmrl.contract import RLContract


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="runs/warmstart/model", help="HF model dir (a fresh tiny model if absent)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--config", default="", help="a run config: the model checks per generation second on its shape")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.config:
        model_checks(a.config, a.reps)
        return

    from swarmrl.envs import make_env
    from swarmrl.generation.batch import BatchOrigin, rollout_batch
    from swarmrl.models import ModelInitConfig, init_model, load_model, load_tokenizer
    from swarmrl.protocol.config import ValidatorConfig
    from swarmrl.protocol.validator import CheckContext, toploc_check
    from swarmrl.rl.config import RLConfig

    model_dir = Path(a.model)
    if not (model_dir / "config.json").is_file():
        model_dir = Path(tempfile.mkdtemp()) / "model"
        init_model(ModelInitConfig(seed=0), model_dir)
    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    rl = RLConfig(model=str(model_dir), contract=RLContract(group_size=a.group, sampling={"max_new_tokens": 6}))
    env = make_env("add", digits=2)
    res = rollout_batch(model, tok, env, env.sample(1, a.tasks), contract=rl.contract, sampling=rl.contract.sampling,
                        origin=BatchOrigin("n", 0, 0, 1),
                        budgets=None, generator=torch.Generator().manual_seed(0), proofs=True)
    rows = res.rows
    print(f"{len(rows)} rows, {sum(len(r.completion_ids) for r in rows)} completion tokens; model {model_dir}; "
          f"{a.threads} thread(s); generating them took {res.seconds:.3f}s")
    from swarmrl.toploc.rollout import claim_from_rollout, verify_rollout
    from swarmrl.toploc.sampling_check import SamplingThresholds

    st = SamplingThresholds(min_token_logprob=-30)

    def per_row() -> None:  # the baseline: what the validator did before, one call (one prefill) per row
        for r in rows:
            res = verify_rollout(model, list(r.prompt_ids), list(r.completion_ids), list(r.proofs),
                                 claim=claim_from_rollout(r, tok.eos_token_id), sampling_thresholds=st)
            assert res.passed, res.reason

    def timed(fn) -> float:  # noqa: ANN001
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    # the check reads the assignment's contract (its proof geometry) only
    item = SimpleNamespace(assignment=SimpleNamespace(contract=rl.contract))
    out = {"per row (baseline)": timed(per_row)}
    for bs in (8, 64, 128):
        cfg = ValidatorConfig(toploc_batch_size=bs, sampling_thresholds={"min_token_logprob": -30})
        check = toploc_check(cfg)

        def batched() -> None:
            ok, reason = check(CheckContext(rows=rows, item=item, cfg=cfg, tokenizer=tok, model_loader=lambda v: model))
            assert ok, reason

        out[f"batched, {bs} rows/prefill"] = timed(batched)
    base = out["per row (baseline)"]
    print(f"\n{'TOPLOC check of one submission':<32} {'s':>8} {'speed-up':>9}")
    for name, t in out.items():
        print(f"{name:<32} {t:>8.4f} {base / t:>8.2f}x")

    from swarmrl.toploc.rollout import recompute

    items = [(list(r.prompt_ids), list(r.completion_ids)) for r in rows]
    rec: dict[str, list[float]] = {"every_row": [], "shared": []}
    for _ in range(a.reps + 1):  # alternating; the first round is a warm-up
        for name, shared in (("every_row", False), ("shared", True)):
            t0 = time.perf_counter()
            recompute(model, items, batch_size=64, shared_prompts=shared)
            rec[name].append(time.perf_counter() - t0)
    r_every, r_shared = (statistics.median(rec[k][1:]) for k in ("every_row", "shared"))
    print(f"\nrecompute of the {len(rows)} rows (64 a batch): one prefill per row {1e3 * r_every:.1f} ms, "
          f"shared prompts {1e3 * r_shared:.1f} ms ({r_every / r_shared:.2f}x)")
    print(json.dumps({"bench": "validator", "rows": len(rows), "model": str(model_dir), "threads": a.threads,
                      "check_s": {k: round(v, 4) for k, v in out.items()},
                      "recompute_every_row_ms": round(1e3 * r_every, 1), "recompute_shared_ms": round(1e3 * r_shared, 1),
                      "recompute_every_row_over_shared": round(r_every / r_shared, 2)}))


def toploc_own_prefill(model, items, batch_size=8, thresholds=None, sampling_thresholds=None, geometry=None):  # noqa: ANN001, ANN201
    """The TOPLOC check as it was: no ``recomputed=`` to take, so it prefills every row itself (the baseline)."""
    from swarmrl.contract import PROOF_GEOMETRY
    from swarmrl.toploc.rollout import verify_rollouts

    return verify_rollouts(model, items, geometry or PROOF_GEOMETRY, thresholds=thresholds,
                           sampling_thresholds=sampling_thresholds, batch_size=batch_size)


def model_checks(config: str, reps: int) -> None:
    """The model checks of one submission shaped by run config ``config``, per generation second: each check
    with its own forward (before) against one forward shared by the three (after), alternating."""
    from swarmrl.config import load_config
    from swarmrl.envs import make_env
    from swarmrl.generation.batch import BatchOrigin, rollout_batch
    from swarmrl.job.config import RunConfig
    from swarmrl.models import load_model, load_tokenizer
    from swarmrl.protocol.config import ValidatorConfig
    from swarmrl.protocol.validator import CheckContext, logprob_check, sampling_check, toploc_check

    rl = load_config(RunConfig, config).rl
    model, tok = load_model(rl.model), load_tokenizer(rl.model)
    env = make_env(rl.contract.task.name, **rl.contract.task.params)
    tasks = env.sample(1, rl.prompts_per_step)
    gen: list[float] = []
    for rep in range(reps + 1):  # the first is a warm-up
        res = rollout_batch(model, tok, env, tasks, contract=rl.contract, sampling=rl.contract.sampling,
                            origin=BatchOrigin("n", 0, 0, 1), budgets=None,
                            generator=torch.Generator().manual_seed(rep), proofs=True)
        gen.append(res.seconds)
    rows = res.rows
    item = SimpleNamespace(assignment=SimpleNamespace(contract=rl.contract),
                           submission=SimpleNamespace(sha256="0" * 64))
    claim = "swarmrl.toploc.rollout:claim_from_rollout"
    shared = ValidatorConfig(sampling_claim=claim)  # the shipped validator's checks (configs/validator.toml)
    separate = shared.model_copy(update={"toploc_check": f"{__name__}:toploc_own_prefill"})
    times: dict[str, list[float]] = {"separate": [], "shared": []}
    for _ in range(reps + 1):
        for name, cfg in (("separate", separate), ("shared", shared)):
            ctx = CheckContext(rows=rows, item=item, cfg=cfg, tokenizer=tok, model_loader=lambda v: model)
            t0 = time.perf_counter()
            for check in (logprob_check(cfg), toploc_check(cfg), sampling_check(cfg)):
                ok, reason = check(ctx)
                assert ok, reason
            times[name].append(time.perf_counter() - t0)
    g = statistics.median(gen[1:])
    sep, sha = (statistics.median(times[k][1:]) for k in ("separate", "shared"))
    print(f"{len(rows)} rows ({rl.prompts_per_step} prompts x {rl.contract.group_size}), "
          f"{sum(len(r.completion_ids) for r in rows) / len(rows):.1f} completion tokens a row; model {rl.model}; "
          f"1 thread; generating them (the node's loop, proofs included): {g:.3f} s")
    print(f"model checks, each its own forward (before): {sep:.3f} s = {sep / g:.3f} s per generation second")
    print(f"model checks, one shared forward (after):    {sha:.3f} s = {sha / g:.3f} s per generation second "
          f"({sep / sha:.2f}x less)")
    print(json.dumps({"bench": "validator_model_checks", "config": config, "rows": len(rows), "generation_s": round(g, 3),
                      "checks_separate_s": round(sep, 3), "checks_shared_s": round(sha, 3),
                      "separate_per_generation_s": round(sep / g, 3), "shared_per_generation_s": round(sha / g, 3),
                      "separate_over_shared": round(sep / sha, 2)}))


if __name__ == "__main__":
    main()
