"""Asynchronous GRPO: rollouts, advantages, filtering, loss, trainer and inference workers."""
