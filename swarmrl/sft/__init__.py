"""Supervised warm start on a task's demonstrations."""

from swarmrl.sft.train import SFTConfig, run_sft

__all__ = ["SFTConfig", "run_sft"]
