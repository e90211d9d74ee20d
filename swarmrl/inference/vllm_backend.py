"""The vLLM inference backend (optional: vLLM lives in its own environment, see docs/inference.md).

Requests go in as token ids (``TokensPrompt``), one ``vllm.SamplingParams`` each: the request's seed,
``logprobs=0`` (the sampled token's logprob only), ``ignore_eos`` plus ``stop_token_ids=[eos]`` (stop at the
tokenizer's EOS and nothing else, as ``ours`` does), no detokenizing. The engine is built with
``logprobs_mode="processed_logprobs"``: the logprob of the sampled token under logits / temperature (greedy:
temperature 1), which is ``ours``'s definition as long as ``top_p`` is 1 (vLLM renormalises over the nucleus,
``ours`` does not, so ``top_p < 1`` is refused here).

Final-norm hidden states for TOPLOC: inside the engine's worker (``collective_rpc`` with module-level
functions, so they pickle by reference) a forward hook on the model's final norm (``model.model.norm``) keeps,
for every request in every forward, the state of the request's last scheduled token keyed by that token's
position. The flattened batch is split with the runner's own bookkeeping for that step: its request order
(``input_batch.req_ids``) and the scheduler's per-request token counts (``num_scheduled_tokens``), never a
fixed prefill shape, so chunked prefill, prefix-cache hits and preemption-recompute are all covered. Completion
token i of a request with prompt length P came from position P - 1 + i, exactly what ``ours`` records and a
verifier's prefill yields. Requests are recognised by a tag in ``SamplingParams.extra_args``.

Weight updates reload the new policy directory in place through the worker's ``reload_weights`` (layerwise:
kernels that repack weights, such as the CPU GEMMs, are repacked), re-process an LM head tied to the embeddings
(it loads nothing of its own, so vLLM leaves its prepacked copy of the old embeddings in place: measured on CPU),
then reset the prefix cache.

Environment set before vLLM is imported (explicit values win only where noted): ``VLLM_CPU_KVCACHE_SPACE`` and
``VLLM_CPU_OMP_THREADS_BIND`` from the config, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine runs in this
process: hooks and results need no serialisation), ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (so the callables
still travel if someone turns multiprocessing back on) and ``VLLM_USE_V2_MODEL_RUNNER=0`` (the capture reads the V1
model runner's ``input_batch``/``requests``; vLLM may otherwise pick its V2 runner where Triton works), all three
as defaults.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from swarmrl.inference.backend import VLLM_INSTALL_HINT, BackendUnavailable, InferenceBackend, Weights
from swarmrl.inference.config import VLLMOptions
from swarmrl.inference.params import SamplingParams
from swarmrl.inference.sampler import SampleOutput

_TAG = "swarmrl"  # key in SamplingParams.extra_args: [call id, request index]
_ATTR = "_swarmrl_capture"  # the capture object, on the engine worker's model runner


def import_vllm() -> Any:
    """The ``vllm`` module, or ``BackendUnavailable`` with the one-line install hint."""
    try:
        import vllm  # noqa: PLC0415  # lazy: optional dependency, in its own environment
    except ImportError as e:
        raise BackendUnavailable(f"{VLLM_INSTALL_HINT} ({e})") from None
    return vllm


def vllm_env(opts: VLLMOptions) -> dict[str, str]:
    return {"VLLM_CPU_KVCACHE_SPACE": str(opts.kv_cache_space_gib), "VLLM_CPU_OMP_THREADS_BIND": opts.omp_threads_bind}


# ---- inside the engine's worker (called through collective_rpc: first argument is the worker) ----------------
class _Capture:
    """Final-norm states of the last scheduled token of every tagged request, per forward, keyed by position."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        model = runner.get_model()
        norm = getattr(getattr(model, "model", None), "norm", None)
        if not isinstance(norm, torch.nn.Module):
            raise RuntimeError(f"{type(model).__name__} has no final norm at model.model.norm to capture")
        if not hasattr(runner, "input_batch") or not hasattr(runner, "requests"):
            raise RuntimeError(f"{type(runner).__name__}: no input_batch/requests to split the batch by request "
                               "(hidden-state capture supports vLLM's V1 model runner)")
        self.active: int | None = None  # the call id being captured
        self.store: dict[int, dict[int, torch.Tensor]] = {}  # request index -> position -> state
        self.sched: Any = None
        self.positions: torch.Tensor | None = None
        self.keys: dict[str, tuple[int, int] | None] = {}
        self._execute = runner.execute_model
        runner.execute_model = self._execute_model  # instance attribute: the worker calls runner.execute_model
        self._hooks = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                       norm.register_forward_hook(self._post)]

    def _execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        self.sched = scheduler_output
        try:
            return self._execute(scheduler_output, *args, **kwargs)
        finally:
            self.sched = None
            self.positions = None

    def _pre(self, _mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        pos = kwargs.get("positions")
        self.positions = pos if pos is not None else (args[1] if len(args) > 1 else None)

    def _key(self, rid: str) -> tuple[int, int] | None:
        if rid not in self.keys:
            state = self.runner.requests.get(rid)
            extra = getattr(getattr(state, "sampling_params", None), "extra_args", None) or {}
            tag = extra.get(_TAG)
            self.keys[rid] = (int(tag[0]), int(tag[1])) if tag is not None else None
        return self.keys[rid]

    def _post(self, _mod: torch.nn.Module, _args: tuple, output: Any) -> None:
        if self.active is None or self.sched is None:
            return  # profiling / dummy runs, or nothing asked for
        hidden = output[0] if isinstance(output, tuple) else output
        if self.positions is None or self.positions.dim() != 1:
            raise RuntimeError("hidden-state capture needs the forward's 1-D positions")
        counts = self.sched.num_scheduled_tokens
        batch = self.runner.input_batch
        rows, keys, start = [], [], 0
        for rid in batch.req_ids[: batch.num_reqs]:
            n = int(counts.get(rid, 0))
            if n == 0:
                continue
            start += n
            key = self._key(rid)
            if key is not None and key[0] == self.active:
                rows.append(start - 1)
                keys.append(key[1])
        if start > hidden.shape[0] or start > self.positions.shape[0]:
            raise RuntimeError(f"scheduled {start} tokens but the forward saw {hidden.shape[0]}")
        if not rows:
            return
        idx = torch.tensor(rows, device=hidden.device)
        states = hidden.index_select(0, idx).to("cpu", torch.bfloat16)
        positions = self.positions.index_select(0, idx.to(self.positions.device)).tolist()
        for i, p, h in zip(keys, positions, states):
            self.store.setdefault(i, {})[int(p)] = h.clone()


def _capture_begin(worker: Any, call: int) -> None:
    runner = worker.model_runner
    cap = getattr(runner, _ATTR, None)
    if cap is None:
        cap = _Capture(runner)
        setattr(runner, _ATTR, cap)
    cap.active, cap.store, cap.keys = call, {}, {}


def _capture_end(worker: Any) -> dict[int, dict[int, torch.Tensor]]:
    cap = getattr(worker.model_runner, _ATTR)
    out, cap.active, cap.store, cap.keys = cap.store, None, {}, {}
    return out


def _retie_head(worker: Any) -> bool:
    """After an in-place reload: an LM head tied to the embeddings loads no weights of its own, so the reload leaves
    its kernel state alone; where that state is a prepacked copy (the CPU GEMMs) it still holds the old embeddings.
    Re-run its post-load processing over the (new) shared weight. Returns whether there was a tied head."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    hw, ew = getattr(head, "weight", None), getattr(embed, "weight", None)
    if hw is None or ew is None or hw.numel() == 0 or hw.data_ptr() != ew.data_ptr():
        return False
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)
    return True


# ---- the backend ------------------------------------------------------------------------------------------------
class VLLMBackend(InferenceBackend):
    name = "vllm"

    def __init__(self, model_dir: str | Path, opts: VLLMOptions, *, eos_id: int, pad_id: int, seed: int = 0) -> None:
        super().__init__(eos_id, pad_id)
        for k, v in vllm_env(opts).items():
            os.environ[k] = v
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the capture splits batches with V1's bookkeeping
        vllm = import_vllm()
        self._vllm = vllm
        self.opts = opts
        kwargs: dict[str, Any] = {"max_model_len": opts.max_model_len, "max_num_seqs": opts.max_num_seqs}
        self.llm = vllm.LLM(model=str(model_dir), skip_tokenizer_init=True, dtype=opts.dtype,
                            enforce_eager=opts.enforce_eager, seed=seed, logprobs_mode="processed_logprobs",
                            gpu_memory_utilization=opts.gpu_memory_utilization,
                            enable_prefix_caching=opts.enable_prefix_caching,
                            **{k: v for k, v in kwargs.items() if v is not None})
        self._rng = random.Random(seed)
        self._calls = itertools.count()

    def _params(self, params: SamplingParams, seed: int, tag: list[int]) -> Any:
        return self._vllm.SamplingParams(n=1, max_tokens=params.max_new_tokens, temperature=params.temperature,
                                         top_p=1.0, seed=seed, logprobs=0, ignore_eos=True,
                                         stop_token_ids=[self.eos_id] if self.eos_id >= 0 else [], detokenize=False,
                                         extra_args={_TAG: tag})

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, *,
                 seeds: Sequence[int] | None = None, capture_hidden: bool = False) -> SampleOutput:
        self._check_seeds(prompt_ids, seeds)
        if not prompt_ids:
            return SampleOutput([], [], [], [], [] if capture_hidden else None)
        if params.top_p < 1.0:
            raise ValueError("the vllm backend needs top_p = 1: vLLM's logprobs are renormalised over the nucleus, "
                             "the trainer's are not")
        if capture_hidden and not self.opts.enforce_eager:
            raise ValueError("hidden-state capture (TOPLOC proofs) needs inference.vllm.enforce_eager = true")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt")
        if seeds is None:
            seeds = [self._rng.getrandbits(62) for _ in prompt_ids]
        call = next(self._calls)
        sps = [self._params(params, int(s), [call, i]) for i, s in enumerate(seeds)]
        prompts = [self._vllm.TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompt_ids]
        states = None
        if capture_hidden:
            self.llm.collective_rpc(_capture_begin, args=(call,))
        try:
            outs = self.llm.generate(prompts, sps, use_tqdm=False)
        finally:
            if capture_hidden:
                states = self.llm.collective_rpc(_capture_end)[0]
        return self._sample_output(prompt_ids, outs, states)

    def _sample_output(self, prompt_ids: Sequence[Sequence[int]], outs: list, states: dict | None) -> SampleOutput:
        comp, logps, fin, hidden = [], [], [], []
        for i, (prompt, out) in enumerate(zip(prompt_ids, outs)):
            c = out.outputs[0]
            ids = [int(t) for t in c.token_ids]
            if c.logprobs is None or len(c.logprobs) < len(ids):
                raise RuntimeError("vLLM returned no logprob for some sampled tokens")
            comp.append(ids)
            logps.append([float(c.logprobs[j][t].logprob) for j, t in enumerate(ids)])
            fin.append(bool(ids) and ids[-1] == self.eos_id)
            if states is not None:
                by_pos = states.get(i, {})
                want = range(len(prompt) - 1, len(prompt) - 1 + len(ids))
                missing = [p for p in want if p not in by_pos]
                if missing:
                    raise RuntimeError(f"request {i}: no captured hidden state at positions {missing[:5]}")
                hidden.append(torch.stack([by_pos[p] for p in want]))  # max_tokens >= 1: never empty
        return SampleOutput([list(p) for p in prompt_ids], comp, logps, fin, hidden if states is not None else None)

    def update_weights(self, weights: Weights) -> None:
        """Reload in place: a policy directory through vLLM's own loader, or a state dict's tensors."""
        if isinstance(weights, (str, Path)):
            kwargs: dict[str, Any] = {"weights_path": str(Path(weights).resolve())}
        else:
            kwargs = {"weights_iterator": list(weights.items())}
        self.llm.collective_rpc("reload_weights", kwargs={**kwargs, "is_checkpoint_format": True})
        self.llm.collective_rpc(_retie_head)
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
