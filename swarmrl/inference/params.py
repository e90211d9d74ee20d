"""The sampling settings the backends read (``TokenLimits``, ``SamplingParams``): declared in the run's contract,
``swarmrl.contract.sampling`` (``RLContract.sampling``), and named here too, where the backends and the sections
that sample import them."""

from __future__ import annotations

from swarmrl.contract.sampling import MAX_TEMPERATURE, MAX_TOKENS, SamplingParams, TokenLimits

__all__ = ["TokenLimits", "SamplingParams", "MAX_TOKENS", "MAX_TEMPERATURE"]
