"""verifiers environments (``vf:<env_id>``, the optional ``verifiers`` extra): a single-turn and a multi-turn tool
environment written the verifiers v1 way (packages made here, found by name as installed ones are), loaded and
scored offline; their episodes run against our OpenAI-compatible chat endpoint on a real socket; token-in/token-out
across turns on a chat template that re-tokenizes the conversation differently from the sampled ids; the
validator's replay rejecting an edited environment turn and a forged reward; bad requests answered 4xx.

Skipped where verifiers is not installed, unless SWARMRL_REQUIRE_VERIFIERS=1 (CI: scripts/setup-verifiers.sh
makes the environment, .ci/run runs these there), which makes a missing verifiers an error."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys

import pytest
import torch

pytestmark = pytest.mark.verifiers

if importlib.util.find_spec("verifiers") is None:
    if os.environ.get("SWARMRL_REQUIRE_VERIFIERS") == "1":
        raise ImportError("SWARMRL_REQUIRE_VERIFIERS=1 but verifiers is not installed (scripts/setup-verifiers.sh)")
    pytest.skip("verifiers is not installed (the optional `verifiers` extra)", allow_module_level=True)

from swarmrl.envs import make_env  # noqa: E402
from swarmrl.envs.multiturn import segments  # noqa: E402
from swarmrl.envs.vf_env import VerifiersEnv  # noqa: E402
from swarmrl.episodes.vf import replay_problem, rollout  # noqa: E402
from swarmrl.inference.backend import OursBackend  # noqa: E402
from swarmrl.inference.chat_tokens import encode_text, render  # noqa: E402
from swarmrl.inference.openai_server import ChatEndpoint, ChatLimits, ServedEndpoint  # noqa: E402
from swarmrl.models import load_model, load_tokenizer  # noqa: E402
from tests.chat_support import TEMPLATE, ScriptedBackend, byte_ids  # noqa: E402

ECHO = '''
import verifiers.v1 as vf


class EchoData(vf.TaskData):
    answer: str


class EchoTask(vf.Task[EchoData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip() == self.data.answer else 0.0


class EchoConfig(vf.TasksetConfig):
    num_tasks: int = 40


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self) -> list[EchoTask]:
        return [EchoTask(EchoData(prompt=f"Repeat: w{i}", answer=f"w{i}", system_prompt="Be brief."),
                         self.config.task) for i in range(self.config.num_tasks)]


__all__ = ["EchoTaskset"]
'''

CALC = '''
import verifiers.v1 as vf


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class CalcData(vf.TaskData):
    a: int
    b: int


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)]

    @vf.reward(weight=0.8)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply.strip() == str(self.data.a + self.data.b) else 0.0

    @vf.reward(weight=0.2)
    async def used_tool(self, trace: vf.Trace) -> float:
        return 1.0 if trace.tool_messages else 0.0


class CalcConfig(vf.TasksetConfig):
    task: CalcTaskConfig = CalcTaskConfig()
    num_tasks: int = 30


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self) -> list[CalcTask]:
        return [CalcTask(CalcData(prompt=f"What is {i} + {i + 1}? Use the tool.", a=i, b=i + 1), self.config.task)
                for i in range(self.config.num_tasks)]


__all__ = ["CalcTaskset"]
'''

@pytest.fixture(scope="module")
def vf_packages(tmp_path_factory):
    """Two environment packages on sys.path, as `pip install` leaves them (found by verifiers' loader by name)."""
    site = tmp_path_factory.mktemp("site")
    for name, src in (("swarmrl_vf_echo", ECHO), ("swarmrl_vf_calc", CALC)):
        (site / name).mkdir()
        (site / name / "__init__.py").write_text(src)
    sys.path.insert(0, str(site))
    yield site
    sys.path.remove(str(site))


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    t = load_tokenizer(tiny_model_dir)
    t.chat_template = TEMPLATE
    return t


# ---- loading and offline scoring -----------------------------------------------------------------------------
def test_single_turn_environment_loads_by_name_and_scores_offline(vf_packages):
    env = make_env("vf:swarmrl_vf_echo", heldout_pct=25)
    assert isinstance(env, VerifiersEnv) and env.name == "vf:swarmrl_vf_echo" and len(env.tasks) == 40
    tasks = env.sample(0, 5)
    assert [t.task_id for t in tasks] == [t.task_id for t in env.sample(0, 5)]  # seeded
    held = {t.task_id for t in env.heldout_set(10)}
    assert held and not held & {t.task_id for t in env.sample(1, 30)}  # never drawn in training
    t = tasks[0]
    ans = env.vf_task(t).data.answer
    assert t.meta["messages"] == [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": f"Repeat: {ans}"}]
    assert env.verify(t, f" {ans} ") == 1.0 and env.verify(t, "nope") == 0.0
    forged = type(t)(**{**t.__dict__, "verification_info": {"idx": 0, "key": "0" * 64}})
    assert env.verify(forged, ans) == 0.0  # the key is checked: a task file cannot name other data
    assert make_env("vf:swarmrl_vf_echo", taskset={"num_tasks": 3}, heldout_pct=0).sample(0, 3)
    with pytest.raises(ValueError, match="could not be loaded"):
        make_env("vf:no_such_vf_package")


def test_multi_turn_tool_environment_loads_its_tools_and_scores_offline(vf_packages):
    env = make_env("vf:swarmrl_vf_calc")
    t = env.sample(3, 1)[0]
    d = env.vf_task(t).data
    box = env.tools(t)
    assert [x["function"]["name"] for x in box.declarations] == ["calc_add"]
    assert box.declarations[0]["function"]["parameters"]["required"] == ["a", "b"]
    assert asyncio.run(box.call("calc_add", '{"a": 2, "b": 40}')) == "42"
    assert asyncio.run(box.call("calc_add", '{"a": "x"}')).startswith("error:")
    assert asyncio.run(box.call("rm_rf", "{}")).startswith("error:")
    call = {"id": "c0", "type": "function", "function": {"name": "calc_add", "arguments": "{}"}}
    convo = [*env.initial_messages(t), {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "c0", "name": "calc_add", "content": str(d.a + d.b)},
             {"role": "assistant", "content": str(d.a + d.b)}]
    assert env.score_messages(t, convo) == pytest.approx(1.0)
    assert env.score_messages(t, convo[:-1] + [{"role": "assistant", "content": "7777"}]) == pytest.approx(0.2)
    assert env.verify(t, str(d.a + d.b)) == pytest.approx(0.8)  # right, without the tool


# ---- episodes over the endpoint --------------------------------------------------------------------------------
def _calc_turns(tok, a: int, b: int) -> list[list[int]]:
    """Turn 1: a tool call whose text the template renders otherwise (spacing, and "<eos>" written out as text,
    which the tokenizer encodes as the one special token); turn 2: the answer."""
    call = json.dumps({"name": "calc_add", "arguments": {"a": a, "b": b}}, separators=(",", ":"))
    return [byte_ids(tok, f"ok<eos><tool_call>{call}</tool_call>") + [tok.eos_token_id],
            byte_ids(tok, str(a + b)) + [tok.eos_token_id]]


def test_token_in_token_out_across_turns_and_the_replay(vf_packages, tok):
    env = make_env("vf:swarmrl_vf_calc")
    t = env.sample(0, 1)[0]
    d = env.vf_task(t).data
    backend = ScriptedBackend(_calc_turns(tok, d.a, d.b), tok.eos_token_id, tok.pad_token_id)
    with ServedEndpoint(ChatEndpoint(backend, tok, ChatLimits(max_turn_tokens=200))) as served:
        row = asyncio.run(rollout(env, t, served, max_turn_tokens=200))
    assert row.reward == pytest.approx(1.0)
    assert [m["role"] for m in row.messages] == ["user", "assistant", "tool", "assistant"]
    model = [row.completion_ids[s.start:s.end] for s in segments(row.mask) if s.model]
    assert model == backend.sampled and len(model) == 2  # the trained ids are the sampled ones, every turn
    assert [row.logprobs[i] for i, m in enumerate(row.mask) if m] == [
        lp for ids in backend.sampled for lp in (-0.5 - 0.01 * k for k in range(len(ids)))]
    # the second call's prompt is the first's, its sampled ids, then only the tool message's tokens
    assert backend.prompts[1] == row.prompt_ids + row.completion_ids[: len(backend.prompts[1]) - len(row.prompt_ids)]
    assert backend.prompts[1][: len(backend.prompts[0]) + len(model[0])] == backend.prompts[0] + model[0]
    # re-rendering the conversation and tokenizing it again gives other ids: this template would have changed them
    again = encode_text(tok, render(tok, row.messages, env.tools(t).declarations, False))
    assert again != row.prompt_ids + row.completion_ids
    # the validator's replay: the row replays; an edited environment turn, a forged reward, a cut row do not
    assert replay_problem(env, t, row.prompt_ids, row.completion_ids, row.mask, tok, reward=row.reward) is None
    env_seg = next(s for s in segments(row.mask) if not s.model)
    edited = list(row.completion_ids)
    edited[env_seg.start + 3] = byte_ids(tok, "9")[0] if edited[env_seg.start + 3] != byte_ids(tok, "9")[0] else 0
    assert "environment segment" in replay_problem(env, t, row.prompt_ids, edited, row.mask, tok)
    assert "reward" in replay_problem(env, t, row.prompt_ids, row.completion_ids, row.mask, tok, reward=0.2)
    first = segments(row.mask)[0]
    assert "model turn" in replay_problem(env, t, row.prompt_ids, row.completion_ids[: first.end],
                                          row.mask[: first.end], tok)
    assert "prompt" in replay_problem(env, t, row.prompt_ids[1:], row.completion_ids, row.mask, tok)


def test_single_turn_episode_with_the_tiny_model_over_the_endpoint(vf_packages, tok, tiny_model_dir):
    env = make_env("vf:swarmrl_vf_echo")
    model = load_model(tiny_model_dir)
    backend = OursBackend(model, tok.eos_token_id, tok.pad_token_id, torch.Generator().manual_seed(0))
    with ServedEndpoint(ChatEndpoint(backend, tok, ChatLimits(max_turn_tokens=24))) as served:
        rows = [asyncio.run(rollout(env, t, served, max_turn_tokens=24, seed=i))
                for i, t in enumerate(env.sample(0, 3))]
    for t, row in zip(env.sample(0, 3), rows):
        assert row.mask and all(m == 1 for m in row.mask) and 1 <= len(row.completion_ids) <= 24
        assert len(row.logprobs) == len(row.completion_ids) and all(lp <= 0 for lp in row.logprobs)
        assert row.reward in (0.0, 1.0)
        assert replay_problem(env, t, row.prompt_ids, row.completion_ids, row.mask, tok, reward=row.reward) is None


# ---- through the worker and the validator --------------------------------------------------------------------------
class CalcBot(ScriptedBackend):
    """Answers by what its prompt holds, whatever order concurrent episodes ask in: a tool call for a fresh task
    (its text re-tokenizes otherwise, as above), the tool's result once there is one."""

    def __init__(self, tok) -> None:  # noqa: ANN001
        super().__init__([], tok.eos_token_id, tok.pad_token_id)
        self.tok = tok

    def generate(self, prompt_ids, params, *, seeds=None, capture_hidden=False):  # noqa: ANN001, ANN201
        text = self.tok.decode(prompt_ids[0])
        if "<|tool|>" in text:
            answer = text.rsplit("<|tool|>", 1)[1].split("<eos>")[0]
            self.turns = [byte_ids(self.tok, answer) + [self.tok.eos_token_id]]
        else:
            a, b = (int(x) for x in text.rsplit("What is ", 1)[1].split("?")[0].split(" + "))
            self.turns = _calc_turns(self.tok, a, b)[:1]
        return super().generate(prompt_ids, params, seeds=seeds, capture_hidden=capture_hidden)


def _assignment(env_name: str, seed_node: str = "n" * 16, group_size: int = 2, n: int = 2,
                sampling: dict | None = None):
    from swarmrl.contract import RLContract, task_seed
    from swarmrl.protocol.schemas import AssignmentSpec, TaskSpec

    contract = RLContract(task={"name": env_name}, group_size=group_size, sampling=sampling or {})
    seed = task_seed(seed_node, 0, "test-secret")
    tasks = contract.task.build().sample(seed, n)
    a = AssignmentSpec(assignment_id=1, step=0, policy_version=0, seed=seed, contract=contract, target_length=None,
                       tasks=[TaskSpec(task_id=t.task_id, prompt=t.prompt) for t in tasks])
    return contract, seed, tasks, a


def _judge(tmp_path, tok, model, a, rows, **cfg):  # noqa: ANN001, ANN003, ANN202
    from swarmrl.protocol.checks import default_checks
    from swarmrl.protocol.config import ValidatorConfig
    from swarmrl.protocol.schemas import PendingSubmission, SubmissionInfo
    from swarmrl.protocol.validator import judge
    from swarmrl.rollouts.wire import write_rollouts

    sub = SubmissionInfo(submission_id=1, node_id="n" * 16, assignment_id=1, step=0, sha256="0" * 64, size=1,
                         n_rows=len(rows), status="pending", created_at=0.0)
    item = PendingSubmission(submission=sub, assignment=a, origin_node_id="n" * 16, current_step=0,
                             current_policy_version=0)
    vcfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp_path / "v"), **{"toploc_check": "", **cfg})
    path = write_rollouts(rows, tmp_path / f"r{abs(hash(str(rows))) % 10**9}.parquet")
    return judge(path, item, vcfg, default_checks(vcfg), tok, lambda v: model, len(tok))


