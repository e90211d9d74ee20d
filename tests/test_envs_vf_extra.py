"""The ``verifiers`` extra stays optional: the default install does not pull it, ``vf:<env_id>`` tasks are known by
their prefix, and asking for one without verifiers installed names the extra (tests/test_envs_vf.py runs them where
it is installed)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from swarmrl.envs import make_env
from swarmrl.envs.registry import register_prefix
from swarmrl.envs.vf import VF_VERSION, VerifiersMissing, verifiers_installed

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in reqs}


def test_verifiers_is_an_extra_pinned_and_not_a_default_dependency():
    assert "verifiers" not in _names(PYPROJECT["dependencies"])
    assert PYPROJECT["optional-dependencies"]["verifiers"] == [f"verifiers=={VF_VERSION}"]


@pytest.mark.skipif(verifiers_installed(), reason="verifiers is installed here")
def test_a_vf_task_without_the_extra_names_it():
    with pytest.raises(VerifiersMissing, match=r"swarmrl\[verifiers\]"):
        make_env("vf:some_env")


def test_the_prefix_is_registered_once_and_a_bare_prefix_is_unknown():
    with pytest.raises(ValueError, match="registered twice"):
        register_prefix("vf:", lambda name: None)
    with pytest.raises(KeyError, match="unknown task"):
        make_env("vf:")
