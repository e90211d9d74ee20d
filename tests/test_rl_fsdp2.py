"""trainer.parallel = "fsdp2": 2 ranks (gloo on 127.0.0.1) train like 1 rank.

The real trainer runs 3 steps on fixed rollout files, three ways: 1 process (no wrapping); 2 ranks with FSDP2
for 2 steps, then a fresh FSDP2 trainer resumes from the committed version 2 (its gathered optimizer state,
re-sharded) and does the third; 2 ranks with the DDP-style all-reduce for 2 steps, then resumed under FSDP2
(checkpoints are the same format either way); 1 process for 2 steps (its one-file ``state.pt``), then resumed
by 2 FSDP2 ranks (each keeps its shard of the whole state). The whole-batch loss and the gradient norm (which sees any
mistake in the loss scaling: Adam and clipping would hide it in the weights) of every step, and the committed
version 3 (weights, optimizer state, files) must agree.
"""

import json
import os
import random
import time

import pytest
import torch
import torch.multiprocessing as mp
from memory_support import live_tensor_bytes
from safetensors.torch import load_file

from swarmrl.contract import RLContract, Rollout
from swarmrl.envs.config import TaskConfig
from swarmrl.rl.config import EvalSection, OptimConfig, RLConfig, TrainerSection
from swarmrl.rl.trainer import Trainer
from swarmrl.rollouts.wire import write_rollouts
from swarmrl.rundir.layout import MASTER_DIR
from swarmrl.rundir.writer import RunDir
from swarmrl.training.checkpoint import read_saved_state
from swarmrl.utils.metrics import read_metrics
from swarmrl.utils.procs import free_port

STEPS = 3


def _cfg(run_dir, model_dir, parallel="ddp", steps=STEPS) -> RLConfig:
    # 3 groups of 3 = 9 sequences, micro-batches of 2: rank 0 makes 3 passes, rank 1 makes 2 (+ 1 empty pass)
    return RLConfig(run_dir=str(run_dir), model=str(model_dir), contract=RLContract(task=TaskConfig(name="add", params={"digits": 1}), async_level=0, group_size=3, filter_ties=False),
                    steps=steps, prompts_per_step=3,
                    eval=EvalSection(every_steps=0, n=2, max_new_tokens=1),
                    optim=OptimConfig(lr=1e-3, warmup_steps=0, micro_batch=2),
                    trainer=TrainerSection(parallel=parallel))


def _write_rollouts(run_dir) -> None:
    """The same 9 rows for every step (valid rollouts of the policy that step trains)."""
    run = RunDir(run_dir)
    for step in range(STEPS):
        rng = random.Random(0)
        rows = []
        for g in range(3):
            for i in range(3):
                comp = [rng.randrange(4, 200) for _ in range(rng.randint(1, 5))]
                reward = float(i + g) / 4
                rows.append(Rollout("w0", step, step, f"t{g}", "add", f"g{g}", [rng.randrange(4, 200) for _ in range(4)],
                                    comp, [-rng.random() * 3 for _ in comp], reward, reward, 0.0, None, 1.0,
                                    True, 0))
        write_rollouts(rows, run.new_rollout_path(step, "w0", 3))


def _rank_main(rank, world, port, model_dir, tmp):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    try:
        t = Trainer(_cfg(f"{tmp}/fsdp2", model_dir, "fsdp2", steps=STEPS - 1))
        full, local = t.model.lm_head.weight.shape[0], t.model.lm_head.weight.to_local().shape[0]
        t.run_loop()
        Trainer(_cfg(f"{tmp}/fsdp2", model_dir, "fsdp2")).run_loop()  # resumes from version 2
        Trainer(_cfg(f"{tmp}/ddp", model_dir, "ddp", steps=STEPS - 1)).run_loop()
        Trainer(_cfg(f"{tmp}/ddp", model_dir, "fsdp2")).run_loop()  # a "ddp" checkpoint resumed under fsdp2
        Trainer(_cfg(f"{tmp}/single", model_dir, "fsdp2")).run_loop()  # a one-rank state.pt resumed by 2 ranks
        with open(f"{tmp}/shard{rank}.json", "w") as f:
            json.dump({"full_rows": full, "local_rows": local}, f)
    finally:
        torch.distributed.destroy_process_group()


def _spawn(fn, args, timeout_s):
    ctx = mp.start_processes(fn, args=args, nprocs=2, start_method="spawn", join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=0.5):
            assert time.monotonic() < deadline, "the ranks hung (a collective that not every rank joined?)"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