def test_worker_rows_of_tiny_model_episodes_with_proofs_pass_the_validator(vf_packages, tok, tiny_model_dir, tmp_path):
    from swarmrl.generation.batch import BatchOrigin, rollout_batch

    model = load_model(tiny_model_dir)
    contract, seed, tasks, a = _assignment("vf:swarmrl_vf_echo", sampling={"max_trajectory_tokens": 16,
                                                                           "max_turn_tokens": 16})
    res = rollout_batch(model, tok, contract.task.build(), tasks, contract=contract, sampling=contract.sampling,
                        origin=BatchOrigin("n" * 16, 0, 0, seed), budgets=None, generator=torch.Generator().manual_seed(0), proofs=True)
    assert len(res.rows) == 4 and all(r.completion_mask and all(r.completion_mask) and r.proofs for r in res.rows)
    v = _judge(tmp_path, tok, model, a, res.rows, logprob_rows=64,
               toploc_check="swarmrl.toploc.rollout:verify_rollouts")
    assert v.accepted, v.reason
    assert {c.name for c in v.checks if not c.skipped} >= {"logprobs", "rewards", "tasks", "toploc"}


def test_validator_replays_tool_episodes_and_rejects_edits_and_forged_rewards(vf_packages, tok, tiny_model_dir,
                                                                              tmp_path):
    import dataclasses

    from swarmrl.generation.batch import BatchOrigin, rollout_batch

    model = load_model(tiny_model_dir)
    contract, seed, tasks, a = _assignment("vf:swarmrl_vf_calc", sampling={"max_trajectory_tokens": 1024,
                                                                           "max_turn_tokens": 120})
    res = rollout_batch(CalcBot(tok), tok, contract.task.build(), tasks, contract=contract, sampling=contract.sampling,
                        origin=BatchOrigin("n" * 16, 0, 0, seed), budgets=None)
    assert all(r.task_reward == pytest.approx(1.0) and 0 in r.completion_mask for r in res.rows)
    off = {"logprob_rows": 0}  # the replay and the rewards (the scripted turns are not the tiny model's samples)
    v = _judge(tmp_path, tok, model, a, res.rows, **off)
    assert v.accepted, v.reason
    edited = [dataclasses.replace(r) for r in res.rows]
    ids, mask = list(edited[1].completion_ids), edited[1].completion_mask
    k = mask.index(0) + 4
    ids[k] = byte_ids(tok, "7")[0] if ids[k] != byte_ids(tok, "7")[0] else byte_ids(tok, "8")[0]
    edited[1].completion_ids = ids
    v = _judge(tmp_path, tok, model, a, edited, **off)
    assert not v.accepted and v.reason.startswith("replay: row 1: environment segment"), v.reason
    forged = [dataclasses.replace(r) for r in res.rows]
    last = segments(forged[0].completion_mask)[-1]  # the answer turn, made wrong, the full reward still claimed
    wrong = byte_ids(tok, "x") + [tok.eos_token_id]
    forged[0].completion_ids = forged[0].completion_ids[: last.start] + wrong
    forged[0].completion_mask = forged[0].completion_mask[: last.start] + [1] * len(wrong)
    forged[0].logprobs = forged[0].logprobs[: last.start] + [-1.0] * len(wrong)
    v = _judge(tmp_path, tok, model, a, forged, **off)
    assert not v.accepted and "row 0: task_reward 1 but the verifier gives 0.2" in v.reason, v.reason


