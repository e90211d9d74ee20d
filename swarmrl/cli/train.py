"""`swarmrl sft` and `swarmrl eval`."""

# No `from __future__ import annotations` here: typer would eval every command's string annotations
# when it builds the command tree, on every start (`swarmrl --help` included).

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarmrl.cli.common import (
    ConfigOpt,
    PrintOpt,
    SetOpt,
    backend_errors,
    console,
    fail,
    opt,
    require_model_dir,
    resolve,
)

_MODEL_HINT = "--model: an HF model dir, a run dir or one of its policy versions"


def sft(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
        model: Annotated[Optional[str], typer.Option(help="Start from this HF model dir (default: fresh tiny model).")] = None,
        task: Annotated[Optional[str], typer.Option(help="Task name (see `swarmrl tasks`).")] = None,
        out: Annotated[Optional[Path], typer.Option(help="Output directory.")] = None,
        minutes: Annotated[Optional[float], typer.Option(help="Training wall-clock budget.")] = None) -> None:
    """Supervised warm start on a task's demonstrations; saves OUT/model and OUT/metrics.jsonl.

    --config takes an sft config or the run config of `swarmrl run` (configs/run.toml): then the run's warm start
    ([warmstart.sft]) on the run's task, params and chat template; options and --set still win."""
    from swarmrl.job.commands import sft_settings  # noqa: PLC0415  # lazy: startup
    from swarmrl.sft.config import SFTConfig  # noqa: PLC0415  # lazy: startup

    extra = opt("model", model) + opt("task.name", task) + opt("out", out) + opt("minutes", minutes)
    cfg = resolve(SFTConfig, config, set_, extra, print_config, from_run=sft_settings)
    if cfg.model is not None:
        require_model_dir(cfg.model, "--model: an HF model dir to start from, or none for a fresh tiny model")
    from swarmrl.sft.train import run_sft  # noqa: PLC0415  # lazy: startup

    def progress(row: dict) -> None:
        msg = f"sft step {row['step']:>5}  {row['train_s']:>6.1f}s  loss {row['loss']:.4f}"
        if "heldout_acc" in row:
            msg += f"  held-out acc {row['heldout_acc']:.3f}"
        console.print(msg, highlight=False)

    summary = run_sft(cfg, progress)
    typer.echo(json.dumps(summary, indent=2))


def _recorded(model: Path) -> tuple[Path, dict] | None:
    """The task and evaluation settings recorded next to ``model``: the ``rl.toml`` of the run dir it belongs to
    (``model`` = RUN, RUN/final_model or RUN/policy/vN) or the ``summary.json`` of the ``swarmrl sft`` output it
    is the model of (OUT/model). Returns (the file, {task, chat_template, limits: the run's eval token limits})
    or None."""
    import tomllib  # noqa: PLC0415  # lazy: startup

    from swarmrl.inference.params import TokenLimits  # noqa: PLC0415  # lazy: startup

    for d in (model, model.parent, model.parent.parent):
        rl, sft = d / "rl.toml", d / "summary.json"
        try:
            if rl.is_file():
                data = tomllib.loads(rl.read_text(encoding="utf-8"))
                contract = data.get("contract") if isinstance(data.get("contract"), dict) else {}
                if isinstance(contract.get("task"), dict):
                    ev = data.get("eval") if isinstance(data.get("eval"), dict) else {}
                    limits = {k: v for k, v in ev.items() if k in TokenLimits.model_fields}
                    return rl, {"task": contract["task"], "chat_template": contract.get("chat_template"),
                                "limits": TokenLimits.model_validate(limits) if limits else None}
            if sft.is_file():
                data = json.loads(sft.read_text(encoding="utf-8"))
                if isinstance(data, dict) and isinstance(data.get("task"), dict):
                    return sft, {"task": data["task"], "chat_template": data.get("chat_template")}
        except (OSError, ValueError):  # unreadable or not TOML / JSON: nothing recorded
            continue
    return None


def _model_of_run(model: Path) -> Path:
    """A run dir given as --model stands for its final model (or its newest policy version)."""
    if (model / "rl.toml").is_file() and not (model / "config.json").is_file():
        if (model / "final_model" / "config.json").is_file():
            return model / "final_model"
        from swarmrl.rundir import RunLayout  # noqa: PLC0415  # lazy: startup

        run = RunLayout(model)
        latest = run.latest_file
        if latest.is_file() and latest.read_text().strip().isdigit():
            return run.version_dir(int(latest.read_text().strip()))
    return model


