"""TRL's GRPOTrainer on one of our tasks, for ``benchmarks/rl/vs_trl.py`` (the peer in the same sitting).

Runs in TRL's own environment (``scripts/setup-trl.sh``: .venv-trl, a pinned TRL beside the project's torch), with
the checkout on PYTHONPATH for the task only (``swarmrl.envs``: prompts from the train split, the verifier as the
reward; held-out items never reach TRL). Everything it is given comes from ``--spec`` (JSON, written by vs_trl.py
from the same config our runs use): model, task, group size, completions per step, learning rate and warm-up, new
tokens, temperature. The rest is TRL's defaults. It saves the policy at the first step end after each mark of
``marks_s`` (seconds since this script started, model loading included, as our runs count) into
``<out>/snap-<seconds>``, and stops at the first step end after ``minutes``. One JSON line per step goes to
``<out>/steps.jsonl`` and a summary line to stdout.

    PYTHONPATH=$PWD .venv-trl/bin/python benchmarks/rl/trl_grpo.py --spec spec.json --out runs/vs_trl/trl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

T0 = time.monotonic()


def main() -> None:
    from swarmrl.utils.memory import peak_rss_mb
    from swarmrl.utils.procs import adopt_parent_death

    adopt_parent_death()  # vs_trl.py started this process: it dies with it
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    spec = json.loads(Path(a.spec).read_text())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from swarmrl.envs.config import TaskConfig

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    env = TaskConfig(**spec["task"]).build()
    tasks = env.sample(spec["seed"], spec["train_items"], "train")
    by_id = {t.task_id: t for t in tasks}
    chat = spec["chat_template"]
    rows = [{"prompt": [{"role": "user", "content": t.prompt}] if chat else t.prompt, "task_id": t.task_id}
            for t in tasks]

    def reward(completions, task_id, **_):  # noqa: ANN001, ANN003
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(env.verify(by_id[i], text)) for i, text in zip(task_id, texts)]

    tok = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    group, per_step = spec["group_size"], spec["prompts_per_step"] * spec["group_size"]
    cfg = GRPOConfig(output_dir=str(out / "trl_out"), per_device_train_batch_size=per_step, num_generations=group,
                     gradient_accumulation_steps=1, max_completion_length=spec["max_new_tokens"],
                     temperature=spec["temperature"], learning_rate=spec["lr"],
                     lr_scheduler_type="constant_with_warmup", warmup_steps=spec["warmup_steps"],
                     max_steps=100_000, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                     bf16=False, fp16=False, seed=spec["seed"], dataloader_num_workers=0)
    marks = sorted(spec["marks_s"])
    limit = spec["minutes"] * 60.0
    steps_log = (out / "steps.jsonl").open("a")
    snaps: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003
            now = time.monotonic() - T0
            steps_log.write(json.dumps({"step": state.global_step, "wall_s": round(now, 2)}) + "\n")
            steps_log.flush()
            while marks and now >= marks[0]:
                mark = marks.pop(0)
                d = out / f"snap-{mark:g}"
                kw["model"].save_pretrained(d)
                tok.save_pretrained(d)
                snaps.append({"mark_s": mark, "wall_s": round(now, 2), "step": state.global_step, "dir": str(d)})
            if now >= limit:
                control.should_training_stop = True
            return control

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Clock()])
    trainer.train()
    now = time.monotonic() - T0
    d = out / "snap-end"
    trainer.model.save_pretrained(d)
    tok.save_pretrained(d)
    snaps.append({"mark_s": None, "wall_s": round(now, 2), "step": trainer.state.global_step, "dir": str(d)})
    print(json.dumps({"system": "trl", "steps": trainer.state.global_step, "wall_s": round(now, 2), "snapshots": snaps,
                      "peak_rss_mb": peak_rss_mb()}))


if __name__ == "__main__":
    main()
