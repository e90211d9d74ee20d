"""reasoning-gym tasks (``rg:<dataset>``): names, seeded and machine-independent sampling, the held-out split, the
dataset's scorer as the verifier on honest and hostile completions, the CLI, and the validator's reward re-check."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from swarmrl.contract import RLContract, RowOrigin, Samples, assigned_tasks, score_groups
from swarmrl.envs import available_envs, heldout_bucket, make_env
from swarmrl.envs.answers import extract_tagged, extract_text
from swarmrl.envs.base import Task, VerifierUnavailable
from swarmrl.envs.config import TaskConfig
from swarmrl.envs.rg import DATASETS, EXCLUDED, MAX_ANSWER_CHARS, RG_VERSION, SCORER, RGEnv

REPO = Path(__file__).resolve().parents[1]


def test_names_are_the_pinned_registry_less_the_excluded():
    from importlib import metadata

    import reasoning_gym

    assert metadata.version("reasoning-gym") == RG_VERSION
    assert set(DATASETS) | set(EXCLUDED) == set(reasoning_gym.factory.DATASETS)
    assert not set(DATASETS) & set(EXCLUDED)
    names = set(available_envs())
    assert {f"rg:{d}" for d in DATASETS} <= names
    assert not {f"rg:{d}" for d in EXCLUDED} & names
    with pytest.raises(KeyError, match="eval"):
        make_env("rg:n_queens")


_CODE_CALLS = {"eval", "exec", "compile", "parse_expr", "sympify", "__import__", "parse_latex"}


def _scorer_calls(cls: type) -> set[str]:
    """The code-evaluating calls reachable from ``cls.score_answer`` through reasoning_gym functions and methods
    (by name: a static over-approximation, enough to notice a new scorer that evaluates its input)."""
    found: set[str] = set()
    todo, seen = [cls.score_answer], set()
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            continue
        mod = sys.modules[fn.__module__]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in _CODE_CALLS:
                found.add(name)
            for owner in (mod, cls):
                obj = getattr(owner, name, None) if name else None
                if isinstance(obj, types.FunctionType) and obj.__module__.startswith("reasoning_gym"):
                    todo.append(obj)
    return found


def test_no_listed_dataset_scores_by_evaluating_the_answer():
    """Guards a version bump: a scorer that runs the completion's answer as code must be in EXCLUDED."""
    import reasoning_gym

    evaluating = {name for name, (cls, _) in reasoning_gym.factory.DATASETS.items() if _scorer_calls(cls)}
    assert {"n_queens", "string_insertion", "countdown", "puzzle24"} <= evaluating  # the audit finds them
    # bitwise_arithmetic and number_sorting eval their own (regenerated) entry, never the answer: checked by hand
    assert evaluating - {"bitwise_arithmetic", "number_sorting"} <= set(EXCLUDED)


_DUMP = """
import json, sys
from swarmrl.envs import make_env
out = []
for name, params in json.loads(sys.argv[1]):
    env = make_env(name, **params)
    for seed in (0, 7, 2**62 + 3):
        out.append([[t.task_id, t.prompt, t.verification_info] for t in env.sample(seed, 5)])
    out.append([[t.task_id, t.prompt] for t in env.heldout_set(5)])
print("@@" + json.dumps(out))
"""

# chain_sum (the example), pool_matrix (seeds numpy's global RNG), letter_jumble (word lists), acre (builds its
# whole sequence up front)
_CASES = [("rg:chain_sum", {"max_terms": 4}), ("rg:pool_matrix", {}), ("rg:letter_jumble", {}), ("rg:acre", {})]


def _dump(cases: list, hash_seed: str) -> list:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", _DUMP, json.dumps(cases)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.rsplit("@@", 1)[-1])


def test_same_tasks_in_every_process():
    """The validator re-derives a node's tasks from the seed on another machine: two fresh interpreters (different
    string hash seeds) draw the same tasks, prompts and verification info, and so does this one."""
    a, b = _dump(_CASES, "1"), _dump(_CASES, "2")
    assert a == b
    here = json.loads(json.dumps([[[t.task_id, t.prompt, t.verification_info] for t in make_env(n, **p).sample(s, 5)]
                                  for n, p in _CASES[:1] for s in (0, 7, 2**62 + 3)]))
    assert a[:3] == here


