"""Verifying a rollout: ONE prefill over prompt + completion recomputes every decode state and logit.

The state committed for completion token i is the LM-head input at sequence position
len(prompt) - 1 + i (what the sampler captures during decoding). A prefill over prompt + completion[:-1]
yields all of them at once as its last len(completion) positions; the logits there are what the
sampling check needs. Rows are left-padded with position ids from the attention-mask cumsum, so a
row's states do not depend on what else is in the batch (up to kernel noise, which the thresholds absorb).
Rows that repeat a prompt (a GRPO group) prefill it once and run their completions on its cached keys and
values: the same states, with each prompt computed once per batch.

A multi-turn row (an item with a fifth element, its completion mask) holds environment tokens the model did not
sample: the prefill runs over the whole trajectory, and the proofs and the sampling check cover the positions of
the model's tokens only (mask 1), in order: what the sampler captured turn by turn.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from swarmrl.contract.params import PROOF_GEOMETRY, ProofGeometry
from swarmrl.inference.sampler import _left_pad, _LMHeadInputHook
from swarmrl.toploc.sampling_check import SamplingCheck, SamplingClaim, SamplingThresholds, check_sampling
from swarmrl.toploc.verify import ChunkCheck, Thresholds, verify_proofs_batch

log = logging.getLogger("swarmrl.toploc.rollout")

__all__ = ["Recomputed", "RolloutCheck", "claim_from_rollout", "input_problem", "recompute", "verify_rollout",
           "verify_rollouts", "verify_rows"]


@dataclass
class Recomputed:
    hidden: torch.Tensor  # [len(completion), hidden] bf16
    logits: torch.Tensor  # [len(completion), vocab] float32


@dataclass
class RolloutCheck:
    passed: bool
    reason: str | None = None
    chunks: list[ChunkCheck] = field(default_factory=list)
    sampling: SamplingCheck | None = None

    @property
    def proofs_passed(self) -> bool:
        return bool(self.chunks) and all(c.passed for c in self.chunks)

    def to_dict(self) -> dict:
        return asdict(self)


def input_problem(model: torch.nn.Module, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> str | None:
    """What makes (prompt_ids, completion_ids) unfit for a prefill of ``model`` (None: fit)."""
    vocab = model.get_input_embeddings().num_embeddings
    if len(prompt_ids) == 0:
        return "empty prompt"
    if len(completion_ids) == 0:
        return "empty completion"
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and len(prompt_ids) + len(completion_ids) - 1 > max_pos:
        return f"prompt + completion is {len(prompt_ids) + len(completion_ids)} tokens, over the model's {max_pos}"
    for name, ids in (("prompt", prompt_ids), ("completion", completion_ids)):
        if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in ids):
            return f"{name} has a token id outside [0, {vocab})"
    return None


@torch.no_grad()
def recompute(model: torch.nn.Module, items: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 8,
              pad_id: int | None = None, shared_prompts: bool = True) -> list[Recomputed]:
    """Decode-position states and logits for each (prompt_ids, completion_ids), one prefill per batch. With
    ``shared_prompts``, a batch in which rows repeat a prompt (a group's completions) prefills each distinct
    prompt once and then the completions on its cached keys and values (``_recompute_shared``)."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if pad_id is None:
        pad_id = getattr(model.config, "pad_token_id", None) or 0
    device = next(model.parameters()).device
    out: list[Recomputed] = []
    for start in range(0, len(items), batch_size):
        batch = items[start: start + batch_size]
        if shared_prompts and len({tuple(p) for p, _ in batch}) < len(batch):
            try:
                out.extend(_recompute_shared(model, batch, pad_id, device))
                continue
            except (AttributeError, TypeError, NotImplementedError) as e:  # a model without a usable KV cache
                log.warning("recompute: shared-prompt pass not supported by %s (%s); one prefill per row",
                            type(model).__name__, e)
        seqs = [list(p) + list(c)[:-1] for p, c in batch]
        keep = max(len(c) for _, c in batch)
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        hook = _LMHeadInputHook(model)
        try:
            res = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                        use_cache=False, logits_to_keep=keep)
            hid = hook.last
        finally:
            hook.close()
        if hid is None or hid.shape[1] != keep:
            raise RuntimeError("could not capture the LM head input for the kept positions")
        for i, (_, c) in enumerate(batch):
            n = len(c)
            out.append(Recomputed(hid[i, keep - n:].to(torch.bfloat16).cpu().contiguous(),
                                  res.logits[i, keep - n:].float().cpu()))
    return out


