"""Tasks and verifiers: registered environments with seedable task sources."""

from swarmrl.envs.base import Environment, Task, available_envs, heldout_bucket, make_env, register_env

__all__ = ["Environment", "Task", "available_envs", "heldout_bucket", "make_env", "register_env"]
