"""The contract's rules, and that the roles that share them agree (worker/node scoring vs the validator)."""

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmrl.contract import (
    AsyncWindow,
    Budget,
    BudgetRule,
    GroupRule,
    RLContract,
    Rollout,
    RowOrigin,
    Samples,
    assigned_tasks,
    is_informative,
    score_groups,
)
from swarmrl.envs import make_env
from swarmrl.envs.config import TaskConfig
from swarmrl.inference.prompts import decode_completion, encode_prompt
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.schemas import AssignmentSpec, PendingSubmission, SubmissionInfo, TaskSpec
from swarmrl.protocol.validator import CheckContext, check_rewards, check_tasks

EOS = 12


class CharTokenizer:
    """Digits are ids 0-9, '+' 10, '=' 11, EOS 12: enough to spell arithmetic answers."""

    eos_token_id = EOS
    pad_token_id = EOS
    chat_template = None
    _chars = "0123456789+="

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self._chars[i] for i in ids if i != EOS)

    def encode(self, text, add_special_tokens=False):
        return [self._chars.index(c) for c in text]


def _pending(a: AssignmentSpec, rows: list[Rollout]) -> PendingSubmission:
    sub = SubmissionInfo(submission_id=1, node_id="n" * 16, assignment_id=a.assignment_id, step=a.step,
                         sha256="0" * 64, size=1, n_rows=len(rows), status="pending", created_at=0.0)
    return PendingSubmission(submission=sub, assignment=a, origin_node_id="n" * 16, current_step=a.step,
                             current_policy_version=a.step)


completion = st.lists(st.integers(0, 11), min_size=0, max_size=6).flatmap(
    lambda ids: st.sampled_from([ids + [EOS], ids]) if ids else st.just([EOS]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**40), n_tasks=st.integers(1, 3), group=st.integers(2, 4),
       target=st.one_of(st.none(), st.integers(1, 8)), penalty=st.floats(0, 0.5),
       data=st.data())
def test_node_and_validator_score_alike(seed, n_tasks, group, target, penalty, data):
    """Whatever the sampler produced, the rows a node builds pass the validator's reward check, and a row whose
    claimed reward, task reward or length penalty moves by more than the tolerance fails it."""
    tok = CharTokenizer()
    tasks = assigned_tasks("add", {"digits": 1}, seed, n_tasks)
    budget = BudgetRule(enabled=target is not None, prompt_format="{prompt}[{target}]", penalty=penalty)
    a = AssignmentSpec(assignment_id=1, step=3, policy_version=3, seed=seed,
                       contract=RLContract(task=TaskConfig(name="add", params={"digits": 1}), group_size=group,
                                           budget=budget),
                       target_length=target, tasks=[TaskSpec(task_id=t.task_id, prompt=t.prompt) for t in tasks])
    # the sampler's output: some completions are the right answer, the rest random
    comps = []
    for t in tasks:
        for _ in range(group):
            if data.draw(st.booleans()):
                comps.append(tok.encode(t.demonstration) + [EOS])
            else:
                comps.append(data.draw(completion))
    prompts = [encode_prompt(tok, t.prompt) for t in tasks for _ in range(group)]
    samples = Samples(prompts, comps, [[-1.0] * len(c) for c in comps], [bool(c) and c[-1] == EOS for c in comps])
    batch = score_groups(env=make_env("add", digits=1), tasks=tasks, budgets=[a.budget()] * n_tasks, group_size=group,
                         samples=samples, decode=lambda ids: decode_completion(tok, ids),
                         origin=RowOrigin("n" * 16, step=3, policy_version=3, seed=seed, temperature=1.0))
    cfg = ValidatorConfig()
    ok, reason = check_rewards(CheckContext(rows=batch.rows, item=_pending(a, batch.rows), cfg=cfg, tokenizer=tok))
    assert ok, reason
    # tampering with any claimed number is caught
    i = data.draw(st.integers(0, len(batch.rows) - 1))
    field = data.draw(st.sampled_from(["reward", "task_reward", "length_penalty"]))
    bad = [Rollout(**{**r.__dict__}) for r in batch.rows]
    setattr(bad[i], field, getattr(bad[i], field) + 0.5)
    ok, reason = check_rewards(CheckContext(rows=bad, item=_pending(a, bad), cfg=cfg, tokenizer=tok))
    assert not ok and reason.startswith(f"row {i}:"), reason
    # and so is a finished flag that does not match the tokens, once a budget makes it count
    if target is not None:
        flipped = [Rollout(**{**r.__dict__}) for r in batch.rows]
        flipped[i].finished = not flipped[i].finished
        ok, _ = check_rewards(CheckContext(rows=flipped, item=_pending(a, flipped), cfg=cfg, tokenizer=tok))
        assert not ok


