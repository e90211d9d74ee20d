"""The hostile DiLoCo workers of ``swarmrl.attacks.diloco``: what each uploads in place of its pseudo-gradient."""

from __future__ import annotations

import pytest
import torch

from swarmrl.attacks.diloco import DILOCO_ADVERSARIES, make_diloco_adversary
from swarmrl.diloco.config import ADVERSARIES


def _pg(seed: int = 0, n: int = 1000) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def test_every_configurable_adversary_exists() -> None:
    assert set(DILOCO_ADVERSARIES) == set(ADVERSARIES) - {"none"}
    with pytest.raises(ValueError, match="unknown"):
        make_diloco_adversary("nonsense", 0)


def test_sign_flip_and_scale() -> None:
    pg = _pg()
    assert torch.equal(make_diloco_adversary("sign_flip", 3).upload(0, pg), -pg)
    assert torch.allclose(make_diloco_adversary("scale", 3, scale=100.0).upload(5, pg), 100.0 * pg)


def test_random_has_the_honest_norm_but_not_its_direction() -> None:
    pg = _pg()
    adv = make_diloco_adversary("random", 3, seed=1)
    a, b = adv.upload(0, pg), adv.upload(1, pg)
    assert float(a.norm()) == pytest.approx(float(pg.norm()), rel=1e-5)
    assert abs(float(torch.nn.functional.cosine_similarity(a, pg, dim=0))) < 0.2
    assert not torch.equal(a, b)  # fresh noise each round
    assert torch.equal(a, make_diloco_adversary("random", 3, seed=1).upload(0, pg))  # seeded
    assert not torch.equal(a, make_diloco_adversary("random", 2, seed=1).upload(0, pg))  # per rank


def _q(v: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((10,), v, dtype=torch.int8), torch.ones(1)


def test_stale_resends_its_honest_pseudo_gradient_of_two_rounds_before() -> None:
    adv = make_diloco_adversary("stale", 3)
    for r in range(6):
        got = adv.upload(r, _pg(r))
        if r < 2:
            assert got is None  # honest while it has nothing that old
        else:
            assert got is not None and torch.equal(got, _pg(r - 2))
        adv.sent(r, _q(r))
        adv.published(r, _q(100 + r))


def test_replay_resends_the_previous_published_update() -> None:
    adv = make_diloco_adversary("replay", 3)
    pg = _pg()
    assert adv.upload(0, pg) is None  # honest in round 0
    adv.sent(0, _q(0))
    adv.published(0, _q(100))
    for r in range(1, 4):
        got = adv.upload(r, pg)
        assert got is not None and torch.equal(got[0], _q(100 + r - 1)[0])
        adv.sent(r, got)
        adv.published(r, _q(100 + r))


def test_the_attack_bench_reports_the_judges_margins_from_the_round_log(tmp_path) -> None:
    # benchmarks/diloco/attacks.py prints, per run, the accepted contributions' worst against each rule and the
    # rejected ones' best agreement z (the figures ATTACK_RESULTS.md and the judge's docstring quote)
    import importlib.util
    import json
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "diloco" / "attacks.py"
    spec = importlib.util.spec_from_file_location("diloco_attacks_bench", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)

    def st(node: str, z: float, rise: float) -> dict:
        return {"node_id": node, "agreement": z / 100, "agreement_z": z, "loss_rise": rise, "norm_ratio": 1.0,
                "history_cosine": 0.2}

    rows = [{"round": 0, "accepted": ["a", "b"], "rejected": [{"node_id": "c"}],
             "stats": [st("a", 30.0, 0.01), st("b", 40.0, 0.07), st("c", -2.5, 0.5)]},
            {"round": 1, "accepted": ["a", "b"], "rejected": [],
             "stats": [st("a", 27.0, 0.02), st("b", 35.0, 0.03)]}]
    (tmp_path / "aggregator.rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"round": 2, "acc')
    m = mod._margins(str(tmp_path))
    assert m["accepted_min_agreement_z"] == 27.0 and m["accepted_min_agreement"] == 0.27
    assert m["accepted_max_loss_rise"] == 0.07  # the rejected contribution's 0.5 is not an honest margin
    assert m["rejected_max_agreement_z"] == -2.5 and m["accepted_max_history_cosine"] == 0.2
    empty = mod._margins(str(tmp_path / "nothing"))
    assert set(empty.values()) == {None}
