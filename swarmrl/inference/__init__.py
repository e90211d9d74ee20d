"""Inference: batched sampling with KV cache, per-token logprobs and final-norm hidden-state capture."""

from swarmrl.inference.sampler import SampleOutput, SamplingParams, generate

__all__ = ["SampleOutput", "SamplingParams", "generate"]