@pytest.mark.slow
def test_every_dataset_is_the_same_in_every_process():
    cases = [(f"rg:{d}", {}) for d in DATASETS]
    assert _dump(cases, "3") == _dump(cases, "4")


def test_sampling_is_seeded_by_seed_and_params():
    env = make_env("rg:chain_sum")
    ids = [t.task_id for t in env.sample(3, 16)]
    assert ids == [t.task_id for t in make_env("rg:chain_sum").sample(3, 16)]
    assert ids != [t.task_id for t in env.sample(4, 16)]
    other = make_env("rg:chain_sum", min_terms=3, max_terms=3)
    assert all(t.prompt.count("+") + t.prompt.count(" - ") == 2 for t in other.sample(3, 16))
    assert all(t.env == "rg:chain_sum" and t.task_id.startswith("rg:chain_sum:") for t in env.sample(3, 4))
    assert len(env.sample(5, 1500)) == 1500  # more draws than one seeded dataset instance holds


def test_heldout_tasks_are_never_drawn_by_training():
    """A small task space (2 one-digit terms: 200 questions) so that training draws cover it: every task drawn for
    training is outside the held-out bucket, every held-out task is inside it, and training still sees tasks
    from the whole train side."""
    params = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "heldout_pct": 30.0}
    env = make_env("rg:chain_sum", **params)
    held = env.heldout_set(500)  # all of them: the space has fewer than 500
    held_ids = {t.task_id for t in held}
    assert 20 < len(held_ids) == len(held) < 120
    assert all(heldout_bucket(t, 30.0) for t in held_ids)
    train_ids = {t.task_id for seed in range(300) for t in env.sample(seed, 16)}
    assert not train_ids & held_ids
    assert len(train_ids) > 100 and all(not heldout_bucket(t, 30.0) for t in train_ids)
    with pytest.raises(ValueError, match="distinct heldout"):
        env.sample(0, 500, "heldout")  # sample() wants n distinct ones and says there are not
    with pytest.raises(ValueError):
        env.sample(0, 1, "validation")  # type: ignore[arg-type]


def test_own_answer_scores_one_and_a_wrong_one_zero():
    env = make_env("rg:chain_sum")
    for t in env.sample(11, 20):
        gold = t.verification_info["answer"]
        assert env.verify(t, t.demonstration) == 1.0
        assert env.verify(t, f"Adding up... so <answer>{gold}</answer>") == 1.0
        assert env.verify(t, f"{gold}") == 0.0  # no tag: the default rule finds no answer
        wrong = str(int(gold) + 1)
        assert gold not in wrong  # (the scorer gives partial credit to an answer containing the gold one)
        assert env.verify(t, f"<answer>{wrong}</answer>") == 0.0
        assert env.verify(t, f"<answer>{gold}</answer> on second thought <answer>{wrong}</answer>") == 0.0


@pytest.mark.parametrize("rule,text", [("last_line", "thinking\n{gold}\n"), ("exact", " {gold} "),
                                       ("boxed", "so \\boxed{{{gold}}}.")])
def test_answer_rules(rule, text):
    env = make_env("rg:chain_sum", answer=rule)
    t = env.sample(2, 1)[0]
    gold = t.verification_info["answer"]
    assert env.verify(t, t.demonstration) == 1.0
    assert env.verify(t, text.format(gold=gold)) == 1.0
    assert "<answer>" not in t.prompt


@pytest.mark.timeout(60)  # a quadratic search of the junk below would take hours: the timeout is the check
def test_extract_tagged():
    assert extract_tagged("<answer> a </answer> x <answer>b</answer>") == "b"
    assert extract_tagged("<answer>a</answer> then <answer>b") == "a"  # the last one is not closed
    assert extract_tagged("<answer><answer>c</answer></answer>") == "c"  # nested: the innermost
    assert extract_tagged("</answer><answer>") is None and extract_tagged("no tags") is None
    assert extract_text("x\n\n  y  \n", "last_line") == "y" and extract_text("", "last_line") is None
    for junk in ("<answer>" * 300_000, "</answer>" * 300_000, "<answer></answer" * 100_000):
        assert extract_tagged(junk, max_chars=len(junk)) in (None, "")


