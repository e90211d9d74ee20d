"""Config of `swarmrl toploc verify`, kept out of swarmrl/cli/toploc.py: its threshold fields come from
torch-importing modules, and `swarmrl --help` must not import torch."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config import StrictModel
from swarmrl.contract.params import ProofGeometry
from swarmrl.toploc.sampling_check import SamplingThresholds
from swarmrl.toploc.verify import Thresholds


class VerifyFileConfig(StrictModel):
    model: str = ""
    rollouts: str = ""
    dtype: str = "float32"
    proof: ProofGeometry = Field(default_factory=ProofGeometry)  # the run's contract.proof
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int | None = Field(None, ge=1)
    batch_size: int = Field(8, ge=1)
    check_sampling: bool = True
    calibration: bool = True  # use <model>/toploc_thresholds.json; thresholds set here win field by field
    thresholds: Thresholds = Field(default_factory=Thresholds)
    sampling: SamplingThresholds = Field(default_factory=SamplingThresholds)
