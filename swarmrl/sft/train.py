"""SFT warm start: next-token loss on the demonstration (plus EOS), prompt tokens masked out.

The model, optimizer and schedule come from the shared builders (``swarmrl.training``): the model of ``model`` or a
fresh tiny one, AdamW with torch's fused kernel (the update of torch's default AdamW, SFT's before, up to float
rounding), the warm-up of ``warmup_steps`` and the global-norm clip at 1.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from swarmrl.envs.base import Task
from swarmrl.eval.heldout import evaluate
from swarmrl.inference.params import TokenLimits
from swarmrl.inference.prompts import encode_prompt
from swarmrl.models.io import save_model
from swarmrl.sft.config import SFTConfig
from swarmrl.training.model import build_model, prepare_model
from swarmrl.training.optim import build_optimizer, clip_gradients
from swarmrl.training.schedule import build_scheduler
from swarmrl.utils.metrics import MetricsWriter

BETAS = (0.9, 0.999)  # torch's AdamW default, what SFT has always trained with
GRAD_CLIP = 1.0


def _batch(tokenizer, tasks: list[Task], chat_template: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seqs, labels = [], []
    for t in tasks:
        if t.demonstration is None:
            raise ValueError(f"task {t.task_id} has no demonstration to train on")
        p = encode_prompt(tokenizer, t.prompt, chat_template)
        a = tokenizer.encode(t.demonstration, add_special_tokens=False) + [tokenizer.eos_token_id]
        seqs.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, target) in enumerate(zip(seqs, labels)):  # right padding for training
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(target)] = torch.tensor(target)
        mask[i, : len(s)] = 1
    return ids, mask, lab


def run_sft(cfg: SFTConfig, on_progress: Callable[[dict], None] | None = None) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.minutes is None and cfg.steps is None:
        raise ValueError("set minutes or steps")
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = build_model(cfg.model, cfg.init)
    env = cfg.task.build()
    opt = build_optimizer(model.parameters(), cfg.lr, BETAS, cfg.weight_decay)
    sched = build_scheduler(opt, cfg.warmup_steps)
    evals = sorted(cfg.eval_at_minutes)
    results: list[dict] = []
    metrics = MetricsWriter(out / "metrics.jsonl")
    prepare_model(model)
    t0 = time.perf_counter()
    train_time = 0.0  # excludes evaluation time, so "after N minutes" means N minutes of training
    step = 0
    longest = max(len(str(t.demonstration)) for t in env.heldout_set(64)) + 2  # room for the longest answer
    limits = TokenLimits(max_new_tokens=longest)  # (a multi-turn task's trajectory: the same)
    while True:
        if cfg.steps is not None and step >= cfg.steps:
            break
        if cfg.minutes is not None and train_time >= cfg.minutes * 60:
            break
        ts = time.perf_counter()
        tasks = env.sample(seed=cfg.seed * 1_000_003 + step, n=cfg.batch_size)
        ids, mask, lab = _batch(tok, tasks, cfg.chat_template)
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_gradients(model.parameters(), opt, GRAD_CLIP)
        opt.step()
        sched.step()
        step += 1
        train_time += time.perf_counter() - ts
        row = {"step": step, "train_s": round(train_time, 2), "loss": float(loss.detach())}
        while evals and train_time >= evals[0] * 60:
            evals.pop(0)
            acc = evaluate(model, tok, env, n=cfg.eval_n, limits=limits, chat_template=cfg.chat_template)
            row["heldout_acc"] = acc["accuracy"]
            results.append({"train_minutes": round(train_time / 60, 2), "step": step, "heldout_acc": acc["accuracy"]})
        if cfg.stop_at_accuracy is not None and step % cfg.stop_check_every == 0:
            chk = evaluate(model, tok, env, n=cfg.stop_check_n, limits=limits,
                           chat_template=cfg.chat_template, seed=cfg.seed + 777)
            row["check_acc"] = chk["accuracy"]
            if chk["accuracy"] >= cfg.stop_at_accuracy:
                metrics.write(**row)
                break
        metrics.write(**row)
        if on_progress and (step % 10 == 0 or "heldout_acc" in row):
            on_progress(row)
        if not math.isfinite(row["loss"]):
            raise FloatingPointError(f"loss became {row['loss']} at step {step}")
    final = evaluate(model, tok, env, n=cfg.eval_n, limits=limits, chat_template=cfg.chat_template)
    results.append({"train_minutes": round(train_time / 60, 2), "step": step, "heldout_acc": final["accuracy"]})
    metrics.write(step=step, train_s=round(train_time, 2), heldout_acc=final["accuracy"], final=True)
    metrics.close()
    model.eval()
    save_model(model, tok, out / "model")
    summary = {"model": str(out / "model"), "steps": step, "train_s": round(train_time, 1),
               "wall_s": round(time.perf_counter() - t0, 1), "evals": results, "final_heldout_acc": final["accuracy"],
               "task": cfg.task.model_dump(), "chat_template": cfg.chat_template}  # `swarmrl eval` defaults to these
    (out / "summary.json").write_text(__import__("json").dumps(summary, indent=2))
    return summary
