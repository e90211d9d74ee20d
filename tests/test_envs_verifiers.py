"""Verifiers: right, wrong, malformed and hostile answers for arithmetic, math and code."""

from __future__ import annotations

import pytest

from swarmrl.envs import make_env
from swarmrl.envs.base import Task
from swarmrl.envs.code import CodeEnv, extract_program, outputs_match, split_assert_tests
from swarmrl.envs.math import MathEnv, answers_equal, extract_boxed


# --- arithmetic ---------------------------------------------------------------------------------
def test_arithmetic_verifier():
    env = make_env("mul_add")
    t = env.sample(0, 1)[0]
    ans = t.verification_info["answer"]
    assert env.verify(t, str(ans)) == 1.0
    assert env.verify(t, f" {ans} ") == 1.0
    assert env.verify(t, str(ans + 1)) == 0.0
    for bad in ["", "abc", f"{ans}x", f"{ans} {ans}", "1e3", "\x00", "9" * 100_000]:
        assert env.verify(t, bad) == 0.0
    broken = Task(task_id="x", env="mul_add", prompt="1+1=", verification_info={}, task_type="arithmetic")
    assert env.verify(broken, "2") == 0.0


# --- math ---------------------------------------------------------------------------------------
def math_task(gt: str) -> Task:
    return Task(task_id="math:t", env="math", prompt="p", verification_info={"ground_truth": gt},
                task_type="verifiable_math")


@pytest.fixture(scope="module")
def menv():
    return MathEnv(timeout_s=2.0)


