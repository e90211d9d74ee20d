"""The job: ``derive`` (pure: one RunConfig -> every role's config and command line) and the supervisor."""

import hashlib
import tomllib
from pathlib import Path

import pytest

from swarmrl.config import load_config
from swarmrl.contract import AsyncWindow
from swarmrl.job import RunConfig
from swarmrl.job.derive import Identity, RoleSpec, derive_local, derive_rl, derive_swarm, member_names, relay_roles
from swarmrl.job.supervisor import RoleFailed, Supervisor
from swarmrl.protocol.config import OrchestratorConfig, ValidatorConfig
from swarmrl.rl.config import RLConfig

ROOT = Path("/run/x")


_HEX = {"validator": "a", "trainer": "b", "authority": "d"}


def _id(name: str) -> Identity:
    h = _HEX[name] * 64 if name in _HEX else hashlib.sha256(name.encode()).hexdigest()  # members: one key each
    return Identity(f"/keys/{name}.pem", h, h[:32])


def _swarm(cfg: RunConfig):
    members = {n: _id(n) for n in member_names(cfg)}
    return derive_swarm(cfg, ROOT, 8765, "s3cret", _id("validator"), _id("trainer"), members, _id("authority"))


def test_swarm_plan_ties_every_role_to_the_run_config():
    cfg = load_config(RunConfig, "configs/run.toml", ["swarm.adversaries=[\"forge_rewards\"]", "rl.contract.async_level=3",
                                                      "rl.contract.filter_ties=false", "rl.contract.budget.enabled=true"])
    plan = _swarm(cfg)
    rl, o, v = plan.rl, plan.orchestrator, plan.validator
    # the files the roles read are the configs of the plan, and they load back
    assert RLConfig.model_validate(tomllib.loads(plan.files["rl.toml"])) == rl
    assert OrchestratorConfig.model_validate(tomllib.loads(plan.files["orchestrator.toml"])) == o
    assert ValidatorConfig.model_validate(tomllib.loads(plan.files["validator.toml"])) == v
    # one contract (staleness window, usable-group rule, task, budget, proofs), carried as it is; one secret
    assert o.contract == v.contract == rl.contract and rl.contract.async_level == 3
    assert o.lookahead == 3 and not o.contract.filter_ties and o.contract.budget.enabled
    assert o.last_step == rl.steps - 1 and o.groups_per_step == rl.prompts_per_step
    assert o.run_secret == v.run_secret == "s3cret" and v.orchestrator == plan.url == "http://127.0.0.1:8765"
    assert o.validator_keys == ["a" * 64] and o.trainer_keys == ["b" * 64] and v.key == "/keys/validator.pem"
    # stake is deposited by the run's authority key, one deposit per member, before the nodes register with it
    assert o.stake_authority_keys == ["d" * 64] and not o.self_declared_stake and plan.authority == _id("authority")
    assert plan.deposits == {_id(n).node_id: cfg.swarm.stake for n in member_names(cfg)} and len(plan.deposits) == 3
    assert o.min_stake <= cfg.swarm.stake and f"stake={cfg.swarm.stake}" in plan.role("n0").argv
    # every member may register from the one loopback address; idle work goes back before a node is dead
    assert o.register_burst >= len(plan.members) and 0 < o.idle_after_missed < o.dead_after_missed
    # the validator can still load every version it may have to check
    assert rl.keep_versions >= AsyncWindow(3).versions_to_keep(lag=cfg.swarm.validator_lag)
    assert rl.workers.proofs and v.model_dir_template.startswith(str(ROOT / "policy"))
    # roles: who may be restarted, and the command lines
    names = [r.name for r in plan.roles]
    assert names[:4] == ["orchestrator", "trainer", "adapter", "validator"]
    assert set(names[4:]) == {"n0", "n1", "x0-forge_rewards"}
    trainer = plan.role("trainer")  # restarted after a crash (it resumes), finished when it exits 0
    assert trainer.restart == "always" and trainer.finishes and trainer.max_restarts == cfg.max_trainer_restarts
    assert plan.role("orchestrator").wait_up
    assert plan.rl.shardcast.origin_port == 0  # no port given: the plan does not invent one
    assert plan.role("n0").restart == "unless_refused" and plan.role("x0-forge_rewards").restart == "never"
    assert plan.role("x0-forge_rewards").argv[-4:] == ["--adversary", "forge_rewards", "--set",
                                                       f"oversize_bytes={cfg.swarm.max_upload_bytes + 1}"]
    assert "--adversary" not in plan.role("n0").argv and plan.members["n0"]["adversary"] == ""


def test_local_plan_and_modes_do_not_leak():
    cfg = load_config(RunConfig, "configs/run.toml", ["mode=\"local\"", "rl.workers.num=3", "max_worker_restarts=7"])
    plan = derive_local(cfg, ROOT)
    assert derive_rl(cfg) == cfg.rl  # local mode takes the RL config as it is, but for the origin's fixed port
    assert plan.rl == cfg.rl
    fixed = derive_local(cfg, ROOT, origin_port=4567)
    assert fixed.rl.shardcast.origin_port == 4567 and fixed.rl.model_copy(update={"shardcast": cfg.rl.shardcast}) == cfg.rl
    assert [r.name for r in plan.roles] == ["trainer", "w0", "w1", "w2"]
    assert {r.restart_group for r in plan.roles[1:]} == {"workers"} and plan.roles[1].max_restarts == 7
    assert plan.orchestrator is None and list(plan.files) == ["rl.toml"]
    relays, urls = relay_roles(2, ROOT, "http://127.0.0.1:1", "ab" * 32, [11, 12], restart="never")
    assert urls == ["http://127.0.0.1:11", "http://127.0.0.1:12"] and all(r.restart == "never" for r in relays)
    assert relays[1].argv[relays[1].argv.index("--upstream") + 1] == "http://127.0.0.1:1"


