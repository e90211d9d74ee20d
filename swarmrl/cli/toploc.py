"""`swarmrl toploc ...`: calibrate TOPLOC thresholds on a model, verify a rollout file."""

# No `from __future__ import annotations` here: typer would eval every command's string annotations
# when it builds the command tree, on every start (`swarmrl --help` included).

from pathlib import Path
from typing import Annotated, Optional

import typer

from swarmrl.cli.common import ConfigOpt, PrintOpt, SetOpt, console, fail, opt, resolve

app = typer.Typer(help="TOPLOC inference proofs: calibrate thresholds, verify rollouts.", no_args_is_help=True, rich_markup_mode=None)


def __getattr__(name: str):  # VerifyFileConfig stays importable from here without importing torch up front
    if name == "VerifyFileConfig":
        from swarmrl.cli._toploc_config import VerifyFileConfig  # noqa: PLC0415  # lazy: startup

        return VerifyFileConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fmt(v: float) -> str:
    if v != v:
        return "-"
    if v >= 2**63:
        return "2^64"
    return f"{v:.3g}"


@app.command("calibrate")
def calibrate(model: Annotated[Optional[Path], typer.Option("--model", "-m", help="HF model directory.")] = None,
              out: Annotated[Optional[Path], typer.Option(
                  "--out", "-o", help="Calibration file to write (default: MODEL/toploc_thresholds.json, where "
                  "verifiers read it).")] = None,
              write: Annotated[Optional[bool], typer.Option("--write/--no-write", help="Write the calibration file "
                                                            "(default) or only report.")] = None,
              config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Honest recomputation vs tampering on MODEL: metric distributions, recommended thresholds, written to
    MODEL/toploc_thresholds.json (or --out) for the validator and `toploc verify` to use."""
    from swarmrl.toploc.calibrate import CalibrateConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(CalibrateConfig, config, set_, opt("model", model) + opt("out", out) + opt("write", write),
                  print_config)
    if not cfg.model:
        fail("--model is required")
    from rich.table import Table  # noqa: PLC0415  # lazy: startup

    from swarmrl.toploc.calibrate import run_calibration  # noqa: PLC0415  # lazy: startup

    with console.status("calibrating") as status:
        report = run_calibration(cfg, progress=lambda m: status.update(f"calibrating: {m}"))
    t = Table(title=f"TOPLOC calibration on {cfg.model} (k={cfg.proof.k}, chunk={cfg.proof.chunk})")
    t.add_column("scenario", no_wrap=True)
    for col in ("rollouts", "chunks", "exp_mism p50/max", "mant_mean p50/max", "mant_median p50/max",
                "TOPLOC fail dflt", "TOPLOC fail rec", "sampling fail dflt", "max |dlogp|", "logprob fail rec",
                "any fail rec"):
        t.add_column(col, justify="right")
    for s in report.scenarios:
        r = s.summary()
        t.add_row(r["scenario"], str(r["rollouts"]), str(r["chunks"]), f"{_fmt(r['exp_p50'])}/{_fmt(r['exp_max'])}",
                  f"{_fmt(r['mean_p50'])}/{_fmt(r['mean_max'])}", f"{_fmt(r['median_p50'])}/{_fmt(r['median_max'])}",
                  f"{r['toploc_fail_rate']:.0%}", f"{report.detection_recommended[s.name]:.0%}",
                  f"{r['sampling_fail_rate']:.0%}", _fmt(r["logprob_diff_max"]),
                  f"{report.logprob_detection_recommended[s.name]:.0%}", f"{report.any_detection_recommended[s.name]:.0%}")
    from rich.console import Console  # noqa: PLC0415  # lazy: startup
    from rich.markup import escape  # noqa: PLC0415  # lazy: startup

    con = Console(width=250)
    con.print(t)
    rec, r = report.recommended, report.recommendation
    con.print("fail columns: share of rollouts rejected (dflt: configured thresholds, rec: recommended ones); "
              "exp/mant columns: per-chunk distributions")
    con.print(f"recommended thresholds: max_exp_mismatches={rec.max_exp_mismatches}, max_mant_err_mean="
              f"{rec.max_mant_err_mean}, max_mant_err_median={rec.max_mant_err_median}; sampling max_logprob_diff="
              f"{report.recommended_logprob_diff} (honest max {r.honest_max} over {r.honest_chunks} chunks; "
              f"honest max x {cfg.margin} + slack: {r.margin_based.model_dump()})")
    con.print(f"one-token edits with a changed committed state passing on proofs alone: {r.edits_passing}/{r.edits} "
              f"recommended, {r.edits_passing_margin}/{r.edits} honest max x margin + slack; honest rollouts "
              f"failing: {r.honest_failing}/{r.honest_rollouts}; {escape(r.note)}")
    if not r.separable:
        con.print("[yellow]the one-token edits are NOT separated from honest recomputation on this model[/yellow]")
    con.print("honest recomputation measured here only: a GPU worker / validator pair adds kernel noise, so "
              "calibrate on that pair (or loosen by hand) before a validator slashes with these thresholds")
    if report.overlaps:
        con.print(f"[yellow]tampered scenarios with rollouts passing the recommended thresholds on proofs alone:"
                  f"[/yellow] {', '.join(report.overlaps)}")
    con.print(f"calibration took {report.wall_s:.0f} s; "
              + (f"written to {report.path}" if report.path else "not written (--no-write)"))


@app.command("verify")
def verify(model: Annotated[Optional[Path], typer.Option("--model", "-m", help="HF model directory.")] = None,
           rollouts: Annotated[Optional[Path], typer.Option("--rollouts", "-r", help="Rollout parquet file.")] = None,
           config: ConfigOpt = None, set_: SetOpt = None, print_config: PrintOpt = False) -> None:
    """Verify the TOPLOC proofs (and sampling) of every row of a rollout file; exit 1 if any fails."""
    from swarmrl.cli._toploc_config import VerifyFileConfig  # noqa: PLC0415  # lazy: startup

    cfg = resolve(VerifyFileConfig, config, set_, opt("model", model) + opt("rollouts", rollouts), print_config)
    if not cfg.model or not cfg.rollouts:
        fail("--model and --rollouts are required")
    from swarmrl.models.io import load_model, load_tokenizer  # noqa: PLC0415  # lazy: startup
    from swarmrl.rollouts.wire import RolloutError, read_rollouts  # noqa: PLC0415  # lazy: startup
    from swarmrl.toploc.rollout import verify_rows  # noqa: PLC0415  # lazy: startup

    try:
        rows = read_rollouts(cfg.rollouts)
    except RolloutError as e:
        fail(f"{e}", 1, prefix="rejected")
    from swarmrl.toploc.thresholds_file import CalibrationError, toploc_settings  # noqa: PLC0415  # lazy: startup

    try:  # thresholds set in the config > the model dir's calibration file > defaults
        st = toploc_settings(cfg.model, {k: getattr(cfg.thresholds, k) for k in cfg.thresholds.model_fields_set},
                             {k: getattr(cfg.sampling, k) for k in cfg.sampling.model_fields_set},
                             use_file=cfg.calibration, chunk=cfg.proof.chunk, k=cfg.proof.k)
    except CalibrationError as e:
        fail(f"{e} (or --set calibration=false)")
    typer.echo(f"thresholds from {st.source}: {(st.thresholds or cfg.thresholds).model_dump()}")
    m = load_model(cfg.model, dtype=cfg.dtype)
    eos = load_tokenizer(cfg.model).eos_token_id
    res = verify_rows(m, rows, eos, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                      check_sampling=cfg.check_sampling, geometry=cfg.proof,
                      thresholds=st.thresholds or cfg.thresholds, sampling_thresholds=st.sampling or cfg.sampling,
                      batch_size=cfg.batch_size)
    bad = 0
    for i, r in enumerate(res):
        if not r.passed:
            bad += 1
            typer.echo(f"row {i}: FAIL: {r.reason}")
    typer.echo(f"{len(res) - bad}/{len(res)} rows passed")
    raise typer.Exit(1 if bad else 0)


def _load_hidden(path: Path, key: str):
    from safetensors.torch import load_file  # noqa: PLC0415  # lazy: startup

    try:
        tensors = load_file(str(path))
    except Exception as e:
        fail(f"cannot read {path}: {e}")
    if key not in tensors or tensors[key].dim() != 2:
        fail(f"{path} has no 2-D tensor {key!r} (found {sorted(tensors)})")
    return tensors[key]


def _geometry(chunk: int | None, k: int | None):  # noqa: ANN202
    """The proof geometry of the options, the contract's where one is not given (refused when out of range)."""
    from pydantic import ValidationError  # noqa: PLC0415  # lazy: startup

    from swarmrl.contract.params import PROOF_GEOMETRY, ProofGeometry  # noqa: PLC0415  # lazy: startup

    try:
        return ProofGeometry(chunk=PROOF_GEOMETRY.chunk if chunk is None else chunk,
                             k=PROOF_GEOMETRY.k if k is None else k)
    except ValidationError as e:
        fail(f"--chunk/--k: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}")


@app.command("prove")
def prove(hidden: Annotated[Path, typer.Option("--hidden", help="safetensors file with a [positions, hidden] tensor.")],
          out: Annotated[Path, typer.Option("--out", "-o", help="Write one base64 proof per line here.")],
          key: Annotated[str, typer.Option(help="Tensor name in the file.")] = "hidden",
          chunk: Annotated[Optional[int], typer.Option(help="Positions per proof chunk (default: the contract's, 32).")] = None,
          k: Annotated[Optional[int], typer.Option(help="Top-k hidden values committed per chunk (default 128).")] = None) -> None:
    """Build TOPLOC proofs for the last hidden states stored in a safetensors file."""
    from swarmrl.toploc.proof import build_proofs, proof_to_b64  # noqa: PLC0415  # lazy: startup

    g = _geometry(chunk, k)
    proofs = build_proofs(_load_hidden(hidden, key), g)
    out.write_text("".join(proof_to_b64(p) + "\n" for p in proofs), encoding="ascii")
    console.print(f"wrote {len(proofs)} proofs to {out}")


@app.command("check")
def check(hidden: Annotated[Path, typer.Option("--hidden", help="safetensors file with a [positions, hidden] tensor.")],
          proofs: Annotated[Path, typer.Option("--proofs", help="One base64 proof per line.")],
          key: Annotated[str, typer.Option(help="Tensor name in the file.")] = "hidden",
          chunk: Annotated[Optional[int], typer.Option(help="Positions per proof chunk (default: the contract's, 32).")] = None,
          k: Annotated[Optional[int], typer.Option(help="Top-k hidden values committed per chunk (default 128).")] = None,
          config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Check base64 proofs against hidden states (thresholds via --config/--set); exit 1 if a chunk fails."""
    from swarmrl.toploc.verify import Thresholds, verify_proofs  # noqa: PLC0415  # lazy: startup

    th = resolve(Thresholds, config, set_)
    g = _geometry(chunk, k)
    h = _load_hidden(hidden, key)
    try:
        lines = proofs.read_text(encoding="ascii", errors="replace").split()
    except OSError as e:
        fail(f"cannot read {proofs}: {e}")
    from swarmrl.toploc.proof import ProofError, proof_from_b64  # noqa: PLC0415  # lazy: startup

    raw: list[object] = []
    b64_errors: dict[int, str] = {}
    for i, line in enumerate(lines):
        try:
            raw.append(proof_from_b64(line, g.k))
        except ProofError as e:
            raw.append(None)  # rejected by the verifier; the base64 reason replaces its message below
            b64_errors[i] = f"proof {i} rejected: {e}"
    checks = verify_proofs(h, raw, g, thresholds=th)
    for c in checks:
        if c.index in b64_errors and len(raw) == len(checks):
            c.reason = b64_errors[c.index]
    for c in checks:
        metrics = "" if c.exp_mismatches < 0 else (f" exp_mismatches={c.exp_mismatches} mant_err_mean="
                                                   f"{_fmt(c.mant_err_mean)} mant_err_median={_fmt(c.mant_err_median)}")
        typer.echo(f"chunk {c.index}: {'ok' if c.passed else 'FAIL'}{metrics}" + (f" ({c.reason})" if c.reason else ""))
    bad = sum(not c.passed for c in checks)
    typer.echo(f"{len(checks) - bad}/{len(checks)} chunks passed")
    raise typer.Exit(1 if bad else 0)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="toploc")
