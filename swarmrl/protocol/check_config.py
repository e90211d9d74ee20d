"""The validator's configured check functions (``module:function`` specs: the TOPLOC check, the sampling claim and
check): importing them, and what is wrong with their configuration, refused at startup."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from swarmrl.contract.sampling import SamplingParams
from swarmrl.protocol.config import ValidatorConfig
from swarmrl.toploc.sampling_check import SamplingThresholds
from swarmrl.toploc.verify import Thresholds


def import_dotted(spec: str) -> Callable[..., Any]:
    """``module:function`` -> the function (ImportError naming what is missing)."""
    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name:
        raise ImportError(f"{spec!r} is not module:function")
    mod = importlib.import_module(mod_name)
    try:
        return getattr(mod, fn_name)
    except AttributeError:
        raise ImportError(f"{mod_name} has no {fn_name}") from None


def _binds(fn: Callable[..., Any], args: tuple, kw: dict[str, Any]) -> bool:
    """Whether ``fn(*args, **kw)`` binds (True when there is no signature to read)."""
    try:
        inspect.signature(fn).bind(*args, **kw)
    except TypeError:
        return False
    except ValueError:
        pass
    return True


def sampling_claimer(claim_fn: Callable[..., Any] | None, eos: int | None, sampling: SamplingParams,
                     single: Callable[[Any], bool]) -> Callable[[Any], Any]:
    """Row -> its sampling claim (None: none made): ``claim_fn(row, eos)``, given the contract's ``top_p`` and
    ``max_new_tokens`` where it takes them (a function of ``(row, eos)`` alone gets neither). The limit is claimed
    for a row where ``single(row)``: an episode's row is bounded by its trajectory, not per call (None)."""
    if claim_fn is None or eos is None:
        return lambda r: None
    takes = [k for k in ("top_p", "max_new_tokens") if _binds(claim_fn, (None, 0), {k: None})]

    def claim(r: Any) -> Any:
        one = "max_new_tokens" in takes and single(r)
        kw = {"top_p": sampling.top_p, "max_new_tokens": sampling.max_new_tokens if one else None}
        return claim_fn(r, eos, **{k: kw[k] for k in takes})

    return claim


_CALLS = {  # how each configured function is called: a misconfigured one is refused at startup
    "toploc_check": ("toploc_check(model, items, batch_size=...)", (None, []), {"batch_size": 1}),
    "sampling_claim": ("sampling_claim(row, eos_id)", (None, 0), {}),  # [top_p=, max_new_tokens=]: sampling_claimer
    "sampling_check": ("sampling_check(model, row)", (None, None), {}),
}


def configured_functions_problems(cfg: ValidatorConfig) -> list[str]:
    """What is wrong with the configuration of the checks, for the validator to refuse at startup: a configured
    ``module:function`` that does not import or cannot take the arguments it is called with (e.g.
    ``swarmrl.toploc:verify_rollout``, the one-row function, named as the batched ``toploc_check``), bad
    sampling thresholds, or ``require_proofs`` without the means to check proofs."""
    problems = []
    for name, (shown, args, kw) in _CALLS.items():
        spec = getattr(cfg, name)
        if not spec:
            continue
        try:
            fn = import_dotted(spec)
        except ImportError as e:
            problems.append(f"{name} = {spec!r}: cannot import it ({e})")
            continue
        if name == "toploc_check" and cfg.sampling_claim and cfg.sampling_thresholds:
            kw = {**kw, "sampling_thresholds": None}
        if name == "toploc_check" and cfg.toploc_thresholds:
            kw = {**kw, "thresholds": None}
        try:
            inspect.signature(fn).bind(*args, **kw)
        except TypeError as e:
            problems.append(f"{name} = {spec!r}: it is called as {shown}, which it does not take ({e})")
        except ValueError:  # no signature to read (a builtin): judged when it runs
            pass
    for name, model in (("sampling_thresholds", SamplingThresholds), ("toploc_thresholds", Thresholds)):
        try:
            model(**getattr(cfg, name))
        except ValueError as e:
            problems.append(f"{name}: {e}")
    if cfg.require_proofs and not cfg.toploc_check:
        problems.append("require_proofs = true needs a toploc_check")
    if cfg.require_proofs and not (cfg.model_dir or cfg.model_dir_template):
        problems.append("require_proofs = true needs model_dir or model_dir_template (the model that checks proofs)")
    return problems