def test_supervisor_restarts_up_to_max_restarts_then_fails(tmp_path):
    """Real processes (``swarmrl tasks`` exits at once): an ``always`` role is restarted until its ``max_restarts``
    are used, a ``never`` role is left alone; a node (``unless_refused``) is not restarted after exit code 3
    (ejected or refused) or a signal from outside, but is after any other exit."""
    sup = Supervisor(tmp_path / "logs", progress=lambda m: None)
    sup.start(RoleSpec("flappy", ["tasks"], restart="always", max_restarts=2))
    sup.start(RoleSpec("once", ["tasks"], restart="never"))

    def settle():
        for p in sup.procs.values():
            p.wait(timeout=60)

    settle()
    sup.check()
    settle()
    sup.check()
    assert sup.restarts == {"flappy": 2}
    settle()
    with pytest.raises(RoleFailed, match="flappy keeps failing"):
        sup.check()
    assert (tmp_path / "logs" / "flappy.log").stat().st_size > 0
    sup.stop_all()
    node = RoleSpec("n0", [], restart="unless_refused")
    assert [sup._may_restart(node, c) for c in (0, 1, 2, 3, -9, -15)] == [True, True, True, False, False, False]


def test_supervisor_restarts_a_crashed_main_role_until_it_finishes(tmp_path):
    """The trainer (``finishes``): restarted after a crash, done once it exits 0."""
    # the first run crashes (a bad flag exits 2), the restart runs `swarmrl tasks`, which exits 0
    sup = Supervisor(tmp_path / "logs", progress=lambda m: None)
    spec = RoleSpec("trainer", ["tasks", "--no-such-flag"], restart="always", finishes=True, max_restarts=1)
    sup.start(spec)
    sup.specs["trainer"] = RoleSpec("trainer", ["tasks"], restart="always", finishes=True, max_restarts=1)
    assert sup.watch("trainer", is_done=lambda: False, interval_s=0.05) == 0
    assert sup.restarts == {"trainer": 1}


def test_the_run_hands_hold_policy_to_its_nodes():
    """Nodes sample with a held policy version while the assigned one downloads unless the run says not to."""
    from swarmrl.swarm.config import SwarmNodeConfig  # noqa: PLC0415  # lazy: only this test needs it

    assert SwarmNodeConfig().hold_policy is True
    for sets, want in (([], "hold_policy=true"), (["swarm.hold_policy=false"], "hold_policy=false")):
        argv = _swarm(load_config(RunConfig, "configs/run.toml", sets)).role("n0").argv
        assert argv[argv.index(want) - 1] == "--set", argv


def test_every_role_computes_with_one_thread_by_default():
    """The roles of a run share the host: one torch thread each unless a config says otherwise."""
    import subprocess  # noqa: PLC0415  # lazy: only this test starts a process
    import sys  # noqa: PLC0415  # lazy: only this test starts a process

    from swarmrl.swarm.adapter import AdapterConfig  # noqa: PLC0415  # lazy: only this test needs it
    from swarmrl.swarm.config import SwarmNodeConfig  # noqa: PLC0415  # lazy: only this test needs it

    rl = RLConfig()
    assert rl.trainer.threads == rl.workers.threads == SwarmNodeConfig().threads == 1
    assert ValidatorConfig().threads == AdapterConfig().threads == 1
    plan = _swarm(load_config(RunConfig, "configs/run.toml", []))
    assert plan.validator.threads == 1 and "threads=1" in plan.role("n0").argv
    assert ValidatorConfig(threads=4).threads == 4  # an explicit value stays
    code = ("import sys, torch; from swarmrl.utils.threads import set_role_threads; n0 = torch.get_num_threads(); "
            "set_role_threads(0); a = torch.get_num_threads(); set_role_threads(1); print(n0 == a, torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "1"]  # 0 leaves the default; 1 sets it
    code = ("import sys; from swarmrl.swarm.adapter import AdapterConfig; from swarmrl.utils.threads import "
            "set_role_threads; set_role_threads(AdapterConfig().threads); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False"]  # the adapter does not load torch to set it


def test_cheat_settings_reach_only_the_cheating_nodes():
    cfg = load_config(RunConfig, "configs/run.toml", ["swarm.adversaries=[\"idle_connections\"]",
                                                      "swarm.adversary_set={idle_round_s=5.0, idle_delay_s=2}"])
    plan = _swarm(cfg)
    argv = plan.role("x0-idle_connections").argv
    assert argv[-4:] == ["--set", "idle_delay_s=2", "--set", "idle_round_s=5.0"]
    assert not any(a.startswith("idle_") for a in plan.role("n0").argv)
    # an honest node's setting (or a typo) is not a cheat setting
    for bad in ("stake=5", "idle_rounds=3"):
        with pytest.raises(ValueError, match="not cheat settings"):
            load_config(RunConfig, "configs/run.toml", [f"swarm.adversary_set={{{bad}}}"])
