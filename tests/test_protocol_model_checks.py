"""The validator's model checks (logprobs, TOPLOC, sampling) run ONE forward per submission and policy version: the
logprob check reads its logprobs from the states the TOPLOC check verifies its proofs against, instead of packing
its rows into a forward of its own. Counted here as the tokens the model's decoder is run on."""

from __future__ import annotations

import torch

from swarmrl.contract import RLContract, Rollout
from swarmrl.envs.config import TaskConfig
from swarmrl.inference.sampler import generate
from swarmrl.models import load_model, load_tokenizer
from swarmrl.protocol.checks import CheckContext, logprob_check, sampling_check, toploc_check
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.schemas import AssignmentSpec, PendingSubmission, SubmissionInfo, TaskSpec
from swarmrl.toploc import build_proofs
from swarmrl.toploc.rollout import recompute

torch.set_num_threads(1)
GROUP = 4
CLAIM = "swarmrl.toploc.rollout:claim_from_rollout"
CONTRACT = RLContract(task=TaskConfig(name="add"), group_size=GROUP, sampling={"max_new_tokens": 10})


def _rows(model: torch.nn.Module, tok) -> list[Rollout]:  # noqa: ANN001
    """Two prompts, a group of four completions each, sampled with proofs as an honest node does."""
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("12+30=", "7+45=") for _ in range(GROUP)]
    out = generate(model, prompts, CONTRACT.sampling, tok.eos_token_id,
                   tok.pad_token_id, capture_hidden=True, generator=torch.Generator().manual_seed(5))
    return [Rollout(worker_id="n" * 16, step=1, policy_version=0, task_id=f"t{i // GROUP}", env="add",
                    group_id=f"g{i // GROUP}", prompt_ids=p, completion_ids=c, logprobs=lp, reward=0.0,
                    task_reward=0.0, length_penalty=0.0, target_length=None, temperature=1.0, finished=fin, seed=0,
                    proofs=build_proofs(h))
            for i, (p, c, lp, fin, h) in enumerate(zip(out.prompt_ids, out.completion_ids, out.logprobs,
                                                       out.finished, out.hidden))]


def _pending(n_rows: int) -> PendingSubmission:
    a = AssignmentSpec(assignment_id=1, step=1, policy_version=0, seed=0,
                       contract=CONTRACT, target_length=None,
                       tasks=[TaskSpec(task_id=f"t{i}", prompt="x") for i in range(2)])
    sub = SubmissionInfo(submission_id=1, node_id="n" * 16, assignment_id=1, step=1, sha256="0" * 64, size=1,
                         n_rows=n_rows, status="pending", created_at=0.0)
    return PendingSubmission(submission=sub, assignment=a, origin_node_id="n" * 16, current_step=1,
                             current_policy_version=1)


class _TokensForwarded:
    """Counts the token positions the model's decoder runs on (every forward: packed, prefill or cached)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.n = 0
        self._h = model.get_decoder().register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, _mod, args, kwargs):  # noqa: ANN001, ANN202
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.n += int(ids.numel())

    def close(self) -> None:
        self._h.remove()


def _run(cfg: ValidatorConfig, model, tok, rows) -> tuple[int, list[tuple[bool, str]]]:  # noqa: ANN001
    ctx = CheckContext(rows=rows, item=_pending(len(rows)), cfg=cfg, tokenizer=tok, model_loader=lambda v: model)
    count = _TokensForwarded(model)
    try:
        results = [check(ctx) for check in (logprob_check(cfg), toploc_check(cfg), sampling_check(cfg))]
    finally:
        count.close()
    return count.n, results


def test_logprob_toploc_and_sampling_checks_share_one_forward(tiny_model_dir):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    rows = _rows(model, tok)
    cfg = ValidatorConfig(logprob_rows=4, toploc_batch_size=64, sampling_claim=CLAIM,
                          sampling_thresholds={"min_token_logprob": -30})
    forwarded, results = _run(cfg, model, tok, rows)
    assert all(ok for ok, _ in results), results
    assert "4 rows' logprobs recomputed" in results[0][1]

    count = _TokensForwarded(model)  # what the TOPLOC check's prefill alone runs on
    try:
        recompute(model, [(r.prompt_ids, r.completion_ids) for r in rows], batch_size=64)
    finally:
        count.close()
    assert forwarded == count.n, f"the three checks ran {forwarded} tokens; TOPLOC's prefill alone runs {count.n}"


def test_without_toploc_the_logprob_check_runs_its_own_rows_only(tiny_model_dir):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    rows = _rows(model, tok)
    cfg = ValidatorConfig(logprob_rows=2, toploc_check="", toploc_batch_size=64)
    ctx = CheckContext(rows=rows, item=_pending(len(rows)), cfg=cfg, tokenizer=tok, model_loader=lambda v: model)
    count = _TokensForwarded(model)
    try:
        ok, reason = logprob_check(cfg)(ctx)
    finally:
        count.close()
    assert ok, reason
    picked = sorted(ctx.cache["states"])
    assert len(picked) == 2
    every_row = sum(len(r.prompt_ids) + len(r.completion_ids) - 1 for r in rows)
    assert 0 < count.n < every_row / 2, (count.n, every_row)


def test_a_forged_logprob_is_caught_from_the_shared_forward(tiny_model_dir):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    rows = _rows(model, tok)
    for r in rows:  # every row, so whichever the file's hash picks carries the forgery
        r.logprobs = [lp + (0.05 if j == 0 else 0.0) for j, lp in enumerate(r.logprobs)]
    cfg = ValidatorConfig(logprob_rows=1, toploc_batch_size=64, sampling_claim=CLAIM)
    _, results = _run(cfg, model, tok, rows)
    ok, reason = results[0]
    assert not ok and "claimed logprobs differ" in reason and "by 0.05" in reason, reason