def test_validator_states_prompts_as_the_assignment_says(tiny_model_dir):
    """Drift fixed: the validator used the chat template whenever the tokenizer had one, while nodes follow the
    run's ``chat_template`` flag, so an honest node of a chat model run without the template was rejected."""
    from swarmrl.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"
    tasks = assigned_tasks("add", {"digits": 2}, 7, 2)
    for chat in (False, True):
        a = AssignmentSpec(assignment_id=1, step=0, policy_version=0, seed=7, contract=RLContract(task=TaskConfig(name="add", params={"digits": 2}), group_size=2, chat_template=chat),
                           target_length=None,
                           tasks=[TaskSpec(task_id=t.task_id, prompt=t.prompt) for t in tasks])
        rows = [Rollout(worker_id="n", step=0, policy_version=0, task_id=t.task_id, env="add", group_id=f"g{i}",
                        prompt_ids=encode_prompt(tok, t.prompt, chat), completion_ids=[1], logprobs=[-1.0],
                        reward=0.0, task_reward=0.0, length_penalty=0.0, target_length=None,
                        temperature=1.0, finished=False, seed=7) for i, t in enumerate(tasks) for _ in range(2)]
        ok, reason = check_tasks(CheckContext(rows=rows, item=_pending(a, rows), cfg=ValidatorConfig(), tokenizer=tok))
        assert ok, (chat, reason)
        other = [Rollout(**{**r.__dict__, "prompt_ids": encode_prompt(tok, tasks[0].prompt, not chat)}) for r in rows]
        ok, _ = check_tasks(CheckContext(rows=other, item=_pending(a, other), cfg=ValidatorConfig(), tokenizer=tok))
        assert not ok


@given(k=st.integers(0, 5), version=st.integers(0, 50), ahead=st.integers(0, 8), last=st.integers(-1, 60),
       lookahead=st.one_of(st.none(), st.integers(0, 5)))
def test_window_steps_a_version_serves_are_inside_the_window(k, version, ahead, last, lookahead):
    """A holder of ``version`` (never newer than the trainer's step) only generates for steps whose training
    window contains its version: what the worker and orchestrator hand out, the trainer and validator accept."""
    w = AsyncWindow(k, last_step=last)
    current = version + ahead
    steps = list(w.steps_for_version(version, current, lookahead))
    for m in steps:
        assert w.serves(version, m) and version in w.versions_for_step(m)
        assert current <= m and (last < 0 or m <= last)
    hi = min(version + k, current + lookahead if lookahead is not None else version + k,
             last if last >= 0 else version + k)
    assert steps == list(range(current, hi + 1))
    assert [v for v in range(0, 60) if w.serves(v, current)] == list(w.versions_for_step(current))
    assert w.is_late(current, current + k + 1) and not w.is_late(current, current + k)
    assert list(w.open_steps(current)) == list(w.steps_for_version(current, current))


def test_window_rejects_negative_level():
    with pytest.raises(ValueError):
        AsyncWindow(-1)


