"""Multi-turn and tool rollouts through the pipeline: the calc tool task, the completion mask on the wire, the
turn-by-turn sampling loop (no re-tokenization), the loss over the model's tokens only, and the validator's
replay of the environment's turns (with logprob and TOPLOC checks at the model's tokens)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from swarmrl.contract import RLContract, Rollout, task_seed
from swarmrl.envs import available_envs, make_env, register_env
from swarmrl.envs.calc import CalcEnv, CalcError, evaluate
from swarmrl.envs.multiturn import cut_at_stop, replay_problem, segments
from swarmrl.generation.batch import BatchOrigin, rollout_batch
from swarmrl.inference.backend import InferenceBackend
from swarmrl.inference.prompts import encode_prompt, encode_reply
from swarmrl.inference.sampler import SampleOutput
from swarmrl.models import load_model, load_tokenizer
from swarmrl.rl.config import RLConfig
from swarmrl.rl.losses.objective import Objective
from swarmrl.rl.losses.policy import policy_loss
from swarmrl.rollouts.packing import Sequence, pack
from swarmrl.rollouts.wire import SCHEMA, RolloutError, read_rollouts, to_table, write_rollouts

torch.set_num_threads(1)


class EchoTool(CalcEnv):
    """calc's tasks with a tool the random tiny model does call: any digit ends a turn, the reply names the turn
    (a turn ending in 9 ends the episode)."""

    name = "echo_tool"
    stop = tuple("0123456789")

    def respond(self, task, turns):  # noqa: ANN001, ANN201
        return None if turns[-1].endswith("9") else f"<r{len(turns)}>"


if "echo_tool" not in available_envs():
    register_env("echo_tool")(lambda max_turns=4, **kw: EchoTool(max_turns=max_turns, **kw))


# ---- the calc environment ------------------------------------------------------------------------------------
def test_calc_evaluates_with_a_bounded_parser_and_answers_tool_calls():
    assert evaluate("(2+3)*4 - -1") == 21 and evaluate("7/2") == Fraction(7, 2)
    for bad in ("2**3", "__import__('os')", "(" * 40 + "1" + ")" * 40, "9" * 50, "1/0", "2+", "1" * 201, "9" * 30 + "*" + "9" * 30):
        with pytest.raises(CalcError):
            evaluate(bad)
    env = make_env("calc")
    task = env.sample(0, 1)[0]
    assert env.respond(task, ["let me see <calc>12*(3+1)</calc>"]) == "<result>48</result>"
    assert env.respond(task, ["<calc>7/2</calc>"]) == "<result>7/2</result>"
    assert env.respond(task, ["<calc>2**3</calc>"]) == "<result>error</result>"
    assert env.respond(task, ["no tool call"]) is None
    ans = task.verification_info["answer"]
    assert env.verify(task, f"<calc>1</calc><result>1</result> so <answer>{ans}</answer>") == 1.0
    assert env.verify(task, f"<answer>{ans + 1}</answer>") == 0.0
    assert env.sample(5, 8) == env.sample(5, 8)
    held = {t.task_id for t in env.heldout_set(20)}
    assert not held & {t.task_id for t in env.sample(1, 200)}


# ---- the replay rule (pure) ----------------------------------------------------------------------------------
CHARS = "0123456789+-*/()<>abcdefghijklmnopqrstuvwxyz "
EOS = len(CHARS)


def _dec(ids: list[int]) -> str:
    return "".join(CHARS[i] for i in ids if i != EOS)


def _enc(text: str) -> list[int]:
    return [CHARS.index(c) for c in text]


def _traj(env: CalcEnv, task, turns: list[str], eos: bool = True) -> tuple[list[int], list[int]]:  # noqa: ANN001
    ids: list[int] = []
    mask: list[int] = []
    seen: list[str] = []
    for k, t in enumerate(turns):
        ids += _enc(t)
        mask += [1] * len(t)
        seen.append(t)
        if k < len(turns) - 1:
            reply = _enc(env.respond(task, seen))
            ids += reply
            mask += [0] * len(reply)
    if eos:
        ids.append(EOS)
        mask.append(1)
    return ids, mask


class _CharCalc(CalcEnv):
    stop = ("</calc>",)

    def respond(self, task, turns):  # noqa: ANN001, ANN201
        r = super().respond(task, turns)
        return None if r is None else r.replace("<result>", "<r>").replace("</result>", "</r>")


def test_replay_accepts_the_environments_turns_and_nothing_else():
    env = _CharCalc(max_turns=3)
    task = env.sample(0, 1)[0]
    ids, mask = _traj(env, task, ["x <calc>2*3</calc>", "<calc>6+1</calc>", "it is 7"])
    assert [s.model for s in segments(mask)] == [True, False, True, False, True]
    assert replay_problem(env, task, ids, mask, _dec, _enc, EOS) is None
    env_at = mask.index(0)
    edited = list(ids)
    edited[env_at + 3] = CHARS.index("9")
    assert "environment turn 0 is not" in replay_problem(env, task, edited, mask, _dec, _enc, EOS)
    lied = list(mask)  # a model token claimed as the environment's
    lied[1] = 0
    assert replay_problem(env, task, ids, lied, _dec, _enc, EOS) is not None
    ones = [1] * len(ids)  # the environment's reply claimed as the model's: a turn goes on past its stop string
    assert "past a stop string" in replay_problem(env, task, ids, ones, _dec, _enc, EOS)
    assert "ends with an environment turn" in replay_problem(env, task, ids[:env_at + 2], mask[:env_at + 2], _dec,
                                                              _enc, EOS)
    many = _traj(env, task, ["<calc>1</calc>"] * 3 + ["done"])
    assert "over the environment's 3" in replay_problem(env, task, *many, _dec, _enc, EOS)
    early = _enc("<calc>1+") + _enc("<r>1</r>") + _enc("1</calc>") + [EOS]  # a turn cut before its stop string
    early_mask = [1] * 8 + [0] * 8 + [1] * 9
    assert "does not end where" in replay_problem(env, task, early, early_mask, _dec, _enc, EOS)


def test_finding_a_stop_string_costs_about_log_n_decodes_not_one_per_prefix():
    """A hostile row near the token budget with its stop string at the end: the replay (and the node's sampler)
    used to decode every prefix, n(n+1)/2 tokens in all. Counted in decoded tokens, not timed."""
    decoded = []

    def dec(ids):  # noqa: ANN001, ANN202
        decoded.append(len(ids))
        return _dec(ids)

    n = 4096
    for at in (n, n // 2, 37, len("</calc>")):  # the stop string completes at token `at` (one char, one token)
        ids = _enc("x" * (at - len("</calc>")) + "</calc>" + "y" * (n - at))
        decoded.clear()
        assert cut_at_stop(ids, dec, ("</calc>",)) == at
        assert len(decoded) <= 2 + n.bit_length() and sum(decoded) <= (2 + n.bit_length()) * n, (at, len(decoded))
        assert at == next(k for k in range(1, n + 1) if "</calc>" in _dec(ids[:k]))  # the shortest prefix, as before
    decoded.clear()
    assert cut_at_stop(_enc("y" * n), dec, ("</calc>",)) is None and decoded == [n]  # none: one decode
    assert cut_at_stop(_enc("a</calc>b</r>"), _dec, ("</r>", "</calc>")) == len("a</calc>")  # the first of several


# ---- the wire --------------------------------------------------------------------------------------------------
def _row(**kw) -> Rollout:  # noqa: ANN003
    base = dict(worker_id="w", step=0, policy_version=0, task_id="t", env="calc", group_id="g", prompt_ids=[1, 2],
                completion_ids=[3, 4, 5, 6], logprobs=[-0.5, 0.0, 0.0, -0.25], reward=1.0, task_reward=1.0,
                length_penalty=0.0, target_length=None, temperature=1.0, finished=True, seed=0,
                proofs=[], completion_mask=[1, 0, 0, 1])
    return Rollout(**{**base, **kw})


def test_the_completion_mask_round_trips_and_hostile_masks_are_refused(tmp_path):
    rows = [_row(), _row(completion_mask=None, logprobs=[-0.5, -0.125, -0.375, -0.25])]
    assert read_rollouts(write_rollouts(rows, tmp_path / "a.parquet")) == rows
    assert to_table(rows).column("completion_mask").to_pylist()[1] == [1, 1, 1, 1]  # single-turn: all ones

    def hostile(name: str, mask: list[int], logprobs: list[float] | None = None) -> str:
        t = to_table([_row()])
        t = t.set_column(t.schema.get_field_index("completion_mask"), SCHEMA.field("completion_mask"),
                         pa.array([mask], SCHEMA.field("completion_mask").type))
        if logprobs is not None:
            t = t.set_column(t.schema.get_field_index("logprobs"), SCHEMA.field("logprobs"),
                             pa.array([logprobs], SCHEMA.field("logprobs").type))
        pq.write_table(t, tmp_path / name)
        with pytest.raises(RolloutError) as e:
            read_rollouts(tmp_path / name)
        return str(e.value)

    assert "3 completion_mask values for 4" in hostile("short.parquet", [1, 0, 1])
    assert "only 0 and 1" in hostile("two.parquet", [1, 2, 0, 1])
    assert "only 0 and 1" in hostile("neg.parquet", [1, -1, 0, 1])
    assert "environment token" in hostile("lp.parquet", [1, 0, 0, 1], [-0.5, -0.3, 0.0, -0.25])
    old = to_table([_row()]).drop_columns(["completion_mask"])  # a file from before the column
    pq.write_table(old, tmp_path / "old.parquet")
    with pytest.raises(RolloutError, match="before multi-turn"):
        read_rollouts(tmp_path / "old.parquet")


# ---- the sampling loop ------------------------------------------------------------------------------------------
class ScriptedBackend(InferenceBackend):
    """Answers turn k of every sequence with ``script[k]`` (ids, logprobs -0.01 * (j + 1)), hidden state rows
    holding (call, position); records the prompts it was given."""

    name = "scripted"

    def __init__(self, script: list[list[int]], eos: int, pad: int) -> None:
        super().__init__(eos, pad)
        self.script, self.prompts, self.calls = script, [], 0

    def generate(self, prompt_ids, params, *, seeds=None, capture_hidden=False):  # noqa: ANN001, ANN201
        ids = self.script[self.calls][: params.max_new_tokens]
        n = len(prompt_ids)
        self.prompts.append([list(p) for p in prompt_ids])
        hid = [torch.tensor([[self.calls, j] for j in range(len(ids))], dtype=torch.bfloat16) for _ in range(n)]
        self.calls += 1
        return SampleOutput([list(p) for p in prompt_ids], [list(ids)] * n,
                            [[-0.01 * (j + 1) for j in range(len(ids))]] * n, [bool(ids) and ids[-1] == self.eos_id] * n,
                            hid if capture_hidden else None)

    def update_weights(self, weights):  # noqa: ANN001, ANN201
        pass


def test_the_sampling_loop_appends_sampled_ids_and_replies_tokenized_once(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    env = make_env("calc")
    task = env.sample(0, 1)[0]
    ans = task.verification_info["answer"]
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    turn1 = enc("hm <calc>2*(3+4)</calc>") + enc(" dropped tokens")
    kept1 = len(enc("hm <calc>2*(3+4)</calc>"))
    turn2 = enc(f"<answer>{ans}</answer>") + [tok.eos_token_id]
    backend = ScriptedBackend([turn1, turn2], tok.eos_token_id, tok.pad_token_id)
    cfg = RLConfig(contract=RLContract(group_size=2, task={"name": "calc"}, sampling={"max_trajectory_tokens": 128}))
    res = rollout_batch(backend, tok, env, [task], contract=cfg.contract, sampling=cfg.contract.sampling,
                        origin=BatchOrigin("w", 0, 0, 0), budgets=None)
    reply = encode_reply(tok, "<result>14</result>")
    assert reply == enc("<result>14</result>")
    for r in res.rows:
        assert r.completion_ids == turn1[:kept1] + reply + turn2  # sampled ids and the reply's ids, as they are
        assert r.completion_mask == [1] * kept1 + [0] * len(reply) + [1] * len(turn2)
        assert r.logprobs == pytest.approx([-0.01 * (j + 1) for j in range(kept1)] + [0.0] * len(reply)
                                           + [-0.01 * (j + 1) for j in range(len(turn2))])
        assert r.finished and r.task_reward == 1.0
    # the second turn's prompt is the prompt ids + the trajectory so far, never re-tokenized text
    prompt = encode_prompt(tok, task.prompt)
    assert backend.prompts[1] == [prompt + turn1[:kept1] + reply] * 2


def test_hidden_states_of_the_model_tokens_only_in_order(tiny_model_dir):
    from swarmrl.episodes.turns import sample_turns
    from swarmrl.inference.params import SamplingParams

    tok = load_tokenizer(tiny_model_dir)
    env = make_env("calc")
    task = env.sample(0, 1)[0]
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    t1, t2 = enc("<calc>1</calc>xx"), enc("done") + [tok.eos_token_id]
    out = sample_turns(ScriptedBackend([t1, t2], tok.eos_token_id, tok.pad_token_id), tok, env, [task],
                       [enc("p")], SamplingParams(max_trajectory_tokens=64), capture_hidden=True)
    h = out.hidden[0].float().tolist()
    assert h == [[0, j] for j in range(len(t1) - 2)] + [[1, j] for j in range(len(t2))]
    assert len(h) == sum(out.masks[0])


def test_each_turn_is_bounded_by_the_turn_limit_and_the_trajectory_by_its_own(tiny_model_dir):
    from swarmrl.episodes.turns import sample_turns
    from swarmrl.inference.params import SamplingParams

    tok = load_tokenizer(tiny_model_dir)
    env = make_env("calc")
    task = env.sample(0, 1)[0]
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    t1, t2 = enc("<calc>1</calc>"), enc("a long answer that goes on") + [tok.eos_token_id]
    reply = encode_reply(tok, "<result>1</result>")

    def run(**limits):  # noqa: ANN003, ANN202
        backend = ScriptedBackend([t1, t2], tok.eos_token_id, tok.pad_token_id)
        out = sample_turns(backend, tok, env, [task], [enc("p")], SamplingParams(**limits))
        return backend, out

    backend, whole = run(max_trajectory_tokens=200)  # the turn limit follows the trajectory's
    assert whole.completion_ids[0] == t1 + reply + t2 and whole.finished[0]
    backend, cut = run(max_trajectory_tokens=200, max_turn_tokens=len(t1) + 2)
    assert cut.completion_ids[0] == t1 + reply + t2[: len(t1) + 2] and not cut.finished[0]  # cut: the episode ends
    assert backend.calls == 2
    _, short = run(max_trajectory_tokens=len(t1) + len(reply) + 3)  # the second turn gets the room that is left
    assert short.completion_ids[0] == t1 + reply + t2[:3] and not short.finished[0]


# ---- the loss -------------------------------------------------------------------------------------------------
def test_the_loss_ignores_environment_tokens():
    seqs = [Sequence([1, 2], [3, 4, 5, 6, 7], [-0.5, -9.0, -9.0, -0.3, -0.2], 1.0, 1.0, [1, 0, 0, 1, 1]),
            Sequence([1], [3, 4], [-0.1, -0.2], -1.0, 1.0)]
    p = pack(seqs, 0)
    assert p["cmask"][0].tolist() == [0, 1, 0, 0, 1, 1] and p["old"][0, 2:4].tolist() == [0.0, 0.0]
    assert seqs[0].model_tokens() == 3 and seqs[1].model_tokens() == 2
    logp = torch.randn(p["old"].shape) * 0.1 - 1.0
    w = p["cmask"] / 5
    obj = Objective()
    base = policy_loss(obj, logp, p["old"], torch.tensor([1.0, -1.0]), w, p["cmask"])
    noisy = logp.clone()
    noisy[0, 2:4] += torch.tensor([5.0, -7.0])  # the trainer's logprobs at the environment's tokens
    old = p["old"].clone()
    old[0, 2:4] = -3.0  # and claimed ones there
    other = policy_loss(obj, noisy, old, torch.tensor([1.0, -1.0]), w, p["cmask"])
    assert float(other.loss) == pytest.approx(float(base.loss)) and other.stats == base.stats
    assert base.stats.tokens == 5


def test_a_train_step_counts_and_trains_the_model_tokens_only(tiny_model_dir):
    from swarmrl.rl.config import LossConfig
    from swarmrl.rl.train_step import Passes, WholeBatch, accumulate_gradients

    model = load_model(tiny_model_dir)
    mt = Sequence([5, 6], [7, 8, 9, 10], [-5.0, 0.0, 0.0, -5.0], 1.0, 1.0, [1, 0, 0, 1])
    flipped = dataclasses.replace(mt, logprobs=[-5.0, -2.0, -1.0, -5.0])  # logprobs at environment tokens
    cfg = LossConfig(normalization="token")
    a = accumulate_gradients(model, [mt], cfg, 0, WholeBatch(8), Passes(4))
    model.zero_grad()
    b = accumulate_gradients(model, [flipped], cfg, 0, WholeBatch(8), Passes(4))
    assert a.loss == pytest.approx(b.loss) and a.stats.tokens == b.stats.tokens == 2


# ---- real trajectories through the validator ------------------------------------------------------------------
@pytest.fixture(scope="module")
def honest(tiny_model_dir, tmp_path_factory):
    from swarmrl.protocol.schemas import AssignmentSpec, PendingSubmission, SubmissionInfo, TaskSpec

    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    contract = RLContract(task={"name": "echo_tool", "params": {"max_turns": 4}}, group_size=2,
                          sampling={"max_trajectory_tokens": 40})
    seed = task_seed("n" * 16, 0, "test-secret")
    env = contract.task.build()
    tasks = env.sample(seed, 3)
    a = AssignmentSpec(assignment_id=1, step=0, policy_version=0, seed=seed, contract=contract, target_length=None,
                       tasks=[TaskSpec(task_id=t.task_id, prompt=t.prompt) for t in tasks])
    res = rollout_batch(model, tok, env, tasks, contract=contract, sampling=contract.sampling,
                        origin=BatchOrigin("n" * 16, 0, 0, seed),
                        budgets=None, generator=torch.Generator().manual_seed(0), proofs=True)
    sub = SubmissionInfo(submission_id=1, node_id="n" * 16, assignment_id=1, step=0, sha256="0" * 64, size=1,
                         n_rows=len(res.rows), status="pending", created_at=0.0)
    item = PendingSubmission(submission=sub, assignment=a, origin_node_id="n" * 16, current_step=0,
                             current_policy_version=0)
    return model, tok, res.rows, item, tmp_path_factory.mktemp("mt")


def _judge(honest, rows, checks=None, without=(), **cfg):  # noqa: ANN001, ANN003, ANN202
    from swarmrl.protocol.checks import default_checks
    from swarmrl.protocol.config import ValidatorConfig
    from swarmrl.protocol.validator import judge

    model, tok, _, item, tmp = honest
    vcfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp / "v"), **{"logprob_rows": 64, **cfg})
    path = write_rollouts(rows, tmp / f"r{abs(hash(str(rows))) % 10**9}.parquet")
    checks = checks or [(n, c) for n, c in default_checks(vcfg) if n not in without]
    return judge(path, item, vcfg, checks, tok, lambda v: model, len(tok))


def test_honest_multiturn_rows_replay_and_pass_every_check(honest):
    model, tok, rows, _, _ = honest
    assert any(r.completion_mask is not None and 0 in r.completion_mask for r in rows)  # a tool was called
    for r in rows:
        mask = r.model_mask()
        assert len(mask) == len(r.completion_ids) == len(r.logprobs)
        assert all(lp == 0.0 for lp, m in zip(r.logprobs, mask) if not m)
    v = _judge(honest, rows)
    assert v.accepted, v.reason
    assert {c.name for c in v.checks if not c.skipped} >= {"logprobs", "toploc", "sampling", "rewards"}


def _multiturn(rows: list[Rollout]) -> int:
    return next(i for i, r in enumerate(rows) if r.completion_mask is not None and 0 in r.completion_mask)


def test_an_edited_environment_turn_or_a_forged_reward_does_not_replay(honest):
    _, tok, rows, _, _ = honest
    i = _multiturn(rows)
    off = {"logprob_rows": 0, "toploc_check": ""}  # the replay alone (the model checks would see the new context)
    edited = [dataclasses.replace(r) for r in rows]
    ids, mask = list(edited[i].completion_ids), edited[i].completion_mask
    ids[mask.index(0)] = tok.encode("Z", add_special_tokens=False)[0]
    edited[i].completion_ids = ids
    v = _judge(honest, edited, **off)
    assert not v.accepted and v.reason.startswith(f"replay: row {i}: environment turn 0"), v.reason
    claimed = [dataclasses.replace(r) for r in rows]  # the environment's tokens claimed as the model's
    claimed[i].completion_mask = None
    claimed[i].logprobs = [lp if m else -1.0 for lp, m in zip(rows[i].logprobs, rows[i].completion_mask)]
    v = _judge(honest, claimed, **off)
    assert not v.accepted and v.reason.startswith(f"replay: row {i}:"), v.reason
    forged = [dataclasses.replace(r) for r in rows]
    forged[i].task_reward = forged[i].reward = 1.0 - rows[i].task_reward
    v = _judge(honest, forged, **off)
    assert not v.accepted and v.reason.startswith(f"rewards: row {i}: task_reward"), v.reason


@pytest.mark.parametrize("kind", ["edit_env_turn", "forge_tool_result"])
def test_the_multiturn_adversaries_uploads_are_rejected_by_the_replay(honest, kind):
    """The swarm's cheating nodes for tool tasks: every row tampered (an environment turn spliced into a row that
    has none) and honestly re-scored; the replay, before any model check, names what is wrong."""
    from swarmrl.attacks.adversaries import ADVERSARIES

    model, tok, rows, item, _ = honest
    node = object.__new__(ADVERSARIES[kind])  # the tamper step alone: no orchestrator, no policy
    node.tokenizer = tok
    env = item.assignment.contract.task.build()
    tasks = env.sample(item.assignment.seed, 3)
    rl = RLConfig(contract=item.assignment.contract)
    bad = node.tamper([dataclasses.replace(r) for r in rows], tasks, env, rl, item.assignment)
    for r, b in zip(rows, bad):
        assert [t for t, m in zip(b.completion_ids, b.model_mask()) if m] == \
            [t for t, m in zip(r.completion_ids, r.model_mask()) if m]  # the model's tokens are its own
        assert b.completion_ids != r.completion_ids and 0 in b.model_mask()
        assert len(b.logprobs) == len(b.completion_ids) == len(b.model_mask())
    answer = str(tasks[0].verification_info["answer"])
    if kind == "forge_tool_result":
        assert f"<result>{answer}</result>" in tok.decode(bad[0].completion_ids)
    v = _judge(honest, bad)  # the replay runs before the model checks (which the shifted context would fail)
    assert not v.accepted and v.reason.startswith("replay: row 0:"), v.reason
    from swarmrl.protocol.checks import check_rewards

    v = _judge(honest, bad, checks=[("rewards", check_rewards)])  # the rewards check replays on its own too
    assert not v.accepted and v.reason.startswith("rewards: row 0: replay:"), v.reason


def test_edited_model_tokens_are_caught_by_the_logprob_and_toploc_checks(honest):
    _, tok, rows, _, _ = honest
    i = _multiturn(rows)
    bad = [dataclasses.replace(r) for r in rows]
    x = tok.encode("x", add_special_tokens=False)[0]
    no_replay = ("replay",)  # rewritten turns no longer end at a stop string: the replay alone would name that
    mask = bad[i].completion_mask  # the model's tokens rewritten, the environment's left as they were
    bad[i].completion_ids = [x if m and t != tok.eos_token_id else t for t, m in zip(bad[i].completion_ids, mask)]
    v = _judge(honest, bad, without=no_replay)
    assert not v.accepted and v.reason.startswith(f"logprobs: row {i}"), v.reason
    v = _judge(honest, bad, without=no_replay, logprob_rows=0)
    assert not v.accepted and v.reason.startswith(f"toploc: row {i}") and "chunk" in v.reason, v.reason
    swapped = [dataclasses.replace(r) for r in rows]  # proofs of another row's model tokens
    j = next(k for k, r in enumerate(rows) if k != i and len(r.proofs) == len(rows[i].proofs))
    swapped[i].proofs = rows[j].proofs
    v = _judge(honest, swapped, logprob_rows=0)
    assert not v.accepted and v.reason.startswith(f"toploc: row {i}"), v.reason


# ---- a short local run of configs/calc.toml -------------------------------------------------------------------
@pytest.mark.timeout(600)
def test_a_short_local_run_of_the_calc_config_finishes(tmp_path, tiny_model_dir):
    from swarmrl.config import load_config
    from swarmrl.job import RunConfig
    from swarmrl.job.launch import launch
    from swarmrl.rundir.writer import RunDir

    cfg = load_config(RunConfig, "configs/calc.toml", [
        f'rl.run_dir="{tmp_path / "run"}"', f'rl.model="{tiny_model_dir}"', "rl.steps=2", "rl.prompts_per_step=2",
        "rl.workers.num=1", "rl.workers.prompts_per_batch=2", "rl.contract.group_size=2", "rl.eval.every_steps=0",
        "rl.eval.n=4", "final_eval_n=4", "rl.contract.filter_ties=false", 'mode="local"',
        "rl.shardcast.enabled=false"])
    assert cfg.rl.contract.task.name == "calc" and cfg.mode == "local"
    summary = launch(cfg, progress=lambda m: None)
    assert summary["steps"] == 2
    run = RunDir(cfg.rl.run_dir)
    assert run.is_done()


def test_overlong_filter_drops_budget_cuts_not_trajectories_the_environment_ended():
    from swarmrl.rl.trainer import overlong

    def row(n: int, finished: bool, mask: list[int] | None = None) -> Rollout:
        return Rollout("w", 0, 0, "t", "calc", "g", [1, 2], list(range(3, 3 + n)), [-0.1] * n, 1.0, 1.0, 0.0,
                       None, 1.0, finished, 0, completion_mask=mask)

    assert overlong(row(16, False), 16)  # single turn, no EOS, the whole budget used: cut
    assert not overlong(row(9, True), 16)  # ended with EOS
    assert not overlong(row(12, False, [1] * 5 + [0] * 4 + [1] * 3), 16)  # the environment ended it (no EOS)


class ToolUser(InferenceBackend):
    """A policy that cannot compute: it calls the tool on the prompt's expression, then copies the result."""

    name = "tool_user"

    def __init__(self, tok) -> None:  # noqa: ANN001
        super().__init__(tok.eos_token_id, tok.pad_token_id)
        self.tok = tok

    def generate(self, prompt_ids, params, *, seeds=None, capture_hidden=False):  # noqa: ANN001, ANN201
        outs = []
        for p in prompt_ids:
            text = self.tok.decode(p, skip_special_tokens=True)
            if text.count("<result>") > 1:  # the prompt names the tag once
                reply = f"<answer>{text.rsplit('<result>', 1)[1].split('</result>')[0]}</answer>"
                ids = self.tok.encode(reply, add_special_tokens=False) + [self.eos_id]
            else:
                ids = self.tok.encode(f"<calc>{text.split('Compute ')[1].split('. ')[0]}</calc>",
                                      add_special_tokens=False)
            outs.append(ids[: params.max_new_tokens])
        return SampleOutput([list(p) for p in prompt_ids], outs, [[-0.1] * len(o) for o in outs],
                            [bool(o) and o[-1] == self.eos_id for o in outs], None)

    def update_weights(self, weights):  # noqa: ANN001, ANN201
        pass


def test_held_out_evaluation_of_a_tool_task_runs_the_tool(tiny_model_dir):
    """``evaluate`` samples a multi-turn task turn by turn with the environment's replies, as training does: a
    policy that only copies the tool's result scores on every item, and nothing without the replies."""
    from swarmrl.eval.heldout import evaluate
    from swarmrl.inference.params import TokenLimits

    tok = load_tokenizer(tiny_model_dir)
    env = make_env("calc", max_operand=50)
    res = evaluate(ToolUser(tok), tok, env, n=32, limits=TokenLimits(max_trajectory_tokens=96))
    assert res == {"accuracy": 1.0, "n": 32}
    short = TokenLimits(max_trajectory_tokens=20)
    assert evaluate(ToolUser(tok), tok, env, n=8, limits=short)["accuracy"] == 0.0  # no room for the answer
