"""Real TOPLOC proofs through the validator (runs once ``swarmrl.toploc`` is present): rollouts sampled
by the policy with proofs are accepted; rollouts from another model are rejected and slashed."""

from __future__ import annotations

import pytest

pytest.importorskip("swarmrl.toploc.rollout", reason="swarmrl.toploc not installed in this tree")

import torch  # noqa: E402
from protocol_support import make_cfg, running  # noqa: E402

from swarmrl.contract import Rollout  # noqa: E402
from swarmrl.envs import make_env  # noqa: E402
from swarmrl.inference.prompts import decode_completion  # noqa: E402
from swarmrl.inference.sampler import generate  # noqa: E402
from swarmrl.models import ModelInitConfig, init_model, load_tokenizer  # noqa: E402
from swarmrl.protocol.client import NodeClient, ValidatorClient  # noqa: E402
from swarmrl.protocol.config import ValidatorConfig  # noqa: E402
from swarmrl.protocol.signing import generate_key  # noqa: E402
from swarmrl.protocol.validator import Validator  # noqa: E402
from swarmrl.rollouts.wire import write_rollouts  # noqa: E402
from swarmrl.toploc import build_proofs  # noqa: E402

torch.set_num_threads(1)


def _rollouts(model, tok, node_id, a, seed):  # noqa: ANN001
    env = make_env(a.contract.task.name, **a.contract.task.params)
    tasks = env.sample(a.seed, len(a.tasks))
    from swarmrl.contract import completion_length, format_prompt

    # stated under the assigned thinking budget, as an honest node does (the validator re-derives the prompt)
    shown = [format_prompt(t.prompt, a.budget()) if a.target_length is not None
             else t.prompt for t in tasks]
    prompts = [tok.encode(p, add_special_tokens=False) for p in shown for _ in range(a.contract.group_size)]
    out = generate(model, prompts, a.contract.sampling, tok.eos_token_id,
                   tok.pad_token_id, capture_hidden=True, generator=torch.Generator().manual_seed(seed))
    rows = []
    for i, (p, c, lp, fin, h) in enumerate(zip(out.prompt_ids, out.completion_ids, out.logprobs, out.finished,
                                               out.hidden)):
        t = tasks[i // a.contract.group_size]
        r = float(env.verify(t, decode_completion(tok, c)))
        pen = 0.0 if a.target_length is None else a.contract.budget.penalty * abs(a.target_length - completion_length(c, fin))
        rows.append(Rollout(worker_id=node_id, step=a.step, policy_version=a.policy_version, task_id=t.task_id,
                            env=a.contract.task.name, group_id=f"g{i // a.contract.group_size}", prompt_ids=p, completion_ids=c, logprobs=lp,
                            reward=r - pen, task_reward=r, length_penalty=pen, target_length=a.target_length,
                            temperature=1.0, finished=fin, seed=a.seed, proofs=build_proofs(h)))
    return rows


@pytest.mark.slow
def test_real_toploc_proofs(tmp_path):
    init_model(ModelInitConfig(seed=0), tmp_path / "policy")
    impostor, _ = init_model(ModelInitConfig(seed=123))
    tok = load_tokenizer(tmp_path / "policy")
    from swarmrl.models import load_model

    policy = load_model(tmp_path / "policy")
    cfg, keys = make_cfg(tmp_path, tasks_per_node=2, contract={"group_size": 2, "sampling": {"max_new_tokens": 12}})
    with running(cfg, run_sweeper=False) as srv:
        # logprob_rows=0: this test is about TOPLOC and the sampling check catching cheats on their own
        val = Validator(ValidatorConfig(run_secret="test-secret", work_dir=str(tmp_path / "v"), logprob_rows=0,
                                        model_dir=str(tmp_path / "policy")),
                        client=ValidatorClient(srv.url, keys["validator"]))
        honest, cheat, liar = (NodeClient(srv.url, generate_key()) for _ in range(3))
        for n in (honest, cheat, liar):
            n.register(throughput=10.0, stake=100.0)
        ah, ac, al = (n.heartbeat().assignments[0] for n in (honest, cheat, liar))
        honest.submit(ah.assignment_id, write_rollouts(_rollouts(policy, tok, honest.node_id, ah, 1),
                                                       tmp_path / "h.parquet"))
        cheat.submit(ac.assignment_id, write_rollouts(_rollouts(impostor, tok, cheat.node_id, ac, 2),
                                                      tmp_path / "c.parquet"))
        lied = _rollouts(policy, tok, liar.node_id, al, 3)
        for r in lied:  # right model and proofs, but claims every token was near-certain
            r.logprobs = [-0.001] * len(r.logprobs)
        liar.submit(al.assignment_id, write_rollouts(lied, tmp_path / "l.parquet"))
        verdicts = {sid: v for sid, v in val.run_once()}
        hv, cv, lv = verdicts[1], verdicts[2], verdicts[3]
        assert not lv.accepted and "sampling" in lv.reason, lv.reason
        assert hv.accepted, hv.reason
        skipped = {c.name: c.skipped for c in hv.checks}
        assert skipped["toploc"] is False and skipped["sampling"] is False
        assert not cv.accepted and cv.reason.startswith("toploc:"), cv.reason
        assert cheat.ledger().status == "ejected" and honest.ledger().credits_locked > 0
