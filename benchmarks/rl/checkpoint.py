"""One rank's trainer-state save: one ``torch.save`` file (what ``training.checkpoint.Checkpointer`` does for one rank)
against ``torch.distributed.checkpoint`` (what it does for several ranks), same state, same invocation.

    python benchmarks/rl/checkpoint.py [--model DIR] [--reps 15]

The state is a real ``TrainerState`` (AdamW after one step, schedule, RNG, counters) of ``--model`` (a fresh tiny
model by default, the tests' size). Saves alternate between the two ways into fresh directories; prints one JSON
line with each way's median milliseconds and the ratio DCP / torch.save.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="HF model dir (default: a fresh tiny model)")
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()

    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    from swarmrl.models import ModelInitConfig, init_model
    from swarmrl.training.checkpoint import TrainerState

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = a.model
        if not model_dir:
            model_dir = str(Path(tmp) / "tiny")
            init_model(ModelInitConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128), model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        model(input_ids=torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
        opt.step()
        sched.step()
        state = TrainerState(model, opt, sched)
        times: dict[str, list[float]] = {"torch_save": [], "dcp": []}
        for i in range(a.reps):
            for way in (("torch_save", "dcp") if i % 2 == 0 else ("dcp", "torch_save")):
                d = Path(tmp) / f"{way}{i}"
                d.mkdir()
                t0 = time.perf_counter()
                if way == "torch_save":
                    torch.save(state.state_dict(), d / "state.pt")
                else:
                    dcp.save({"trainer": state}, checkpoint_id=d, no_dist=True)
                times[way].append(time.perf_counter() - t0)
        ms = {k: round(1000 * statistics.median(v), 1) for k, v in times.items()}
        params = sum(p.numel() for p in model.parameters())
        print(json.dumps({"model": a.model or "tiny", "parameters": params, "reps": a.reps,
                          "torch_save_ms": ms["torch_save"], "dcp_ms": ms["dcp"],
                          "dcp_over_torch_save": round(ms["dcp"] / ms["torch_save"], 2)}))


if __name__ == "__main__":
    main()