def _judge(rec: Recomputed, completion_ids: Sequence[int], chunks: list[ChunkCheck], claim: SamplingClaim | None,
           sampling_thresholds: SamplingThresholds | None) -> RolloutCheck:
    reasons = []
    bad = [c for c in chunks if not c.passed]
    if bad:
        reasons.append(f"{len(bad)}/{len(chunks)} chunk(s) failed: chunk {bad[0].index}: {bad[0].reason}")
    samp = None
    if claim is not None:
        samp = check_sampling(rec.logits, list(completion_ids), claim, sampling_thresholds)
        if not samp.passed:
            reasons.append("sampling: " + "; ".join(samp.reasons))
    return RolloutCheck(not reasons, "; ".join(reasons) or None, chunks, samp)


def verify_rollout(model: torch.nn.Module, prompt_ids: Sequence[int], completion_ids: Sequence[int], proofs: object,
                   geometry: ProofGeometry = PROOF_GEOMETRY, thresholds: Thresholds | None = None,
                   claim: SamplingClaim | None = None, sampling_thresholds: SamplingThresholds | None = None
                   ) -> RolloutCheck:
    """Recompute the decode states with one prefill and check the (untrusted) proofs and sampling claim."""
    return verify_rollouts(model, [(prompt_ids, completion_ids, proofs, claim)], geometry,
                           thresholds=thresholds, sampling_thresholds=sampling_thresholds, batch_size=1)[0]


def verify_rollouts(model: torch.nn.Module, items: Sequence[tuple], geometry: ProofGeometry = PROOF_GEOMETRY,
                    thresholds: Thresholds | None = None, sampling_thresholds: SamplingThresholds | None = None,
                    batch_size: int = 8, recomputed: Sequence[Recomputed | None] | None = None) -> list[RolloutCheck]:
    """Batched verification; items are (prompt_ids, completion_ids, proofs, claim-or-None).

    Malformed inputs (bad token ids, empty or over-long sequences) are rejected per item with a reason. An item
    may carry a fifth element, the completion mask (1: the model's token): proofs and claim cover those tokens.
    ``recomputed`` (one entry per item, None where not computed): states and logits a caller already has from
    ``recompute`` of the same (prompt_ids, completion_ids) with this model (the validator's one forward, shared
    with its logprob check); only the items without one are prefilled here.
    """
    if recomputed is not None and len(recomputed) != len(items):
        raise ValueError(f"{len(recomputed)} recomputed states for {len(items)} items")
    results: list[RolloutCheck | None] = [None] * len(items)
    todo: list[int] = []
    norm: list[tuple] = []
    for i, item in enumerate(items):
        try:
            if not isinstance(item, (tuple, list)) or len(item) not in (3, 4, 5):
                raise ValueError("expected (prompt_ids, completion_ids, proofs[, claim[, mask]])")
            prompt_ids, completion_ids = list(item[0]), list(item[1])
            mask = [int(bool(m)) for m in item[4]] if len(item) == 5 and item[4] is not None else None
            norm.append((prompt_ids, completion_ids, item[2], item[3] if len(item) >= 4 else None, mask))
            why = input_problem(model, prompt_ids, completion_ids) or _mask_problem(completion_ids, mask)
        except Exception as e:  # hostile item shapes
            norm.append(((), (), None, None, None))
            why = f"malformed rollout: {type(e).__name__}: {e}"
        if why is not None:
            results[i] = RolloutCheck(False, why)
        else:
            todo.append(i)
    given = {i: recomputed[i] for i in todo if recomputed is not None and recomputed[i] is not None}
    missing = [i for i in todo if i not in given]
    given.update(zip(missing, recompute(model, [(norm[i][0], norm[i][1]) for i in missing], batch_size=batch_size)))
    recs = [_model_part(given[i], norm[i][4]) for i in todo]
    chunk_checks = verify_proofs_batch([(rec.hidden, norm[i][2]) for i, rec in zip(todo, recs)], geometry,
                                       thresholds=thresholds)  # every row's proofs in one vectorised pass
    for i, rec, chunks in zip(todo, recs, chunk_checks):
        _, completion_ids, _, claim, mask = norm[i]
        ids = completion_ids if mask is None else [t for t, m in zip(completion_ids, mask) if m]
        results[i] = _judge(rec, ids, chunks, claim, sampling_thresholds)
    return results  # type: ignore[return-value]


def _mask_problem(completion_ids: list[int], mask: list[int] | None) -> str | None:
    if mask is None:
        return None
    if len(mask) != len(completion_ids):
        return f"{len(mask)} completion mask values for {len(completion_ids)} completion tokens"
    return None if any(mask) else "no token of the completion is the model's"


def _model_part(rec: Recomputed, mask: list[int] | None) -> Recomputed:
    """The states and logits at the model's tokens (all of them without a mask)."""
    if mask is None or all(mask):
        return rec
    keep = torch.tensor(mask, dtype=torch.bool)
    return Recomputed(rec.hidden[keep].contiguous(), rec.logits[keep])


