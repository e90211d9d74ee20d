"""LoRA policy versions on the consumers' side: a holder merges an adapter onto the base it holds (from the run dir
or through SHARDCAST), refuses a hostile one (names, shapes, base hash, size) before applying anything, the
validator's logprob and TOPLOC checks reject a node that samples with the base while claiming the adapter's
version, and `swarmrl model export` writes the merged model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from swarmrl.contract import RLContract, Rollout
from swarmrl.envs.config import TaskConfig
from swarmrl.inference.sampler import SamplingParams, generate
from swarmrl.models import load_model, load_tokenizer
from swarmrl.models.adapter_file import ADAPTER_FILE, META_KEY, AdapterRefused
from swarmrl.models.lora import read_adapter, state_hash
from swarmrl.policy.holder import PolicyHolder
from swarmrl.policy.sources import PolicyUnavailable, RunDirPolicySource, ShardcastPolicySource
from swarmrl.protocol.checks import CheckContext, logprob_check, toploc_check
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.protocol.schemas import AssignmentSpec, PendingSubmission, SubmissionInfo, TaskSpec
from swarmrl.protocol.validator import Validator
from swarmrl.rl.config import LoraSection
from swarmrl.rl.lora import LoraPolicy
from swarmrl.rundir.writer import RunDir
from swarmrl.shardcast import Origin

torch.set_num_threads(1)
IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _policy_dir(tmp_path: Path, base: Path, rank: int = 4) -> tuple[RunDir, torch.Tensor]:
    """A run dir with v0 (the base) and v1 (an adapter with random factors); returns it and v1's logits as the
    trainer's peft model computes them (unmerged)."""
    run = RunDir(tmp_path / "run")
    shutil.copytree(base, run.policies.staging_dir(0), dirs_exist_ok=True)
    run.commit_version(0, run.policies.staging_path(0))
    model = load_model(base)
    lora = LoraPolicy.wrap(model, LoraSection(enabled=True, rank=rank, alpha=2.0 * rank), seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in lora.model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    logits = _logits(lora.model)
    lora.save(run.policies.staging_dir(1), load_tokenizer(base))
    run.commit_version(1, run.policies.staging_path(1))
    return run, logits


def test_a_holder_merges_the_adapter_onto_its_base(tmp_path, tiny_model_dir):
    run, want = _policy_dir(tmp_path, tiny_model_dir)
    holder = PolicyHolder(RunDirPolicySource(run.root), tiny_model_dir)
    assert (_logits(holder.load(1)) - want).abs().max() < 1e-5
    base = _logits(load_model(tiny_model_dir))
    assert (_logits(holder.load(0)) - base).abs().max() == 0
    assert (want - base).abs().max() > 1e-2  # the adapter changes the policy: the checks below can tell


def test_an_adapter_version_travels_through_shardcast(tmp_path, tiny_model_dir):
    run, want = _policy_dir(tmp_path, tiny_model_dir)
    origin = Origin(tmp_path / "origin", key=tmp_path / "origin.key", shard_size=1024)
    url = origin.serve()
    try:
        size = (run.version_dir(1) / ADAPTER_FILE).stat().st_size
        origin.publish_sync(run.version_dir(1) / ADAPTER_FILE, version=1)
        source = ShardcastPolicySource([url], origin.public_key, tmp_path / "cache", tiny_model_dir)
        d = source.fetch(1, timeout_s=20)
        assert (d / ADAPTER_FILE).stat().st_size == size and not (d / "model.safetensors").exists()
        assert source.take_fetch_report()["bytes"] == size
        holder = PolicyHolder(source, tiny_model_dir)
        assert (_logits(holder.load(1)) - want).abs().max() < 1e-5
    finally:
        origin.close()


def _rewrite(path: Path, fn) -> None:  # noqa: ANN001
    """Rewrite an adapter file through ``fn(tensors, meta)``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
    tensors = load_file(str(path))
    fn(tensors, meta)
    save_file(tensors, str(path), metadata=meta)


def _meta(**kw):  # noqa: ANN202
    def edit(tensors, meta) -> None:  # noqa: ANN001
        m = json.loads(meta[META_KEY])
        m.update(kw)
        meta[META_KEY] = json.dumps(m)
    return edit


def _first(key_part: str):  # noqa: ANN202
    def edit(tensors, meta) -> None:  # noqa: ANN001
        k = next(k for k in sorted(tensors) if key_part in k)
        tensors[k.replace("q_proj", "w_proj") if key_part == "rename" else k] = tensors.pop(k)
    return edit


HOSTILE = {
    "wrong base": (_meta(base_hash="ab" * 32), "different base model"),
    "wrong shape": (lambda t, m: t.update({k: torch.zeros(5, 64) for k in list(t)[:1]}), "shape"),
    "unknown layer": (lambda t, m: t.update({"base_model.model.model.layers.9.mlp.up_proj.lora_A.weight":
                                             torch.zeros(4, 64)}), "no linear layer"),
    "foreign name": (lambda t, m: t.update({"model.embed_tokens.weight": torch.zeros(4, 64)}), "unexpected tensor"),
    "untargeted layer": (_meta(target_modules=["q_proj"]), "not among the adapter's target_modules"),
    "lone factor": (lambda t, m: t.pop(next(k for k in sorted(t) if "lora_B" in k)), "only one LoRA factor"),
    "rank too high": (_meta(rank=100_000), "rank 100000 outside"),
    "not finite": (lambda t, m: next(v for v in t.values()).view(-1).__setitem__(0, float("nan")), "not finite"),
    "no settings": (lambda t, m: m.pop(META_KEY), None),  # no metadata: read as full weights, which do not fit
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_adapter_is_refused_clearly(tmp_path, tiny_model_dir, case):
    run, _ = _policy_dir(tmp_path, tiny_model_dir)
    edit, why = HOSTILE[case]
    _rewrite(run.version_dir(1) / ADAPTER_FILE, edit)
    holder = PolicyHolder(RunDirPolicySource(run.root), tiny_model_dir)
    with pytest.raises(PolicyUnavailable, match=why or "does not match the model") as e:
        holder.load(1)
    assert why is None or "LoRA adapter refused" in str(e.value)
    assert (_logits(holder.model) - _logits(load_model(tiny_model_dir))).abs().max() == 0  # nothing was applied


def test_an_oversize_adapter_is_refused_before_it_is_read(tmp_path, tiny_model_dir):
    run, _ = _policy_dir(tmp_path, tiny_model_dir)
    base = load_model(tiny_model_dir).state_dict()
    path = run.version_dir(1) / ADAPTER_FILE
    with pytest.raises(AdapterRefused, match="over the"):
        read_adapter(path, base, state_hash(base), max_bytes=path.stat().st_size - 1)
    with open(path, "ab") as f:  # past what any adapter of this base can weigh (rank 256 on every matrix)
        f.truncate(64 << 20)
    with pytest.raises(PolicyUnavailable, match="over the"):
        PolicyHolder(RunDirPolicySource(run.root), tiny_model_dir).load(1)


def _pending(a: AssignmentSpec, n: int) -> PendingSubmission:
    sub = SubmissionInfo(submission_id=1, node_id="n" * 16, assignment_id=a.assignment_id, step=a.step,
                         sha256="0" * 64, size=1, n_rows=n, status="pending", created_at=0.0)
    return PendingSubmission(submission=sub, assignment=a, origin_node_id="n" * 16, current_step=a.step,
                             current_policy_version=a.step)


def _rows(model: torch.nn.Module, tok, seed: int) -> list[Rollout]:  # noqa: ANN001
    from swarmrl.toploc import build_proofs

    prompts = [tok.encode(p, add_special_tokens=False) for p in ("1+2=", "3+4=", "5+1=", "2+2=")]
    out = generate(model, prompts, SamplingParams(max_new_tokens=10, temperature=1.0), tok.eos_token_id,
                   tok.pad_token_id, capture_hidden=True, generator=torch.Generator().manual_seed(seed))
    return [Rollout(worker_id="n" * 16, step=1, policy_version=1, task_id=f"t{i}", env="add", group_id=f"g{i}",
                    prompt_ids=p, completion_ids=c, logprobs=lp, reward=0.0, task_reward=0.0, length_penalty=0.0,
                    target_length=None, temperature=1.0, finished=fin, seed=0,
                    proofs=build_proofs(h))
            for i, (p, c, lp, fin, h) in enumerate(zip(out.prompt_ids, out.completion_ids, out.logprobs,
                                                       out.finished, out.hidden))]


def test_the_validator_rejects_base_samples_claiming_the_adapter_version(tmp_path, tiny_model_dir):
    """A node that skips applying the adapter (samples with the base it holds) while claiming version 1 fails the
    logprob and TOPLOC checks; the node that applied it passes both (the validator merges it the same way)."""
    run, _ = _policy_dir(tmp_path, tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    cfg = ValidatorConfig(run_secret="test-secret", work_dir=str(tmp_path / "v"), model_dir=str(tiny_model_dir),
                          model_dir_template=run.version_template(), logprob_rows=4)
    val = Validator(cfg, client=object())
    node = PolicyHolder(RunDirPolicySource(run.root), tiny_model_dir)
    honest = _rows(node.load(1), tok, seed=3)
    lazy = _rows(load_model(tiny_model_dir), tok, seed=3)
    a = AssignmentSpec(assignment_id=1, step=1, policy_version=1, seed=0,
                       contract=RLContract(task=TaskConfig(name="add"), group_size=2,
                                           sampling={"max_new_tokens": 10}), target_length=None,
                       tasks=[TaskSpec(task_id=f"t{i}", prompt="x") for i in range(4)])
    for name, check in (("logprobs", logprob_check(cfg)), ("toploc", toploc_check(cfg))):
        ok, reason = check(CheckContext(rows=honest, item=_pending(a, 4), cfg=cfg, tokenizer=tok,
                                        model_loader=val.load_model, settings_loader=val._toploc_settings))
        assert ok, (name, reason)
        ok, reason = check(CheckContext(rows=lazy, item=_pending(a, 4), cfg=cfg, tokenizer=tok,
                                        model_loader=val.load_model, settings_loader=val._toploc_settings))
        assert not ok and reason.startswith("row "), (name, reason)


def test_model_export_writes_the_merged_model(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from swarmrl.cli import app

    run, want = _policy_dir(tmp_path, tiny_model_dir)
    out = tmp_path / "merged"
    res = CliRunner().invoke(app, ["model", "export", "--base", str(tiny_model_dir), "--adapter",
                                   str(run.version_dir(1)), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (_logits(load_model(out)) - want).abs().max() < 1e-5
    res = CliRunner().invoke(app, ["model", "export", "--base", str(tiny_model_dir), "--adapter",
                                   str(run.version_dir(0)), "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "holds no LoRA adapter" in res.output


def test_eval_of_an_adapter_version_scores_the_merged_model(tmp_path, tiny_model_dir):
    """``swarmrl eval --model RUN/policy/vN`` of a LoRA run: the adapter merged onto the base rl.toml names."""
    import json

    from typer.testing import CliRunner

    from swarmrl.cli import app

    run, _ = _policy_dir(tmp_path, tiny_model_dir)
    merged = tmp_path / "merged"
    assert CliRunner().invoke(app, ["model", "export", "--base", str(tiny_model_dir), "--adapter",
                                    str(run.version_dir(1)), "--out", str(merged)]).exit_code == 0
    args = ["eval", "--task", "add", "--n", "16", "--set", "max_new_tokens=3"]
    alone = CliRunner().invoke(app, [*args, "--model", str(run.version_dir(1))])
    assert alone.exit_code != 0 and "no run's rl.toml around it names its base" in alone.output
    (run.root / "rl.toml").write_text(f'model = "{tiny_model_dir}"\n[contract.task]\nname = "add"\n')
    got = CliRunner().invoke(app, [*args, "--model", str(run.version_dir(1))])
    want = CliRunner().invoke(app, [*args, "--model", str(merged)])
    assert got.exit_code == 0 and want.exit_code == 0, (got.output, want.output)
    last = [json.loads(r.stdout.strip().splitlines()[-1]) for r in (got, want)]
    assert last[0]["accuracy"] == last[1]["accuracy"] and last[0]["model"] == str(run.version_dir(1))
