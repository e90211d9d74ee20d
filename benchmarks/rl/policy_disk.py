"""Disk use of the committed policy versions: the trainer's state (optimizer, schedule, RNG) kept in the newest
version only (``PolicyDir.drop_older_states``, the default) against kept in every version (the code before).

A real ``Trainer`` on ``--model`` (a fresh tiny model by default; SmolLM2-135M-Instruct: ``--model
models/smollm2``, see ``swarmrl model import``) with full fine-tuning and AdamW commits version 0, then takes
``--updates`` optimizer steps on a fixed batch, committing a version after each as its loop does (weights,
tokenizer, ``trainer_state/``; versions beyond ``rl.keep_versions`` pruned). After each commit the policy
directory is measured (bytes of every file under it). The baseline is the same run with ``drop_older_states``
turned into a no-op, in the same invocation. Prints one JSON line: per variant the bytes after each commit and at
the end, the size of one version's weights and of its ``trainer_state/``, and the ratio now / before.

    python benchmarks/rl/policy_disk.py --model models/smollm2 [--updates 4] [--keep 4]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import tempfile
import time
from pathlib import Path

GiB = 1024**3


def du(d: Path) -> int:
    return sum(os.stat(os.path.join(r, n)).st_size for r, _, names in os.walk(d) for n in names)


def one(model: str, variant: str, updates: int, keep: int, tmp: Path) -> dict:
    import torch

    from swarmrl.contract import RLContract, Rollout
    from swarmrl.envs.config import TaskConfig
    from swarmrl.rl.config import EvalSection, OptimConfig, RLConfig
    from swarmrl.rl.trainer import Trainer
    from swarmrl.rundir.layout import STATE_DIR
    from swarmrl.rundir.policy_versions import PolicyDir

    torch.set_num_threads(1)
    drop = PolicyDir.drop_older_states
    if variant == "before":
        PolicyDir.drop_older_states = lambda self, name="trainer_state": 0  # type: ignore[method-assign]
    try:
        rng = random.Random(0)
        groups = [[Rollout("w0", 0, 0, f"t{g}", "add", f"g{g}", [rng.randrange(3, 200) for _ in range(16)],
                           [rng.randrange(3, 200) for _ in range(8)], [-2.0] * 8, float(i % 2), float(i % 2),
                           0.0, None, 1.0, True, 0) for i in range(8)] for g in range(2)]
        cfg = RLConfig(run_dir=str(tmp / variant), model=model, steps=updates, prompts_per_step=2, keep_versions=keep,
                       contract=RLContract(task=TaskConfig(name="add"), async_level=0, group_size=8),
                       eval=EvalSection(every_steps=0, n=2, max_new_tokens=2),
                       optim=OptimConfig(lr=1e-5, micro_batch=16))
        t = Trainer(cfg)  # commits version 0 (no optimizer state yet)
        root = t.run.policy
        sizes = [du(root)]
        t0 = time.perf_counter()
        for n in range(updates):
            t.update(groups)
            t.state.step = n + 1
            t._commit(n + 1, consumed=[], full=t.par.gather_full_model())
            sizes.append(du(root))
        newest = t.run.version_dir(updates)
        row = {"variant": variant, "bytes_after_each_commit": sizes, "final_bytes": sizes[-1],
               "final_gib": round(sizes[-1] / GiB, 2), "versions": sorted(d.name for d in root.glob("v*")),
               "with_state": sorted(d.name for d in root.glob("v*") if (d / STATE_DIR).exists()),
               "weights_bytes": (newest / "model.safetensors").stat().st_size,
               "state_bytes": du(newest / STATE_DIR), "seconds": round(time.perf_counter() - t0, 1)}
        del t
        gc.collect()
        return row
    finally:
        PolicyDir.drop_older_states = drop  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="", help="HF model dir (default: a fresh tiny model)")
    ap.add_argument("--updates", type=int, default=4, help="optimizer steps, a version committed after each")
    ap.add_argument("--keep", type=int, default=4, help="rl.keep_versions")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="swarmrl-policy-disk-") as tmp:
        model = a.model
        if not model:
            from swarmrl.models import ModelInitConfig, init_model

            model = str(Path(tmp) / "tiny")
            init_model(ModelInitConfig(seed=0), Path(model))
        before = one(model, "before", a.updates, a.keep, Path(tmp))
        now = one(model, "now", a.updates, a.keep, Path(tmp))
    params = json.loads((Path(model) / "swarmrl_import.json").read_text()).get("parameters") \
        if (Path(model) / "swarmrl_import.json").is_file() else None
    print(json.dumps({"bench": "policy_disk", "model": a.model or "tiny", "parameters": params, "keep_versions": a.keep,
                      "updates": a.updates, "before_gib": before["final_gib"], "now_gib": now["final_gib"],
                      "now_over_before": round(now["final_bytes"] / before["final_bytes"], 3),
                      "weights_mb": round(now["weights_bytes"] / 1e6, 1), "state_mb": round(now["state_bytes"] / 1e6, 1),
                      "state_over_weights": round(now["state_bytes"] / now["weights_bytes"], 3),
                      "before": before, "now": now}))


if __name__ == "__main__":
    main()
