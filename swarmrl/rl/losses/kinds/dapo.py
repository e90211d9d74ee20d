"""``dapo``: clip-higher and overlong filtering."""

from __future__ import annotations

from swarmrl.rl.losses.kinds.grpo import GRPO


class DAPO(GRPO):
    """DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): GRPO's token
    objective with clip-higher (eps_h = 0.28 > eps_l = 0.2), token-level normalisation, and overlong filtering (a
    completion cut at ``max_new_tokens`` without EOS is left out of the loss); its dynamic sampling is the run's
    tie filter (``contract.filter_ties``)."""

    name = "dapo"
    defaults = {"clip_eps_high": 0.28, "overlong_filter": True}


LOSS = DAPO()