def _result(run_dir):
    run = RunDir(run_dir)
    rows = sorted((r for r in read_metrics(run.metrics / "trainer.jsonl") if "reward" in r), key=lambda r: r["step"])
    vdir = run.version_dir(STEPS)
    state = read_saved_state(vdir)["trainer"]
    return {"loss": [r["loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows], "steps": [r["step"] for r in rows],
            # the trainer's own float32 weights (what it publishes is their bfloat16 cast, contract.weights)
            "weights": load_file(str(vdir / MASTER_DIR / "model.safetensors")), "optimizer": state["optimizer"],
            "scheduler": state["scheduler"], "files": sorted(p.name for p in vdir.iterdir())}


def _groups(opt: dict) -> list[dict]:
    """The optimizer's param groups, sequences as tuples (a resumed state may hold the betas as a list)."""
    return [{k: tuple(v) if isinstance(v, list) else v for k, v in g.items()} for g in opt["param_groups"]]


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.timeout(240)
def test_fsdp2_two_ranks_equal_one_rank(tiny_model_dir, tmp_path):
    for name in ("one", "fsdp2", "ddp", "single"):
        _write_rollouts(tmp_path / name)
    assert "WORLD_SIZE" not in os.environ
    t = Trainer(_cfg(tmp_path / "one", tiny_model_dir))
    assert t.run_loop() == STEPS
    assert Trainer(_cfg(tmp_path / "single", tiny_model_dir, steps=STEPS - 1)).run_loop() == STEPS - 1
    assert (RunDir(tmp_path / "single").version_dir(STEPS - 1) / "trainer_state" / "state.pt").is_file()
    _spawn(_rank_main, (2, free_port(), str(tiny_model_dir), str(tmp_path)), timeout_s=180)

    one = _result(tmp_path / "one")
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert _max_diff(one["weights"], {k: base[k] for k in one["weights"]}) > 1e-4  # the steps moved the weights
    shards = [json.loads((tmp_path / f"shard{r}.json").read_text()) for r in (0, 1)]
    assert all(s["local_rows"] * 2 == s["full_rows"] for s in shards)  # really sharded: half the rows each
    report = {}
    # "ddp": steps 0 and 1 under ddp, step 2 resumed under fsdp2; "single": steps 0 and 1 in one process
    for name in ("fsdp2", "ddp", "single"):
        got = _result(tmp_path / name)
        assert got["steps"] == one["steps"] == list(range(STEPS))
        for key in ("loss", "grad_norm"):
            for a, b in zip(got[key], one[key]):
                assert a == pytest.approx(b, rel=1e-5, abs=1e-7), (name, key, got[key], one[key])
        wdiff = _max_diff(got["weights"], one["weights"])
        assert wdiff <= 1e-5, (name, wdiff)
        # the committed optimizer state: the same format (by parameter name) and values
        assert _groups(got["optimizer"]) == _groups(one["optimizer"])
        assert got["optimizer"]["state"].keys() == one["optimizer"]["state"].keys()
        for i, s in one["optimizer"]["state"].items():
            assert s.keys() == got["optimizer"]["state"][i].keys()
            for k, v in s.items():
                torch.testing.assert_close(got["optimizer"]["state"][i][k], v, rtol=1e-4, atol=1e-7)
        assert got["scheduler"] == one["scheduler"]
        assert got["files"] == one["files"]  # the same HF safetensors directory is committed and published
        report[name] = {f"max_{key}_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(got[key], one[key]))
                        for key in ("loss", "grad_norm")} | {"max_weight_diff": wdiff}
    print("2 ranks vs 1 rank:", report)


def _held_bytes(t: Trainer) -> dict:
    """What this rank holds of the model: parameters (the KL reference model's too), gradients, optimizer state
    (a sharded tensor counts its local shard only; a tied parameter once)."""
    def local(x: torch.Tensor) -> int:
        x = x.to_local() if hasattr(x, "to_local") else x
        return x.numel() * x.element_size()

    params = {id(p): p for m in (t.model, t.ref_model) for p in m.parameters()}
    return {"params": sum(local(p) for p in params.values()),
            "grads": sum(local(p.grad) for p in params.values() if p.grad is not None),
            "optimizer": sum(local(v) for s in t.opt.state.values() for v in s.values()
                             if isinstance(v, torch.Tensor) and v.dim() > 0)}


def _run_and_measure(t: Trainer) -> dict:
    """Run the trainer's one step; what it holds after it, with the gradients as they were just before the
    optimizer step (the trainer drops them after it), and the most of every live tensor at either point."""
    grads = {}
    step = t.opt.step

    def spy(*a, **kw):
        grads["grads"] = _held_bytes(t)["grads"]
        grads["live"] = live_tensor_bytes()
        return step(*a, **kw)

    t.opt.step = spy
    t.run_loop()
    return {**_held_bytes(t), **grads, "live": max(grads["live"], live_tensor_bytes())}


def _bytes_cfg(run_dir, model_dir, parallel: str) -> RLConfig:
    cfg = _cfg(run_dir, model_dir, parallel, steps=1)
    return cfg.model_copy(update={"loss": cfg.loss.model_copy(update={"kl_coef": 0.1})})


def _bytes_main(rank, world, port, model_dir, tmp):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    try:
        t = Trainer(_bytes_cfg(f"{tmp}/bytes2", model_dir, "fsdp2"))
        held = _run_and_measure(t)  # one step: gradients and AdamW state exist
        with open(f"{tmp}/bytes{rank}.json", "w") as f:
            json.dump(held, f)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.timeout(240)
def test_fsdp2_ranks_hold_about_half_each(tiny_model_dir, tmp_path):
    """Each of 2 FSDP2 ranks holds at most 0.6x of what 1 rank holds, for parameters (the KL reference model
    included), gradients and optimizer state alike, and in every tensor alive in the process (``live``: a whole
    copy kept anywhere, after publishing a version for one, counts): no rank keeps a whole copy or gathers the
    optimizer state."""
    for name in ("bytes1", "bytes2"):
        _write_rollouts(tmp_path / name)
    one = Trainer(_bytes_cfg(tmp_path / "bytes1", tiny_model_dir, "fsdp2"))
    whole = _run_and_measure(one)
    assert all(v > 0 for v in whole.values()), whole
    _spawn(_bytes_main, (2, free_port(), str(tiny_model_dir), str(tmp_path)), timeout_s=180)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"bytes{rank}.json").read_text())
        print("rank", rank, {k: round(got[k] / whole[k], 3) for k in whole})
        assert all(got[k] <= 0.6 * whole[k] for k in whole), (rank, got, whole)
