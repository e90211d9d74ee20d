"""``WeightsRule``: what a policy version is on the wire, the same for every role.

- ``dtype``: the precision of the published inference weights of version N, cast once by the trainer from its
  float32 master weights. Nodes sample with exactly those, the validator and TOPLOC check against exactly those;
  the trainer keeps its master weights (and computes its logprobs with them), and the difference between the two is
  what the off-policy correction already weighs (``mismatch_kl`` in the trainer's metrics).
- ``encoding``: how versions travel through SHARDCAST: ``"full"``, every version the whole weights file; ``"delta"``,
  version N as the elements that changed since version N-1 (``swarmrl.shardcast.delta``), with a whole keyframe
  every ``keyframe_every`` versions, when a delta would not be smaller, or when the deltas since the last keyframe
  would together cost more than one (so a node joining late never pays more than about two whole versions).
  A LoRA run's versions are its adapters whatever this says.

Pure and torch-free, like the rest of the contract.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarmrl.config import StrictModel


class WeightsRule(StrictModel):
    dtype: Literal["float32", "bfloat16"] = "bfloat16"
    encoding: Literal["full", "delta"] = "delta"
    keyframe_every: int = Field(50, ge=1, le=10_000)

    def versions_to_serve(self, keep: int) -> int:
        """How many versions an origin or relay keeps so that the newest keyframe and every delta after it stay
        served (a node that joins late, or missed versions, catches up from them): at least ``keep``."""
        return max(keep, self.keyframe_every + 1) if self.encoding == "delta" else keep
