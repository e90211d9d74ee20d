"""``vf:<env_id>`` tasks: verifiers environments (the optional ``verifiers`` extra), loaded by name from an installed
package. This module only registers the prefix; ``swarmrl.envs.vf_env`` (which imports verifiers, seconds) is
imported when a ``vf:`` task is built. Without the extra, building one raises ``VerifiersMissing``, naming it."""

from __future__ import annotations

import importlib.util
from typing import Any

from swarmrl.envs.base import Environment
from swarmrl.envs.registry import register_prefix

PREFIX = "vf:"
VF_VERSION = "0.4.0"  # the pinned verifiers (pyproject.toml's `verifiers` extra): its v1 API is what is used
TASK_TYPE = "verifiers"  # our tasks of a vf: environment; meta holds their chat messages and tool declarations
# verify(task, text): a text starting with this is an episode's conversation after the task's messages (JSON), as
# the worker and the validator's replay pass it; any other text is a single reply
CONVERSATION = "\x00vf-conversation\x00"
INSTALL_HINT = "pip install 'swarmrl[verifiers]' (or scripts/setup-verifiers.sh: an environment of its own)"


def is_verifiers_env(env: object) -> bool:
    return isinstance(getattr(env, "name", None), str) and env.name.startswith(PREFIX) and \
        getattr(env, "task_type", None) == TASK_TYPE


class VerifiersMissing(ImportError):
    """A ``vf:`` task was asked for where verifiers is not installed."""


def verifiers_installed() -> bool:
    return importlib.util.find_spec("verifiers") is not None


def _factory(env_id: str, **params: Any) -> Environment:
    if not verifiers_installed():
        raise VerifiersMissing(f"task {PREFIX}{env_id} needs the optional `verifiers` extra: {INSTALL_HINT}")
    from swarmrl.envs.vf_env import VerifiersEnv  # noqa: PLC0415  # lazy: verifiers is optional and slow to import

    return VerifiersEnv(env_id, **params)


register_prefix(PREFIX, _factory)
