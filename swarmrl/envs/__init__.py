"""Tasks and verifiers: registered environments with seedable task sources.

Importing the package registers the built-in environments (``add``, ``mul_add``, ``math``, ``code``,
``filtered``, and the multi-turn tool task ``calc``: ``swarmrl.envs.multiturn``) and reasoning-gym's datasets as
``rg:<dataset>`` (without importing reasoning-gym: that waits for the first ``rg:`` task built), and
installed verifiers environments as ``vf:<env_id>`` (the optional ``verifiers`` extra: ``swarmrl.envs.vf``);
``make_env(name, **params)`` builds one.
"""

from swarmrl.envs import arithmetic, calc, code, filtered, math, rg, vf  # noqa: F401  (they register themselves)
from swarmrl.envs.base import Environment, Split, Task, VerifierUnavailable, heldout_bucket
from swarmrl.envs.multiturn import MultiTurnEnvironment
from swarmrl.envs.registry import available_envs, make_env, register_env

__all__ = ["Environment", "MultiTurnEnvironment", "Split", "Task", "VerifierUnavailable", "available_envs", "heldout_bucket",
           "make_env", "register_env"]
