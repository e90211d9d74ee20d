"""``overlap_steps = "auto"``'s arithmetic (swarmrl.diloco.overlap): when it overlaps, by how much, and the
hivemind bound; the worker's use of it is in tests/test_diloco_dist.py and tests/test_diloco_hivemind.py."""

import math

from swarmrl.diloco.config import DilocoConfig, HivemindConfig
from swarmrl.diloco.overlap import MARGIN, AutoOverlap, choose_tau


def test_blocks_while_the_averaging_is_a_small_share_of_a_round():
    # 50 steps of 80 ms = 4 s a round; 5% of it is 0.2 s
    assert choose_tau(0.012, 0.08, 50, 0.05) == 0  # the datacenter probe
    assert choose_tau(0.2, 0.08, 50, 0.05) == 0  # exactly the share: still blocking
    assert choose_tau(0.21, 0.08, 50, 0.05) == 4  # ceil(1.25 * 0.21 / 0.08) = ceil(3.28)


def test_covers_the_averaging_with_a_margin_at_most_h_and_at_least_the_floor():
    assert choose_tau(0.86, 0.0757, 50, 0.05) == 15  # wan100's probe: ceil(14.2)
    assert choose_tau(2.95, 0.0676, 50, 0.05) == 50  # wan20lossy: 55 steps wanted, one round at most
    assert choose_tau(0.86, 0.0757, 50, 0.05, floor=50) == 50
    assert choose_tau(1.0, 0.1, 50, 0.05) == 13 == math.ceil(MARGIN * 10)


def test_hivemind_overlaps_by_h_from_the_matchmaking_bound_alone_else_times_round_one():
    cfg = DilocoConfig(backend="hivemind", hivemind=HivemindConfig(matchmaking_time=2.0))
    auto = AutoOverlap(cfg)
    assert auto.known_before_round_one(0.08)  # 2 s > 5% of 4 s
    assert auto.decide(0.08) == cfg.inner_steps and auto.decision["own_choice"] == cfg.inner_steps
    fast = AutoOverlap(cfg)
    assert not fast.known_before_round_one(10.0)  # rounds of 500 s: 2 s of matchmaking is no reason; time round 1
    fast.comm_s = 3.0
    assert fast.decide(10.0) == 0


def test_torch_takes_the_groups_choice():
    auto = AutoOverlap(DilocoConfig(inner_steps=50))  # share = 1 s over 50 steps of 0.1 s
    auto.comm_s = 1.0
    assert auto.known_before_round_one(0.1)  # probed at set-up
    assert auto.decide(0.1, agree=lambda mine: max(mine, 20)) == 20
    assert auto.decision == {"overlap_steps": 20, "own_choice": 13, "round_steps": 50, "comm_s": 1.0,
                             "inner_step_s": 0.1, "share": 0.2}


def test_torch_lengthens_the_rounds_when_one_averaging_outlasts_h_steps_and_hivemind_does_not():
    # wan20lossy at H = 32: one int8 all-reduce took 3.5 s, a round of 32 steps of 63 ms 2 s. Capped at H, the
    # overlap could not cover it and the workers waited (76% utilization); the rounds now last the steps that cover it
    assert choose_tau(3.5, 0.063, 32, 0.05) == 32
    assert choose_tau(3.5, 0.063, 32, 0.05, stretch=True) == 70 == math.ceil(MARGIN * 3.5 / 0.063)
    assert choose_tau(0.012, 0.063, 32, 0.05, stretch=True) == 0  # a cheap averaging still blocks, rounds of H
    auto = AutoOverlap(DilocoConfig(inner_steps=32))
    auto.comm_s = 3.5
    assert auto.decide(0.063, agree=lambda mine: max(mine, 75)) == 75 and auto.round_steps == 75  # the group's
    covered = AutoOverlap(DilocoConfig(inner_steps=32))
    covered.comm_s = 1.0
    assert covered.decide(0.063) == 20 and covered.round_steps == 32  # covered within H: rounds stay H
    hm = AutoOverlap(DilocoConfig(inner_steps=32, backend="hivemind"))
    hm.comm_s = 3.5
    assert hm.decide(0.063) == 32 and hm.round_steps == 32
