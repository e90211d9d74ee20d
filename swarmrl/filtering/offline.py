"""Offline filtering: estimate each training task's solve rate with the policy and keep a band.

INTELLECT-2 kept tasks whose solve rate lay in [0.1, 0.8]: too-easy tasks give tied groups (all
correct) and unsolvable ones give tied groups (all wrong); both waste generation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import Field, model_validator

from swarmrl.config import StrictModel
from swarmrl.envs.config import TaskConfig
from swarmrl.inference.params import SamplingParams
from swarmrl.inference.prompts import decode_completion, encode_prompt
from swarmrl.inference.sampler import generate
from swarmrl.models.io import load_model, load_tokenizer


class FilterConfig(StrictModel):
    model: str = "runs/warmstart/model"
    task: TaskConfig = Field(default_factory=TaskConfig)
    n_tasks: int = Field(512, ge=1)
    samples: int = Field(8, ge=1)
    band: tuple[float, float] = (0.1, 0.8)
    sampling: SamplingParams = Field(default_factory=SamplingParams)  # single-turn: max_new_tokens, temperature
    batch_prompts: int = Field(64, ge=1)
    out: str = "runs/filtered_tasks.jsonl"
    seed: int = 0
    chat_template: bool = False
    threads: int | None = None

    @model_validator(mode="after")
    def _band(self) -> FilterConfig:
        lo, hi = self.band
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError("band must satisfy 0 <= low <= high <= 1")
        return self


def run_filter(cfg: FilterConfig, progress: Callable[[str], None] = print) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model, tok = load_model(cfg.model), load_tokenizer(cfg.model)
    env = cfg.task.build()
    tasks = list({t.task_id: t for t in env.sample(cfg.seed, cfg.n_tasks)}.values())  # distinct
    gen = torch.Generator().manual_seed(cfg.seed)
    rates: list[float] = []
    for i in range(0, len(tasks), cfg.batch_prompts):
        chunk = tasks[i: i + cfg.batch_prompts]
        prompts = [encode_prompt(tok, t.prompt, cfg.chat_template) for t in chunk for _ in range(cfg.samples)]
        out = generate(model, prompts, cfg.sampling, tok.eos_token_id, tok.pad_token_id, generator=gen)
        for j, t in enumerate(chunk):
            rs = [env.verify(t, decode_completion(tok, out.completion_ids[j * cfg.samples + s]))
                  for s in range(cfg.samples)]
            rates.append(sum(rs) / len(rs))
        progress(f"filter: {min(i + cfg.batch_prompts, len(tasks))}/{len(tasks)} tasks scored")
    lo, hi = cfg.band
    kept = [t for t, r in zip(tasks, rates) if lo <= r <= hi]
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for t, r in zip(tasks, rates):
            if lo <= r <= hi:
                f.write(json.dumps({"task_id": t.task_id, "env": t.env, "prompt": t.prompt,
                                    "verification_info": t.verification_info, "task_type": t.task_type,
                                    "demonstration": t.demonstration, "solve_rate": r}) + "\n")
    hist = {f"{b / 10:.1f}": sum(1 for r in rates if b / 10 <= r < (b + 1) / 10 or (b == 9 and r == 1.0))
            for b in range(10)}
    return {"scored": len(tasks), "kept": len(kept), "too_easy": sum(r > hi for r in rates),
            "too_hard": sum(r < lo for r in rates), "band": [lo, hi], "out": str(out), "solve_rate_hist": hist,
            "use_with": f'--set rl.contract.task.name=filtered --set rl.contract.task.params.path="{out}" '
                        f'--set rl.contract.task.params.base={env.name}'}
