"""`swarmrl run`, `swarmrl rl trainer|worker`, `swarmrl filter`, `swarmrl plot`."""

# No `from __future__ import annotations` here: typer would eval every command's string annotations
# when it builds the command tree, on every start (`swarmrl --help` included).

import json
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
    require_backend,
    require_model_dir,
    resolve,
)

rl_app = typer.Typer(help="The asynchronous GRPO processes (normally started by `swarmrl run`).", no_args_is_help=True, rich_markup_mode=None)


@rl_app.command("trainer")
def trainer(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Run the GRPO trainer on a run directory (resumes from its newest checkpoint). Works under torchrun."""
    from swarmrl.rl.config import RLConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(RLConfig, config, set_, print_config=print_config)
    from swarmrl.rl.trainer import run_trainer  # noqa: PLC0415  # lazy: startup

    steps = run_trainer(cfg)
    console.print(f"trainer finished at step {steps}")


@rl_app.command("worker")
def worker(worker_id: Annotated[str, typer.Option("--id", help="Worker id (letters, digits, _ . -).")],
           config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Run an inference worker on a run directory until the trainer is done."""
    import re  # noqa: PLC0415  # lazy: startup

    if not re.fullmatch(r"[A-Za-z0-9_.]+", worker_id):
        fail("--id may only contain letters, digits, '_' and '.'")
    from swarmrl.rl.config import RLConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(RLConfig, config, set_, print_config=print_config)
    from swarmrl.rl.worker import run_worker  # noqa: PLC0415  # lazy: startup

    with backend_errors():
        run_worker(cfg, worker_id)


@rl_app.command("adapter")
def adapter(orchestrator: Annotated[str, typer.Option(help="Orchestrator URL.")],
            key: Annotated[Path, typer.Option(help="Trainer private key file.")],
            config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
            long_poll_s: Annotated[float, typer.Option(
                min=0.0, max=10.0, help="Wait for verdicts in long polls of this many seconds (0: poll).")] = 5.0,
            ) -> None:
    """Swarm mode, trainer side: announce the trainer's step (and, with SHARDCAST on, its weight servers) to
    the orchestrator and fetch accepted rollout files into the run directory (the trainer runs unchanged)."""
    import logging  # noqa: PLC0415  # lazy: startup

    from swarmrl.rl.config import RLConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(RLConfig, config, set_, print_config=print_config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from swarmrl.swarm.adapter import AdapterConfig, run_adapter  # noqa: PLC0415  # lazy: startup

    run_adapter(cfg, AdapterConfig(orchestrator=orchestrator, key=str(key), long_poll_s=long_poll_s))


def run(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
        steps: Annotated[Optional[int], typer.Option(help="Trainer steps.")] = None,
        workers: Annotated[Optional[int], typer.Option(help="Number of inference workers.")] = None,
        async_level: Annotated[Optional[int], typer.Option("--async-level", help="Max policy staleness (0 = sync).")] = None,
        run_dir: Annotated[Optional[str], typer.Option("--run-dir", help="Run directory.")] = None,
        swarm: Annotated[Optional[bool], typer.Option("--swarm/--local", help="Untrusted nodes behind an orchestrator "
                         "and validator, or trusted local workers (default: the config's `mode`).")] = None,
        nodes: Annotated[Optional[int], typer.Option(help="Swarm mode: honest nodes.")] = None,
        adversary: Annotated[Optional[list[str]], typer.Option(help="Swarm mode: add a cheating node of this kind "
                             "(repeatable; see `swarmrl node run --help`).")] = None,
        json_: Annotated[bool, typer.Option("--json", help="Also print the full JSON summary on stdout at the end "
                         "(it is always written to RUN_DIR/summary.json).")] = False) -> None:
    """The main job: warm start (if needed), then the whole swarm on loopback with live progress: an
    orchestrator assigns seeded tasks to untrusted nodes, a validator checks every upload (slashing cheaters),
    the trainer (SHARDCAST origin, with a relay) trains on accepted work only. --local runs trusted local
    workers instead (no protocol); --adversary adds a cheating node to watch it get caught.

    On a terminal: a live table. Piped or logged (nohup): a plain line every 10 steps (or a tenth of the run).
    At the end: a short summary, and the path of RUN_DIR/summary.json (the full JSON)."""
    from swarmrl.job.config import RunConfig  # noqa: PLC0415  # lazy: startup
    from swarmrl.job.launch import launch  # noqa: PLC0415  # lazy: startup

    extra = (opt("rl.steps", steps) + opt("rl.workers.num", workers) + opt("rl.contract.async_level", async_level)
             + opt("rl.run_dir", run_dir)
             + (['mode="swarm"'] if swarm or (adversary and swarm is None) else ['mode="local"'] if swarm is False else [])
             + opt("swarm.nodes", nodes) + ([f"swarm.adversaries={json.dumps(adversary)}"] if adversary else []))
    default_cfg = Path("configs/run.toml")
    cfg = resolve(RunConfig, config or (default_cfg if default_cfg.is_file() else None), set_, extra, print_config)
    if cfg.mode == "local" and cfg.swarm.adversaries:
        fail("adversaries are swarm nodes: drop --local (or set mode = \"swarm\")")
    with backend_errors():  # before any process starts: workers and nodes would only fail one by one
        require_backend(cfg.rl.inference)
    swarm_mode = cfg.mode == "swarm"
    who = (f"{cfg.swarm.nodes} nodes + {len(cfg.swarm.adversaries)} adversaries" if swarm_mode
           else f"{cfg.rl.workers.num} workers")
    title = f"swarmrl run: {cfg.rl.contract.task.name}, {who}, async_level {cfg.rl.contract.async_level}"

    def table(s: dict):  # noqa: ANN202
        from rich.table import Table  # noqa: PLC0415  # lazy: startup

        t = Table(title=title)
        cols = ["elapsed", "step", "task reward", "held-out acc", "async lag", "gen tok/s", "trainer wait"]
        if swarm_mode:
            cols += ["accepted", "rejected", "slashed nodes"]
        for col in cols:
            t.add_column(col, justify="right")
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        acc = "-" if s["heldout_acc"] is None else f"{100 * s['heldout_acc']:.1f}% (from {100 * s['first_acc']:.1f}%)"
        row = [f"{s['elapsed_s']:.0f}s", f"{s['step']}/{cfg.rl.steps}", f(s["reward"], ".3f"), acc,
               f(s["lag"], ".2f"), f(s["tokens_per_s"], ".0f"),
               "-" if s["wait_frac"] is None else f"{100 * s['wait_frac']:.0f}%"]
        if swarm_mode:
            row += [str(s.get("accepted", 0)), str(s.get("rejected", 0)), str(s.get("slashed_nodes", 0))]
        t.add_row(*row)
        return t

    def say(m: str) -> None:
        console.print(m, highlight=False, soft_wrap=True)  # soft_wrap: a long line is not cut at 80 columns

    from swarmrl.job.supervisor import RoleFailed  # noqa: PLC0415  # lazy: startup
    from swarmrl.wan.netns import WanUnavailable  # noqa: PLC0415  # lazy: startup

    try:
        if console.is_terminal:  # a live table, redrawn in place
            from rich.live import Live  # noqa: PLC0415  # lazy: startup

            with Live(table({"elapsed_s": 0, "step": 0, "reward": None, "heldout_acc": None, "first_acc": None,
                             "lag": None, "tokens_per_s": None, "wait_frac": None}), console=console,
                      refresh_per_second=2, transient=False) as lv:
                summary = launch(cfg, progress=say, live=lambda s: lv.update(table(s)))
        else:  # piped, nohup, a log file: plain lines, never redrawn
            from swarmrl.job.report import PlainProgress  # noqa: PLC0415  # lazy: startup

            say(title)
            summary = launch(cfg, progress=say, live=PlainProgress(cfg.rl.steps, swarm_mode, say))
    except RoleFailed as e:  # the message names the role's log
        fail(e, 1)
    except WanUnavailable as e:  # wan.profile without the rights to make namespaces: refused before anything runs
        fail(f"{e} (or drop wan.profile)")
    except FileNotFoundError as e:  # no initial model and warm start disabled
        fail(f"{e} (set rl.model to a model dir, or enable the warm start)")
    from swarmrl.job.report import summary_lines  # noqa: PLC0415  # lazy: startup

    if json_:
        typer.echo(json.dumps(summary, indent=2))
    typer.echo(f"swarmrl run finished: {cfg.rl.contract.task.name}, {who}")
    for line in summary_lines(summary):
        typer.echo(f"  {line}")


def filter_(config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False,
            model: Annotated[Optional[str], typer.Option(help="Policy used to estimate solve rates.")] = None,
            task: Annotated[Optional[str], typer.Option(help="Task name.")] = None,
            out: Annotated[Optional[str], typer.Option(help="Output JSONL task list.")] = None) -> None:
    """Offline filtering: keep training tasks whose estimated solve rate lies in a band (default [0.1, 0.8]).

    --config takes a filter config or the run config of `swarmrl run` (configs/run.toml): then the run's initial
    model on the run's task, params and chat template, sampled as its workers sample (rl.contract.sampling,
    rl.contract.group_size completions per task); options and --set still win."""
    from swarmrl.filtering.offline import FilterConfig, run_filter  # noqa: PLC0415  # lazy: startup
    from swarmrl.job.commands import filter_settings  # noqa: PLC0415  # lazy: startup

    cfg = resolve(FilterConfig, config, set_, opt("model", model) + opt("task.name", task) + opt("out", out),
                  print_config, from_run=filter_settings)
    require_model_dir(cfg.model, "--model: an HF model dir")
    typer.echo(json.dumps(run_filter(cfg, progress=lambda m: console.print(m, highlight=False)), indent=2))


def plot(run_dir: Annotated[Path, typer.Argument(help="Run directory.")]) -> None:
    """Draw a run's curves to RUN_DIR/curves.png."""
    from swarmrl.plots.curves import plot_run  # noqa: PLC0415  # lazy: startup

    typer.echo(str(plot_run(run_dir)))


def register(app: typer.Typer) -> None:
    app.add_typer(rl_app, name="rl")
    app.command("run")(run)
    app.command("plot")(plot)
    app.command("filter")(filter_)