def _row_mask(r) -> list[int] | None:  # noqa: ANN001
    """A row's completion mask when it holds environment tokens (None: every token is the model's)."""
    mask = getattr(r, "completion_mask", None)
    return None if mask is None or all(mask) else list(mask)


def claim_from_rollout(r, eos_id: int, top_p: float = 1.0, max_new_tokens: int | None = None) -> SamplingClaim:
    """The sampling claim of a ``swarmrl.contract.Rollout`` row (top_p / max_new_tokens from the run config): the
    logprobs of the model's tokens (a multi-turn row's environment tokens were not sampled). A multi-turn row's
    length is not bounded by ``max_new_tokens`` per turn, so it is not claimed there."""
    mask = _row_mask(r)
    lps = list(r.logprobs) if mask is None else [lp for lp, m in zip(r.logprobs, mask) if m]
    return SamplingClaim(eos_id=eos_id, temperature=float(r.temperature), top_p=top_p, logprobs=lps,
                         finished=bool(r.finished), max_new_tokens=max_new_tokens if mask is None else None)


def verify_rows(model: torch.nn.Module, rows: Sequence, eos_id: int, top_p: float = 1.0,
                max_new_tokens: int | None = None, check_sampling: bool = True,
                geometry: ProofGeometry = PROOF_GEOMETRY,
                thresholds: Thresholds | None = None, sampling_thresholds: SamplingThresholds | None = None,
                batch_size: int = 8) -> list[RolloutCheck]:
    """Verify ``swarmrl.contract.Rollout`` rows (proofs + sampling claim from each row)."""
    items = [(r.prompt_ids, r.completion_ids, r.proofs,
              claim_from_rollout(r, eos_id, top_p, max_new_tokens) if check_sampling else None, _row_mask(r))
             for r in rows]
    return verify_rollouts(model, items, geometry, thresholds=thresholds,
                           sampling_thresholds=sampling_thresholds, batch_size=batch_size)


def _recompute_shared(model: torch.nn.Module, batch: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int,
                      device: torch.device) -> list[Recomputed]:
    """``recompute`` for rows that share prompts: one prefill of the distinct prompts (left-padded, keeping the
    last position: the state and logits of completion token 0), then one pass over every row's completion[:-1]
    (right-padded) on its prompt's cached keys and values, positions continuing the prompt's. The same states
    as a prefill of prompt + completion[:-1] up to kernel noise, with each prompt's tokens computed once per
    batch instead of once per row (a group of 8 repeats its prompt 8 times)."""
    prompts: dict[tuple[int, ...], int] = {}
    which = [prompts.setdefault(tuple(p), len(prompts)) for p, _ in batch]
    plist = list(prompts)
    ids, mask = _left_pad([list(p) for p in plist], pad_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    hook = _LMHeadInputHook(model)
    try:
        res = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                    use_cache=True, logits_to_keep=1)
        first_hid, first_logits, cache = hook.last, res.logits, res.past_key_values
        rest = max(len(c) for _, c in batch) - 1
        if rest > 0:
            idx = torch.tensor(which, dtype=torch.long)
            cache.batch_select_indices(idx.to(device))  # each row's own copy of its prompt's keys and values
            cids = torch.full((len(batch), rest), pad_id, dtype=torch.long)
            cmask = torch.zeros((len(batch), rest), dtype=torch.long)
            for i, (_, c) in enumerate(batch):
                cids[i, :len(c) - 1] = torch.tensor(list(c)[:-1], dtype=torch.long)
                cmask[i, :len(c) - 1] = 1
            plen = torch.tensor([len(plist[u]) for u in which], dtype=torch.long)
            cpos = plen[:, None] + torch.arange(rest)[None, :]
            res = model(input_ids=cids.to(device), attention_mask=torch.cat([mask[idx], cmask], 1).to(device),
                        position_ids=cpos.to(device), past_key_values=cache, use_cache=True, logits_to_keep=rest)
            hid, logits = hook.last, res.logits
            if hid is None or hid.shape[1] != rest:
                raise RuntimeError("could not capture the LM head input for the kept positions")
    finally:
        hook.close()
    if first_hid is None or first_hid.shape[1] != 1:
        raise RuntimeError("could not capture the LM head input for the kept positions")
    out = []
    for i, (_, c) in enumerate(batch):
        n, u = len(c), which[i]
        h, lg = first_hid[u], first_logits[u]
        if n > 1:
            h, lg = torch.cat([h, hid[i, :n - 1]]), torch.cat([lg, logits[i, :n - 1]])
        out.append(Recomputed(h.to(torch.bfloat16).cpu().contiguous(), lg.float().cpu()))
    return out