def test_last_number_rule():
    cases = {"1 + 3 = 4": "4", "The answer is 1,234.": "1234", "x = -3.5 so": "-3.5", "ratio 3/4.": "3/4",
             "12 and then 7\n": "7", "no number": None, "9" * 100: None}
    for text, want in cases.items():
        assert extract_text(text, "last_number") == want, text
    env = make_env("rg:chain_sum", answer="last_number", min_terms=2, max_terms=2)
    t = env.sample(0, 1)[0]
    gold = t.demonstration.split("<answer>")[-1].split("</answer>")[0] if "<answer>" in t.demonstration \
        else t.demonstration.strip()
    assert "as a number" in t.prompt
    assert env.verify(t, f"So the sum is {gold}.") == 1.0
    assert env.verify(t, f"So the sum is {int(gold) + 1}.") < 1.0


HOSTILE = [
    "9" * 10_000_000,  # huge
    "<answer>" + "x" * 10_000_000 + "</answer>",  # the opening tag is outside the searched tail
    "<answer>" + "ab" * 5_000 + "</answer>",  # an answer over MAX_ANSWER_CHARS
    bytes(range(256)).decode("latin-1") * 4_000,  # binary
    "<answer>\x00\xff\ud800\U0010ffff</answer>",  # NUL, a lone surrogate
    "<answer>" * 200_000 + "</answer>" * 200_000,  # nested tags
    "<answer>" * 500_000,  # unclosed tags
    "<answer>__import__('os').system('touch /tmp/pwned')</answer>",
    "<answer>1e999999999</answer>",
    "<answer>nan</answer>",
    "",
]


def test_hostile_completions_score_zero_quickly():
    env = make_env("rg:chain_sum")
    task = env.sample(0, 1)[0]
    assert env.verify(task, task.demonstration) == 1.0  # (starts the scoring worker)
    restarts = SCORER.restarts
    for text in HOSTILE + [None, b"<answer>1</answer>", 12]:
        assert env.verify(task, text) == 0.0, repr(text)[:80]  # type: ignore[arg-type]
    assert SCORER.restarts == restarts  # chain_sum's scorer is cheap: nothing ran into the time limit
    # an answer over MAX_ANSWER_CHARS is not read, though the scorer would give it partial credit
    gold = task.verification_info["answer"]
    assert env.verify(task, f"<answer>{gold} {'x' * 100}</answer>") > 0.0
    assert env.verify(task, f"<answer>{gold} {'x' * MAX_ANSWER_CHARS}</answer>") == 0.0


def test_a_scorer_that_runs_away_is_stopped():
    """coin_flip's scorer turns "1e999999999" into a Fraction: ten to the billionth power, computed. The worker is
    killed at timeout_s, the answer scores 0, and the next completion is scored by a fresh worker."""
    env = make_env("rg:coin_flip", timeout_s=1.0)
    task = env.sample(0, 1)[0]
    assert env.verify(task, task.demonstration) == 1.0
    restarts = SCORER.restarts
    assert env.verify(task, "<answer>1e999999999</answer>") == 0.0
    assert SCORER.restarts == restarts + 1  # stopped by the time limit (it would compute for minutes)
    assert env.verify(task, task.demonstration) == 1.0


def test_a_scorer_that_cannot_start_is_the_verifiers_failure(monkeypatch):
    """Without its worker the verifier cannot judge: 0 for a worker or eval, VerifierUnavailable for the validator
    (strict), so that our failure never reads as a wrong answer and slashes an honest node."""
    import swarmrl.envs.rg as rg
    from swarmrl.envs.lineworker import LineWorker

    broken = rg._Scorer()
    broken.worker = LineWorker("_no_such_worker.py", "reasoning-gym scoring worker", start_timeout_s=30.0)
    monkeypatch.setattr(rg, "SCORER", broken)
    env = make_env("rg:chain_sum")
    task = env.sample(0, 1)[0]
    assert env.verify(task, task.demonstration) == 0.0
    env.strict = True
    with pytest.raises(VerifierUnavailable, match="did not start"):
        env.verify(task, task.demonstration)
    assert env.verify(task, "no answer tag") == 0.0  # nothing to score: no worker needed