def _row(worker, group, reward, step=5, version=5):
    return Rollout(worker_id=worker, step=step, policy_version=version, task_id="t", env="add", group_id=group,
                   prompt_ids=[1], completion_ids=[1], logprobs=[-1.0], reward=reward, task_reward=reward,
                   length_penalty=0.0, target_length=None, temperature=1.0, finished=True, seed=0)


@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("xyz"), st.sampled_from([0.0, 1.0])), max_size=40),
       st.booleans())
def test_group_rule_counts_what_the_trainer_selects(items, filter_ties):
    """What a worker announces (count_usable) is what the trainer then finds usable in that file (select)."""
    rule = GroupRule(group_size=3, filter_ties=filter_ties)
    rows = [_row(w, g, r) for w, g, r in items]
    usable, stats = rule.select([("f", rows)], 5, AsyncWindow(2))
    assert rule.count_usable(rows) == len(usable) == stats["usable_groups"]
    for g in usable:
        assert len(g) == 3 and (not filter_ties or is_informative([r.reward for r in g]))


def test_group_rule_drops_stale_and_wrong_step_rows():
    rule = GroupRule(group_size=2)
    rows = [_row("a", "g", 0.0, version=2), _row("a", "g", 1.0, version=2),  # 5 - 2 = 3 > 2: stale
            _row("a", "h", 0.0, step=4), _row("a", "h", 1.0, step=4),
            _row("a", "i", 0.0, version=3), _row("a", "i", 1.0, version=3)]
    usable, stats = rule.select([("f", rows)], 5, AsyncWindow(2))
    assert [g[0].group_id for g in usable] == ["i"] and stats["stale_rows"] == 2 and stats["wrong_step_rows"] == 2


def test_score_groups_refuses_mismatched_output():
    with pytest.raises(ValueError, match="completions"):
        score_groups(env=None, tasks=[object()], budgets=[None], group_size=2,
                     samples=Samples(prompt_ids=[[1]], completion_ids=[[1]], logprobs=[[-1.0]], finished=[True]),
                     decode=str, origin=RowOrigin("w", step=0, policy_version=0, seed=0, temperature=1.0))


def test_budget_is_one_definition():
    b = Budget(target=4, penalty=0.5, prompt_format="[{target}]{prompt}")
    a = AssignmentSpec(assignment_id=1, step=0, policy_version=0, seed=0, contract=RLContract(task=TaskConfig(name="add", params={}), group_size=2, budget=BudgetRule(prompt_format="[{target}]{prompt}", penalty=0.5)),
                       target_length=4, tasks=[])
    assert a.budget() == b
    assert AssignmentSpec(**{**a.model_dump(), "target_length": None}).budget() is None


def test_contract_imports_no_heavy_library():
    code = ("import sys, swarmrl.contract; heavy = [m for m in ('torch', 'pyarrow', 'transformers', 'fastapi', "
            "'sqlalchemy', 'aiohttp') if m in sys.modules]; print(heavy); sys.exit(1 if heavy else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_group_rule_puts_fresh_carried_groups_first_and_drops_stale_ones():
    """carry_surplus: an earlier step's extra usable groups train this step while the window serves their version."""
    rule = GroupRule(group_size=2)
    fresh = [_row("c", "old", 0.0, step=4, version=3), _row("c", "old", 1.0, step=4, version=3)]
    stale = [_row("c", "older", 0.0, step=4, version=2), _row("c", "older", 1.0, step=4, version=2)]  # 6 - 2 > 3
    rows = [_row("a", "i", 0.0, step=6, version=5), _row("a", "i", 1.0, step=6, version=5)]
    usable, stats = rule.select([("f", rows)], 6, AsyncWindow(3), carried=[stale, fresh])
    assert [g[0].group_id for g in usable] == ["old", "i"]
    assert stats["carried_groups"] == 1 and stats["stale_carried"] == 1 and stats["usable_groups"] == 2
    usable, stats = rule.select([("f", rows)], 6, AsyncWindow(3))
    assert [g[0].group_id for g in usable] == ["i"] and stats["carried_groups"] == 0
