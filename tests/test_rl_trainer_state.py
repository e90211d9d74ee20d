"""Policy versions on disk: only the newest keeps the trainer's state (trainer_state/, the optimizer's is twice the
weights with AdamW), every version carries the base model's TOPLOC calibration file, and a trainer resumes from the
newest with its float32 master weights (the published weights are their bfloat16 cast), optimizer, schedule, RNG and
counters as they were."""

from __future__ import annotations

import shutil

import torch
from attacks._honest import row

from swarmrl.contract import RLContract, Rollout
from swarmrl.envs.config import TaskConfig
from swarmrl.rl.config import EvalSection, RLConfig
from swarmrl.rundir.policy_versions import PolicyDir
from swarmrl.toploc.thresholds_file import CALIBRATION_FILE

torch.set_num_threads(1)


def _group(step: int) -> list[Rollout]:
    return [row(step=step, policy_version=step, reward=r, prompt_ids=[5, 6, 7], completion_ids=c, logprobs=[-1.0, -1.0],
                group_id=f"g{step}") for r, c in ((1.0, [8, 9]), (0.0, [9, 8]))]


def _trainer(tmp_path, model, steps: int, monkeypatch):
    from swarmrl.rl.trainer import Batch, Trainer  # noqa: PLC0415  # lazy: torch-heavy, only these tests

    cfg = RLConfig(run_dir=str(tmp_path / "run"), model=str(model), contract=RLContract(task=TaskConfig(name="add"), async_level=0, group_size=2, filter_ties=False), steps=steps,
                   keep_versions=10, prompts_per_step=1,
                   eval=EvalSection(every_steps=0, n=2, max_new_tokens=2))
    t = Trainer(cfg)
    monkeypatch.setattr(t, "collect_batch", lambda step, deadline: Batch([_group(step)], [f"f{step}"], 0.0))
    return t


def _with_state(run_dir) -> list[str]:
    return sorted(p.parent.name for p in (run_dir / "policy").glob("v*/trainer_state"))


def test_only_the_newest_version_keeps_the_optimizer_state_and_resume_works(tmp_path, tiny_model_dir, monkeypatch):
    model = tmp_path / "base"
    shutil.copytree(tiny_model_dir, model)
    (model / CALIBRATION_FILE).write_text('{"stands": "in"}')  # copied as it is; the validator checks it
    t = _trainer(tmp_path, model, 3, monkeypatch)
    assert t.run_loop() == 3
    run = tmp_path / "run"
    versions = sorted(p.name for p in (run / "policy").glob("v*"))
    assert versions == [f"v{v:06d}" for v in range(4)]
    assert _with_state(run) == ["v000003"]  # older versions keep their weights only
    assert all((run / "policy" / v / "model.safetensors").is_file() for v in versions)
    assert all((run / "policy" / v / CALIBRATION_FILE).read_text() == '{"stands": "in"}' for v in versions)
    adam = t.opt.state_dict()["state"]
    # published: the bfloat16 cast (contract.weights.dtype); kept for the trainer: its float32 masters, newest only
    assert sorted(p.parent.name for p in (run / "policy").glob("v*/master")) == ["v000003"]
    masters = {k: v.detach().clone() for k, v in t.model.state_dict().items()}

    resumed = _trainer(tmp_path, model, 4, monkeypatch)  # a restart: the newest version's state is loaded
    assert resumed.resumed and resumed.step == 3
    got = resumed.model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in masters.items())  # the masters, not their cast
    assert any(not torch.equal(v.to(torch.bfloat16).float(), v) for v in masters.values())
    back = resumed.opt.state_dict()["state"]
    assert back.keys() == adam.keys() and all(torch.equal(back[k]["exp_avg"], adam[k]["exp_avg"]) for k in adam)
    assert resumed.run_loop() == 4
    assert _with_state(run) == ["v000004"]


def test_drop_older_states_never_leaves_none(tmp_path):
    pd = PolicyDir(tmp_path)

    def state(v: int) -> None:
        (pd.version_dir(v) / "trainer_state").mkdir(parents=True, exist_ok=True)
        (pd.version_dir(v) / "trainer_state" / "meta.json").write_text("{}")

    for v in range(3):
        d = pd.staging_dir(v)
        (d / "trainer_state").mkdir()
        pd.commit_version(v, d)
    pd.version_dir(3).mkdir()  # renamed into place but LATEST not moved yet (a crash in between): untouched
    state(3)
    assert pd.drop_older_states() == 2
    assert [p.parent.name for p in sorted(tmp_path.glob("v*/trainer_state"))] == ["v000002", "v000003"]
    shutil.rmtree(pd.version_dir(2) / "trainer_state")  # LATEST without a state (an older trainer): keep the rest
    state(1)
    assert pd.drop_older_states() == 0 and (pd.version_dir(1) / "trainer_state").is_dir()
    (pd.version_dir(2) / "trainer_state.pt").write_bytes(b"s")  # a file of that name goes the same way
    (pd.version_dir(1) / "trainer_state.pt").write_bytes(b"s")
    assert pd.drop_older_states("trainer_state.pt") == 1 and not (pd.version_dir(1) / "trainer_state.pt").exists()