@pytest.mark.parametrize("dataset", ["word_sorting", "rubiks_cube", "propositional_logic", "maze", "bf"])
def test_hostile_completions_on_other_scorers(dataset):
    env = make_env(f"rg:{dataset}", timeout_s=2.0)
    task = env.sample(0, 1)[0]
    for text in HOSTILE:
        assert 0.0 <= env.verify(task, text) <= 1.0


@pytest.mark.slow
def test_every_dataset_scores_its_own_answer_and_survives_hostile_text():
    for d in DATASETS:
        env = make_env(f"rg:{d}", timeout_s=2.0)
        for t in env.sample(1, 2):
            if t.demonstration is not None:  # some datasets have no single answer (any valid solution)
                assert env.verify(t, t.demonstration) == 1.0, (d, t.task_id)
            for text in HOSTILE:  # returns: at most the time limit, and a restarted worker's start
                assert 0.0 <= env.verify(t, text) <= 1.0, (d, repr(text)[:80])


def test_verification_info_cannot_forge_the_entry():
    """The scorer's entry is generated again from the seed and index and checked against the task's identity: a
    task whose info was edited (a different answer, index, seed or dataset) scores 0, and nothing raises."""
    env = make_env("rg:chain_sum")
    t = env.sample(0, 1)[0]
    vi = t.verification_info
    assert env.verify(t, "<answer>999999</answer>") == 0.0
    forged = [{**vi, "answer": "999999"}, {**vi, "index": (vi["index"] + 1) % 512}, {**vi, "seed": vi["seed"] + 1},
              {**vi, "dataset": "gcd"}, {**vi, "index": 10**9}, {**vi, "seed": "1"}, {**vi, "key": None}, {}]
    for info in forged:
        f = Task(task_id=t.task_id, env=t.env, prompt=t.prompt, verification_info=info, task_type=t.task_type)
        assert env.verify(f, "<answer>999999</answer>") == 0.0  # the info's own answer is never scored against
        # only the answer edited: the regenerated entry is still this task, and its own answer scores
        assert env.verify(f, t.demonstration) == (1.0 if info is forged[0] else 0.0)
    # tasks survive a JSON round trip (a `swarmrl filter` task list)
    back = Task(**{**t.__dict__, "verification_info": json.loads(json.dumps(vi))})
    assert env.verify(back, t.demonstration) == 1.0


def test_clear_errors_for_bad_names_and_params():
    with pytest.raises(KeyError, match="did you mean rg:chain_sum"):
        make_env("rg:chain_summ")
    with pytest.raises(KeyError, match="not available: .*hash seed"):
        make_env("rg:word_ladder")
    with pytest.raises(ValueError, match="no parameter 'min_term' .*did you mean min_terms"):
        make_env("rg:chain_sum", min_term=3)
    with pytest.raises(ValueError, match="bad parameters .*max_terms must be >= min_terms"):
        make_env("rg:chain_sum", min_terms=5, max_terms=2)
    with pytest.raises(ValueError, match="bad parameters"):
        make_env("rg:chain_sum", min_terms="two")
    with pytest.raises(ValueError, match="'seed' is not a task parameter"):
        make_env("rg:chain_sum", seed=3)
    with pytest.raises(ValueError, match="answer must be one of"):
        make_env("rg:chain_sum", answer="last_word")
    with pytest.raises(ValueError, match="prompt must contain"):
        make_env("rg:chain_sum", prompt="{question} {expr}")
    with pytest.raises(ValueError, match="heldout_pct"):
        make_env("rg:chain_sum", heldout_pct=0)
    with pytest.raises(ValueError, match="not available"):
        RGEnv("composite")
    # a string names an enum member (word_sorting's config insists on the member); a list stands for a tuple
    words = make_env("rg:word_sorting", transformation="uppercase").sample(0, 4)
    assert all(t.verification_info["answer"] == t.verification_info["answer"].upper() for t in words)
    with pytest.raises(ValueError, match="transformation must be one of .*uppercase"):
        make_env("rg:word_sorting", transformation="shouting")

    def ops(env: RGEnv) -> set[str]:
        return {w for t in env.sample(0, 16) for w in t.prompt.split("\n")[0].split() if w in ("+", "-", "*", "/")}

    assert ops(make_env("rg:basic_arithmetic", operators=["+"], min_terms=2, max_terms=2)) == {"+"}
    assert len(ops(make_env("rg:basic_arithmetic", min_terms=2, max_terms=2))) > 1