def apply_recorded(cfg, explicit_task: bool) -> str:  # noqa: ANN001
    """Eval defaults from what ``cfg.model``'s run recorded: its task and params (unless the task name was given
    and differs; explicit params always win), chat template and answer length, each unless set explicitly.
    Updates ``cfg`` in place; returns the line saying which task is used and where it came from."""
    from swarmrl.envs.config import TaskConfig  # noqa: PLC0415  # lazy: startup

    model = _model_of_run(Path(cfg.model))
    if str(model) != cfg.model:
        cfg.model = str(model)
    rec = _recorded(model)
    t = cfg.task
    name_set = explicit_task and "name" in t.model_fields_set
    params_set = explicit_task and "params" in t.model_fields_set
    if rec is None:
        why = "as given" if name_set or params_set else "the default: no run or sft output around --model records one"
        return f"eval: task {t.name} {json.dumps(t.params)} ({why})"
    src, r = rec
    rt = TaskConfig.model_validate(r["task"])
    name = t.name if name_set else rt.name
    params = t.params if params_set else rt.params if name == rt.name else t.params
    cfg.task = TaskConfig(name=name, params=params)
    if r.get("chat_template") is not None and "chat_template" not in cfg.model_fields_set:
        cfg.chat_template = r["chat_template"]
    if r.get("limits") is not None:  # the run's eval token limits, each unless set here
        for field in type(r["limits"]).model_fields:
            if field not in cfg.model_fields_set:
                setattr(cfg, field, getattr(r["limits"], field))
    if (name, params) == (rt.name, rt.params):
        how = f"from {src}" + (" (--task/--set agree)" if name_set or params_set else "; --task/--set override it")
    else:
        how = f"as given; {src} records {rt.name} {json.dumps(rt.params)}"
    return f"eval: task {name} {json.dumps(params)} {how}"


def eval_(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
          model: Annotated[Optional[str], typer.Option(help="HF model dir, or a run dir (its final model) or one of "
                                                       "its policy versions.")] = None,
          task: Annotated[Optional[str], typer.Option(help="Task name (default: the task the run or sft output "
                                                      "around --model recorded, else mul_add).")] = None,
          n: Annotated[Optional[int], typer.Option(help="Number of held-out tasks.")] = None) -> None:
    """Held-out accuracy (greedy, batched, through the inference backend: --set inference.backend=vllm), as JSON.

    When --model belongs to a run (RUN, RUN/final_model, RUN/policy/vN: RUN/rl.toml) or is an sft output's model
    (OUT/model: OUT/summary.json), its task, params, chat template and answer length are the defaults; --task,
    --set task.params.*=... and --config still win. Which task was used, and from where, goes to stderr.

    --config takes an eval config or the run config of `swarmrl run` (configs/run.toml, configs/smollm2.toml):
    then the run's final evaluation (its task, params, chat template, answer length, final_eval_n tasks) on the
    run's initial model unless --model names another."""
    from swarmrl.config import dump_config  # noqa: PLC0415  # lazy: startup
    from swarmrl.eval.config import EvalConfig  # noqa: PLC0415  # lazy: startup
    from swarmrl.job.commands import eval_settings  # noqa: PLC0415  # lazy: startup

    cfg = resolve(EvalConfig, config, set_, opt("model", model) + opt("task.name", task) + opt("n", n),
                  from_run=eval_settings)
    console.print(apply_recorded(cfg, explicit_task="task" in cfg.model_fields_set), highlight=False, soft_wrap=True)
    if print_config:
        typer.echo(dump_config(cfg))
        raise typer.Exit(0)
    from swarmrl.eval.heldout import evaluate_path  # noqa: PLC0415  # lazy: startup

    with _merged_if_adapter(Path(cfg.model)) as merged:
        require_model_dir(merged or cfg.model, _MODEL_HINT)
        try:
            with backend_errors():
                res = evaluate_path(cfg.model_copy(update={"model": str(merged)}) if merged else cfg)
        except FileNotFoundError as e:
            fail(f"{e} ({_MODEL_HINT})")
    typer.echo(json.dumps({**res, "model": cfg.model}))


@contextlib.contextmanager
def _merged_if_adapter(model: Path) -> Iterator[Path | None]:
    """A LoRA run's policy version (an adapter, no weights of its own) merged onto the base its run's ``rl.toml``
    names, in a temporary directory for the duration; None for any other directory."""
    from swarmrl.models.adapter_file import ADAPTER_FILE, AdapterRefused  # noqa: PLC0415  # lazy: startup

    if not (model / ADAPTER_FILE).is_file():
        yield None
        return
    rec = _recorded(model)
    base = None
    if rec is not None and rec[0].name == "rl.toml":
        import tomllib  # noqa: PLC0415  # lazy: startup

        base = tomllib.loads(rec[0].read_text(encoding="utf-8")).get("model")
    if not isinstance(base, str) or not base:
        fail(f"{model} is a LoRA adapter and no run's rl.toml around it names its base: merge it first with "
             "`swarmrl model export --base BASE --adapter DIR --out OUT`")
    require_model_dir(base, "the base model the run's rl.toml names")
    from swarmrl.models.lora import export_merged  # noqa: PLC0415  # lazy: torch

    with tempfile.TemporaryDirectory(prefix="swarmrl-eval-") as tmp:
        try:
            yield export_merged(base, model, Path(tmp) / "merged")
        except AdapterRefused as e:
            fail(f"{model}: {e}")


def tasks() -> None:
    """List the registered tasks."""
    from swarmrl.envs import available_envs  # noqa: PLC0415  # lazy: startup
    from swarmrl.envs.vf import INSTALL_HINT, PREFIX, verifiers_installed  # noqa: PLC0415  # lazy: startup

    for name in available_envs():
        typer.echo(name)
    state = "installed" if verifiers_installed() else f"not installed: {INSTALL_HINT}"
    typer.echo(f"{PREFIX}<env_id>  (any installed verifiers environment package; verifiers {state})")


def register(app: typer.Typer) -> None:
    app.command("sft")(sft)
    app.command("eval")(eval_)
    app.command("tasks")(tasks)
