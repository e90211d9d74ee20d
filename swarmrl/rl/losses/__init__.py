"""The policy-gradient losses (pure math: tensors in, tensors out): one family, each loss one small object in its
own module of ``kinds``, picked by ``rl.loss.kind``.

- ``kinds``: the losses (``grpo``, the default, ``dr_grpo``, ``dapo``, ``gspo``, ``cispo``, ``rloo``): each its
  name, the config knobs it sets, its advantage rule, its ratio, token objective and clip counts, and its source.
- ``registry``: finds them (``get_loss``, ``loss_names``); a new loss is one new module in ``kinds``.
- ``base``: what a loss is (``Loss``) and the clipped surrogate most of them share.
- ``advantages``: group-relative advantages from rewards, the one place they are computed (the trainer, with the
  loss's rule).
- ``objective``: the resolved knobs (``Objective``), plain data.
- ``policy``: ``policy_loss``, the steps every loss shares: the ratio against the inference logprobs, the
  off-policy correction's weight (``importance``), entropy and KL terms, the normalisation weights (``weights``),
  the statistics (``stats``, with the inference/trainer mismatch KL); ``ratio`` clamps every log-ratio.

Importing the package, ``registry``, ``base``, ``objective``, ``advantages`` or a loss module loads no torch.
"""

from swarmrl.utils.lazy import lazy_exports

_EXPORTS = {
    "Loss": "swarmrl.rl.losses.base", "ClipCounts": "swarmrl.rl.losses.base",
    "get_loss": "swarmrl.rl.losses.registry", "loss_names": "swarmrl.rl.losses.registry",
    "UnknownLoss": "swarmrl.rl.losses.registry",
    "Objective": "swarmrl.rl.losses.objective", "group_advantages": "swarmrl.rl.losses.advantages",
    "policy_loss": "swarmrl.rl.losses.policy", "TokenLoss": "swarmrl.rl.losses.policy",
    "token_weights": "swarmrl.rl.losses.weights", "importance_weight": "swarmrl.rl.losses.importance",
}
__all__ = list(_EXPORTS)
__getattr__ = lazy_exports(_EXPORTS)  # lazy: policy, weights, importance and stats import torch