def _wrapper_run(argv: list[str]) -> tuple[str, list[str]]:
    code = ("import sys, json\nsys.argv = ['swarmrl', *json.loads(sys.argv[1])]\nfrom swarmrl.cli import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('@@' + json.dumps([m for m in ('reasoning_gym', 'matplotlib') if m in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out, loaded = proc.stdout.rsplit("@@", 1)
    return out, json.loads(loaded)


def test_cli_tasks_lists_rg_names_without_importing_reasoning_gym():
    out, loaded = _wrapper_run(["tasks"])
    names = out.split()
    assert "rg:chain_sum" in names and "mul_add" in names and "vf:<env_id>" in names  # the verifiers prefix, named
    assert {f"rg:{d}" for d in DATASETS} <= set(names) and "rg:n_queens" not in names
    assert loaded == []


def test_cli_eval_on_an_rg_task(tiny_model_dir):
    from typer.testing import CliRunner

    from swarmrl.cli import app

    r = CliRunner().invoke(app, ["eval", "--model", str(tiny_model_dir), "--task", "rg:chain_sum", "--n", "6",
                                 "--set", "task.params.max_terms=3"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["task"] == "rg:chain_sum" and res["n"] == 6 and 0.0 <= res["accuracy"] <= 1.0
    assert "eval: task rg:chain_sum" in r.stderr


def test_validator_accepts_honest_rows_of_an_rg_task():
    """Rows a node scores for an rg task (right, wrong and partly right answers) pass the validator's task and
    reward checks; a forged reward does not."""
    from swarmrl.inference.prompts import decode_completion, encode_prompt
    from swarmrl.models import build_char_tokenizer
    from swarmrl.protocol.config import ValidatorConfig
    from swarmrl.protocol.schemas import AssignmentSpec, PendingSubmission, SubmissionInfo, TaskSpec
    from swarmrl.protocol.validator import CheckContext, check_rewards, check_tasks

    tok = build_char_tokenizer()
    task = TaskConfig(name="rg:chain_sum", params={"max_terms": 3, "heldout_pct": 20.0})
    seed = 424242
    tasks = assigned_tasks(task.name, task.params, seed, 3)
    a = AssignmentSpec(assignment_id=1, step=3, policy_version=3, seed=seed,
                       contract=RLContract(task=task, group_size=3), target_length=None,
                       tasks=[TaskSpec(task_id=t.task_id, prompt=t.prompt) for t in tasks])
    comps = []
    for t in tasks:
        gold = t.verification_info["answer"]
        for text in (t.demonstration, "<answer>no idea</answer>", f"<answer>{gold} or so</answer>"):
            comps.append(tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])
    samples = Samples(prompt_ids=[encode_prompt(tok, t.prompt) for t in tasks for _ in range(3)],
                      completion_ids=comps, logprobs=[[-1.0] * len(c) for c in comps], finished=[True] * len(comps))
    batch = score_groups(env=make_env(task.name, **task.params), tasks=tasks, budgets=[None] * 3, group_size=3,
                         samples=samples, decode=lambda ids: decode_completion(tok, ids),
                         origin=RowOrigin("n" * 16, step=3, policy_version=3, seed=seed, temperature=1.0))
    rewards = [r.task_reward for r in batch.rows]
    assert rewards[0::3] == [1.0] * 3 and rewards[1::3] == [0.0] * 3 and all(0 < r < 1 for r in rewards[2::3])

    def ctx(rows):  # noqa: ANN001, ANN202
        sub = SubmissionInfo(submission_id=1, node_id="n" * 16, assignment_id=1, step=3, sha256="0" * 64, size=1,
                             n_rows=len(rows), status="pending", created_at=0.0)
        item = PendingSubmission(submission=sub, assignment=a, origin_node_id="n" * 16, current_step=3,
                                 current_policy_version=3)
        return CheckContext(rows=rows, item=item, cfg=ValidatorConfig(), tokenizer=tok)

    for check in (check_tasks, check_rewards):
        ok, reason = check(ctx(batch.rows))
        assert ok, reason
    forged = [type(r)(**r.__dict__) for r in batch.rows]
    forged[1].task_reward, forged[1].reward = 1.0, 1.0
    ok, reason = check_rewards(ctx(forged))
    assert not ok and reason.startswith("row 1:"), reason
