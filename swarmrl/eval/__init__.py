"""Held-out evaluation: greedy, batched, KV cache."""

from swarmrl.eval.evaluate import EvalConfig, evaluate, evaluate_path

__all__ = ["EvalConfig", "evaluate", "evaluate_path"]