def test_an_episode_ends_where_its_next_prompt_would_be_over_the_context_and_replays_so(vf_packages, tok):
    env = make_env("vf:swarmrl_vf_calc")
    t = env.sample(0, 1)[0]
    d = env.vf_task(t).data
    with ServedEndpoint(ChatEndpoint(ScriptedBackend(_calc_turns(tok, d.a, d.b), tok.eos_token_id,
                                                     tok.pad_token_id), tok, ChatLimits(max_turn_tokens=200))) as served:
        full = asyncio.run(rollout(env, t, served, max_turn_tokens=200))
    second = len(full.prompt_ids) + segments(full.mask)[2].start  # the second model turn's prompt length
    short = make_env("vf:swarmrl_vf_calc", max_context_tokens=second - 1)
    endpoint = ChatEndpoint(ScriptedBackend(_calc_turns(tok, d.a, d.b), tok.eos_token_id, tok.pad_token_id), tok,
                            ChatLimits(max_turn_tokens=200, max_prompt_tokens=second - 1))
    with ServedEndpoint(endpoint) as served:
        cut = asyncio.run(rollout(short, t, served, max_turn_tokens=200))
    assert cut.completion_ids == full.completion_ids[: segments(full.mask)[0].end] and all(cut.mask)
    assert cut.messages[-1]["role"] == "tool" and cut.reward == pytest.approx(0.2)  # the tool, no answer
    assert replay_problem(short, t, cut.prompt_ids, cut.completion_ids, cut.mask, tok, reward=cut.reward) is None
    assert "asks for model turn 1" in replay_problem(env, t, cut.prompt_ids, cut.completion_ids, cut.mask, tok)
    assert "over max_context_tokens" in replay_problem(short, t, full.prompt_ids, full.completion_ids, full.mask, tok)
