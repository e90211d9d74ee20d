"""The token limit's three meanings, one name and one default each (``swarmrl.inference.params.TokenLimits``), and
the sections that sample carrying them as they are declared there."""

from __future__ import annotations

from swarmrl.eval.config import EvalConfig
from swarmrl.filtering.offline import FilterConfig
from swarmrl.inference.openai_server import ChatLimits
from swarmrl.inference.params import SamplingParams, TokenLimits
from swarmrl.rl.config import EvalSection, RLConfig
from swarmrl.toploc.calibrate import CalibrateConfig

NAMES = ("max_new_tokens", "max_trajectory_tokens", "max_turn_tokens")


def _limits(x) -> tuple[int, int, int]:  # noqa: ANN001
    return tuple(getattr(x, k) for k in NAMES)  # type: ignore[return-value]


def test_each_limit_follows_the_one_before_unless_set():
    assert tuple(TokenLimits.model_fields) == NAMES
    assert _limits(TokenLimits()) == (8, 8, 8)
    assert _limits(TokenLimits(max_new_tokens=6)) == (6, 6, 6)  # a config from before the names: as it sampled
    assert _limits(TokenLimits(max_trajectory_tokens=80)) == (8, 80, 80)
    assert _limits(TokenLimits(max_trajectory_tokens=80, max_turn_tokens=20)) == (8, 80, 20)
    assert _limits(TokenLimits(max_turn_tokens=5)) == (8, 8, 5)
    assert TokenLimits(max_new_tokens=6, max_trajectory_tokens=80).row_limit(multiturn=False) == 6
    assert TokenLimits(max_new_tokens=6, max_trajectory_tokens=80).row_limit(multiturn=True) == 80


def test_the_sections_that_sample_carry_the_declared_limits_and_nothing_redeclares_them():
    for section in (SamplingParams, EvalSection, EvalConfig):
        assert issubclass(section, TokenLimits) and _limits(section()) == _limits(TokenLimits())
    rl = RLConfig()
    assert _limits(rl.contract.sampling) == _limits(rl.eval) == _limits(TokenLimits())
    assert _limits(FilterConfig().sampling) == _limits(TokenLimits())
    assert ChatLimits().max_turn_tokens == TokenLimits().max_turn_tokens
    greedy = SamplingParams.greedy(EvalConfig(max_new_tokens=5, max_trajectory_tokens=50))
    assert greedy.temperature == 0.0 and _limits(greedy) == (5, 50, 50)


def test_calibration_samples_three_proof_chunks_by_default():
    assert CalibrateConfig().max_new_tokens == 96
    assert CalibrateConfig(proof={"chunk": 16, "k": 8}).max_new_tokens == 48
    assert CalibrateConfig(max_new_tokens=34).max_new_tokens == 34


def test_setting_a_limit_later_moves_the_ones_that_follow_it():
    t = TokenLimits()
    t.max_new_tokens = 6
    assert _limits(t) == (6, 6, 6)
    t = TokenLimits(max_trajectory_tokens=80)
    t.max_new_tokens = 6
    assert _limits(t) == (6, 80, 80)


def test_a_turn_longer_than_its_trajectory_is_refused():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="max_turn_tokens \\(120\\) is over max_trajectory_tokens \\(8\\)"):
        SamplingParams(max_turn_tokens=120)
    assert _limits(SamplingParams(max_trajectory_tokens=400, max_turn_tokens=120)) == (8, 400, 120)