def test_extract_boxed():
    assert extract_boxed(r"so \boxed{1} then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\fbox{7}") == "7"
    assert extract_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"
    assert extract_boxed(r"\boxed {x^{2}}") == "x^{2}"
    assert extract_boxed(r"\boxed{1} and \boxed{2") == "1"  # the unbalanced last one is skipped
    assert extract_boxed("no answer") is None
    assert extract_boxed(r"\boxed{" + "{" * 1000 + "}" * 1000 + "}") is None  # too deep
    assert extract_boxed(None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("gold,pred", [
    (r"\frac{1}{2}", "0.5"), (r"\frac{1}{2}", "1/2"), (r"\frac{1}{2}", r"\dfrac{1}{2}"), ("391", "391"),
    ("x^2+6x+9", "(x+3)^2"), ("5\\sqrt{2}", "\\sqrt{50}"), ("(-2,2)", "(-2, 2)"), ("[2,\\infty)", "[2, \\infty)"),
    (r"\{2,3\}", r"\{3,2\}"), ("9\\pi", "9\\pi"), ("-8", "-8.0"),
])
def test_math_equal(gold, pred):
    assert answers_equal(gold, pred, timeout=10)


@pytest.mark.parametrize("gold,pred", [
    (r"\frac{1}{2}", "0.51"), ("391", "392"), ("x^2+6x+9", "(x+3)^3"), ("(-2,2)", "[-2,2]"), ("[2,\\infty)", "(2,\\infty)"),
    (r"\{2,3\}", r"\{2\}"), ("9\\pi", "9"), ("1", ""), ("1", "\\frac{1}{0}"),
])
def test_math_not_equal(gold, pred):
    assert not answers_equal(gold, pred, timeout=10)


def test_math_verify_right_wrong_malformed(menv):
    t = math_task(r"\frac{1}{2}")
    assert menv.verify(t, r"Half of it: $\boxed{\frac{1}{2}}$.") == 1.0
    assert menv.verify(t, r"\boxed{0.5}") == 1.0
    assert menv.verify(t, r"\boxed{\frac{1}{3}}") == 0.0
    assert menv.verify(t, r"the answer is 1/2") == 0.0  # not boxed
    for bad in [r"\boxed{", r"\boxed{\frac{1}{", r"\boxed{}", r"\boxed{\\\\}", "}}}{{{", "\x00\\boxed{\x00}", ""]:
        assert menv.verify(t, bad) == 0.0
    assert menv.verify(math_task(""), r"\boxed{1}") == 0.0
    assert menv.verify(Task("m", "math", "p", {}, "verifiable_math"), r"\boxed{1}") == 0.0


def test_math_hostile_answers_are_bounded(menv):
    t = math_task("10")
    hostile = [r"\boxed{10^{10^{10}}}", r"\boxed{9^{9^{9^{9^{9}}}}-9^{9^{9^{9^{9}}}}+10}", "\\boxed{10**10**10}",
               r"\boxed{" + "(" * 300 + "10" + ")" * 300 + "}", r"\boxed{" + "1+" * 5000 + "1}",
               "x" * 10_000_000 + r"\boxed{" + "{" * 20 + "}" * 20 + "}"]
    for h in hostile:  # returns: bounded by the checker's time limit, not by the input
        assert menv.verify(t, h) == 0.0
    assert menv.verify(t, r"\boxed{10}") == 1.0  # the checker still works afterwards
    assert menv.verify(math_task("x^2+2x+1"), r"\boxed{(x+1)^2}") == 1.0


def test_math_only_tail_is_parsed():
    env = MathEnv(max_completion_chars=100)
    t = math_task("3")
    assert env.verify(t, r"\boxed{3}" + " " * 200) == 0.0
    assert env.verify(t, " " * 200 + r"\boxed{3}") == 1.0


# --- code ---------------------------------------------------------------------------------------
def code_task(vi: dict) -> Task:
    return Task(task_id="code:t", env="code", prompt="p", verification_info=vi, task_type="verifiable_code")


@pytest.fixture(scope="module")
def cenv():
    return CodeEnv(wall_s=2.0, cpu_s=2)


def test_extract_program():
    assert extract_program("text\n```python\nprint(1)\n```\nmore\n```python\nprint(2)\n```") == "print(2)\n"
    assert extract_program("```py\nx=1\n```") == "x=1\n"
    assert extract_program("```\nx=2\n```") == "x=2\n"
    assert extract_program("```python\nprint(1)\n```\n```text\nnot code\n```") == "print(1)\n"
    assert extract_program("plan:\n```python\nprint(3)\n") == "print(3)\n"  # unterminated
    assert extract_program("print(4)") == "print(4)"


def test_outputs_match():
    assert outputs_match("1 2\n3  \n\n", "1 2\n3")
    assert outputs_match("0.3333333", "0.33333333")
    assert not outputs_match("1 2", "1 3")
    assert not outputs_match("1.0 2", "1.0")


def test_split_assert_tests():
    prelude, tests = split_assert_tests("import math\nassert f(1) == 1\nassert f(2) == 4")
    assert prelude == "import math" and tests == ["assert f(1) == 1", "assert f(2) == 4"]


def test_code_stdio_right_wrong_partial(cenv):
    t = code_task({"language": "python", "test_cases": [
        {"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]})
    assert cenv.verify(t, "```python\na, b = map(int, input().split())\nprint(a + b)\n```") == 1.0
    assert cenv.verify(t, "```python\nprint(3)\n```") == 0.5
    assert cenv.verify(t, "```python\nprint(0)\n```") == 0.0
    assert CodeEnv(all_or_nothing=True).verify(t, "```python\nprint(3)\n```") == 0.0
    for bad in ["", "```python\n", "```python\ndef (:\n```", "\x00\x01", "```python\nraise SystemExit(3)\n```",
                "```python\nimport sys; print(3); sys.exit(1)\n```"]:
        assert cenv.verify(t, bad) == 0.0


def test_code_call_tests(cenv):
    t = code_task({"fn_name": "add", "test_cases": [{"input": "[1, 2]", "output": "3"}, {"input": [2, 2], "output": 4}]})
    assert cenv.verify(t, "def add(a, b):\n    return a + b") == 1.0
    assert cenv.verify(t, "def add(a, b):\n    return 3") == 0.5
    assert cenv.verify(t, "def add(a, b):\n    return object()") == 0.0  # not JSON
    # an always-equal object cannot fool call tests: the value is compared as JSON on the host
    assert cenv.verify(t, "class E:\n    def __eq__(s, o): return True\ndef add(a, b):\n    return E()") == 0.0
    assert cenv.verify(t, "def sub(a, b):\n    return a - b") == 0.0


def test_code_assert_tests(cenv):
    t = code_task({"tests": "import math\nassert sq(2) == 4\nassert sq(3) == 9\nassert math.isclose(sq(0.5), 0.25)"})
    assert cenv.verify(t, "```python\ndef sq(x):\n    return x * x\n```") == 1.0
    assert cenv.verify(t, "```python\ndef sq(x):\n    return 4\n```") == pytest.approx(1 / 3)
    assert cenv.verify(t, "```python\nimport os\ndef sq(x):\n    return x\nos._exit(0)\n```") == 0.0
    t2 = code_task({"tests": ["assert sq(2) == 4", "assert sq(-1) == 1"]})
    assert cenv.verify(t2, "def sq(x): return x ** 2") == 1.0


def test_code_bad_verification_info(cenv):
    assert cenv.verify(code_task({}), "print(1)") == 0.0
    assert cenv.verify(code_task({"language": "cpp", "test_cases": [{"input": "", "output": ""}]}), "x") == 0.0
    assert cenv.verify(code_task({"test_cases": "not json"}), "x") == 0.0
    assert cenv.verify(code_task({"tests": "assert ("}), "x") == 0.0


def test_code_oversized_completion(cenv):
    t = code_task({"test_cases": [{"input": "", "output": "1\n"}]})
    assert cenv.verify(t, "print(1)\n#" + "x" * (cenv.max_completion_chars + 10)) == 0.0


def test_sympy_fallback_is_whitelisted(tmp_path):
    import importlib.util
    from pathlib import Path

    import swarmrl.envs.math as m

    path = Path(m.__file__).with_name("_mathcheck_worker.py")
    spec = importlib.util.spec_from_file_location("_mathcheck_worker_test", path)
    w = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
    assert w._sympy_equal(r"\frac{1}{3}+x", "x+1/3")
    assert w._sympy_equal("x^2+2x+1", "(x+1)^2")
    assert not w._sympy_equal("2x", "3x")
    marker = tmp_path / "pwned"
    for evil in [f"__import__('os').system('touch {marker}')", "().__class__.__bases__", "exec(1)", "open(1)"]:
        assert w._latex_to_expr(evil) is None
        assert not w._sympy_equal(evil, "1")
    assert not marker.exists()
