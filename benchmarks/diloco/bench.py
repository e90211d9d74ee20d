"""DiLoCo (``DilocoConfig()`` unchanged) vs DDP on the same data and budget: the stdlib corpus, and the older
arithmetic data sets as options.

The method is ``DilocoConfig()``'s, untouched (``swarmrl.diloco.config.METHOD_FIELDS``: the inner AdamW and its
schedule, H, the wire, the outer Nesterov step, the overlap); so is the scenario (model, workers, steps, batch)
unless a flag below changes it. Per data set, on identical batches (worker r at step s sees the same sequences
in every run):
  * ddp fp32            gradients all-reduced (gloo) every inner step, same inner optimiser: the baseline
  * diloco default      ``DilocoConfig()`` over torch.distributed (gloo)
  * diloco hivemind     the same over hivemind's DHT averaging (``HivemindConfig()``; skipped if hivemind is absent)
  * 1 worker            one worker alone with the inner AdamW only (DDP with W = 1; W times fewer tokens);
                        ``gap_closed`` = (lone - diloco) / (lone - ddp), 1.0 = as good as DDP
  * 1 diloco worker     one worker alone with DiLoCo's method (its outer step on its own pseudo-gradients),
                        no communication: what the averaging itself buys, apart from the outer optimiser;
                        ``comm_gap_closed`` = (lone diloco - diloco) / (lone diloco - ddp)
and on the first data set only, unless --no-extras:
  * before              DDP and DiLoCo at inner lr 5e-4, outer lr 1.0: the setting a candidate of this version
                        chose because it put DiLoCo within 2% of a DDP held back by the same small lr (both end
                        worse than at the default inner lr 1e-3, outer lr 0.7); kept beside the default
  * W=4                 DDP and DiLoCo with 4 workers (the lone rows serve both); --no-w4 skips it
  * overlap             (--overlap) the default with the outer all-reduce overlapped with the next H inner steps
                        from the first round (a fixed ``overlap_steps = H``: on loopback "auto" blocks)

Data sets (``--data``; the config's ``data`` field, and ``task`` for the arithmetic ones, select them):
  * stdlib    the default: the running interpreter's standard library source, byte-level, split by file into
              train / held-out (``swarmrl.diloco.corpus``); eval on held-out files; the method was tuned on the
              validation files (``corpus.eval_split = "valid"``), never on held-out ones
  * mul_add   ``12*7+33=117``: the previous scenario's task (outer settings tuned on it then)
  * add5      ``40123+7789=47912``: 5-digit addition (the ``add`` task, digits 5)
  * add3      ``401+778=1179``: the ``add`` task as registered (3 digits)
  The arithmetic sets run with the default method and model; on them a lone worker is close to DDP.

Bytes, per worker (the most any worker sent):
  * ``bytes``: what the worker handed to the averaging, counted per call: over gloo the tensors passed to
    ``all_reduce`` (fp32 gradients; int8 codes plus fp32 chunk scales), over hivemind the serialized all-reduce
    messages it sent (compressed parts and averaged deltas);
  * ``tcp``: what its TCP connections carried during training, counted by the kernel (``tcpi_bytes_sent`` of
    every socket of the worker and its child processes, p2pd included; headers of gloo and libp2p, matchmaking
    and the DHT included; the set-up before the first step, e.g. the initial broadcast, is reported apart).
"se": the standard error of a row's loss ratio to its DDP run over the eval sequences, paired (each sequence's loss
under both models; ``paired_gap``): it says how far a gap could move on another draw of held-out text, not on
another seed. Each data set ends with one JSON line: bytes and TCP ratios, loss gaps (and their standard errors),
the hivemind figures, the lone worker.

    flock /tmp/swarmrl-bench.lock python benchmarks/diloco/bench.py [--data stdlib,mul_add] [--no-extras] ...
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from swarmrl.diloco import DilocoConfig, run  # noqa: E402
from swarmrl.diloco.comm import hivemind_available  # noqa: E402
from swarmrl.diloco.config import METHOD_FIELDS  # noqa: E402
from swarmrl.envs.config import TaskConfig  # noqa: E402

TASKS = {"mul_add": TaskConfig(name="mul_add"), "add5": TaskConfig(name="add", params={"digits": 5}),
         "add3": TaskConfig(name="add")}
DATA = ("stdlib", *TASKS)
# the rejected candidate method (a weaker DDP baseline: RESULTS.md), for the "before" rows
PREVIOUS_INNER = {"inner_lr": 5e-4, "outer_lr": 1.0}


def data_fields(data: str) -> dict:
    """The scenario fields that select a data set."""
    return {"data": "stdlib"} if data == "stdlib" else {"data": "task", "task": TASKS[data]}


@dataclass
class Planned:
    name: str
    cfg: DilocoConfig
    varies: tuple[str, ...] = field(default=())  # method fields changed on purpose (the extras); else none


def plan(data: str, args: argparse.Namespace, extras: bool) -> list[Planned]:
    """The runs on one data set: ``DilocoConfig()`` with only the scenario, ``mode`` and ``backend`` set, except the
    labelled extras, whose ``varies`` names the method fields they change."""
    out = Path(args.out) / data
    scenario = dict(**data_fields(data), seed=args.seed, timeout_s=3600)
    if args.workers is not None:
        scenario["workers"] = args.workers
    if args.steps is not None:
        scenario["total_steps"] = args.steps

    def cfg(slug: str, **kw) -> DilocoConfig:
        return DilocoConfig(**{**scenario, **kw, "out": str(out / slug)})

    key_rows = getattr(args, "key_rows", False)
    runs = [Planned("ddp fp32", cfg("ddp", mode="ddp")), Planned("diloco default", cfg("diloco"))]
    runs.append(Planned("1 worker, no comm", cfg("lone", mode="ddp", workers=1)))
    runs.append(Planned("1 diloco worker, no comm", cfg("lone_diloco", workers=1)))
    if extras and not args.no_w4:
        runs += [Planned("W=4 ddp fp32", cfg("w4_ddp", mode="ddp", workers=4)),
                 Planned("W=4 diloco default", cfg("w4_diloco", workers=4))]
    if not key_rows and not args.no_hivemind and hivemind_available():
        runs.append(Planned("diloco hivemind", cfg("hivemind", backend="hivemind")))
    if extras and not key_rows:
        runs += [Planned("before: ddp", cfg("before_ddp", mode="ddp", **PREVIOUS_INNER), tuple(PREVIOUS_INNER)),
                 Planned("before: diloco", cfg("before_diloco", **PREVIOUS_INNER), tuple(PREVIOUS_INNER))]
        if getattr(args, "overlap", False):
            h = DilocoConfig().inner_steps
            runs.append(Planned(f"overlap tau={h}", cfg("overlap", overlap_steps=h), ("overlap_steps",)))
    return runs


def _ratio(base: dict, s: dict, key: str = "bytes_sent_per_worker") -> float | None:
    return round(base[key] / s[key], 2) if base.get(key) and s.get(key) else None


def paired_gap(base: list[float], run: list[float]) -> tuple[float, float]:
    """(mean(run) / mean(base) - 1, its standard error) over the same eval sequences (paired: each sequence's loss
    under both models), by the delta method: se = sd(run_i - R * base_i) / (sqrt(n) * mean(base)), R the ratio."""
    n = len(base)
    if n != len(run) or n < 2:
        raise ValueError(f"paired_gap needs two lists of the same length >= 2, got {n} and {len(run)}")
    mb, mr = sum(base) / n, sum(run) / n
    ratio = mr / mb
    d = [r - ratio * b for r, b in zip(run, base)]
    md = sum(d) / n
    sd = math.sqrt(sum((x - md) ** 2 for x in d) / (n - 1))
    return ratio - 1.0, sd / (math.sqrt(n) * mb)


def _gap_se(base: dict, s: dict) -> float | None:
    a, b = base.get("final_eval_seq_losses"), s.get("final_eval_seq_losses")
    return round(paired_gap(a, b)[1], 5) if a and b else None


def _gap(base: dict, s: dict, key: str = "final_eval_loss") -> float | None:
    if base.get(key) is None or s.get(key) is None:
        return None
    return round(s[key] / base[key] - 1.0, 5)


def _run(p: Planned) -> dict:
    t = time.perf_counter()
    s = run(p.cfg)
    s["bench_wall_s"] = round(time.perf_counter() - t, 1)
    ws = [json.loads((Path(p.cfg.out) / f"worker{r}.summary.json").read_text()) for r in range(p.cfg.workers)]
    s["solo_rounds"] = max(w["solo_rounds"] for w in ws)
    tcp = s["tcp_bytes_sent_per_worker"]
    ans = s["final_answer_loss"]
    print(f"{p.name:>22}: eval loss {s['final_eval_loss']:.4f} (answers {'-' if ans is None else f'{ans:.4f}'})  "
          f"bytes/worker {s['bytes_sent_per_worker']:>12,}  tcp {'-' if tcp is None else f'{tcp:,}':>12}  "
          f"syncs {s['sync_calls_per_worker']:>4}  identical {s['identical_params']}  "
          f"wall {s['bench_wall_s']:.0f}s (sync {s['sync_s']:.2f}s)", flush=True)
    return s


def _reference(name: str, results: dict[str, dict]) -> dict:
    """The DDP run a row compares with: the one with the same workers and inner optimiser."""
    if name.startswith("W=4"):
        return results["W=4 ddp fp32"]
    if name.startswith("before"):
        return results["before: ddp"]
    return results["ddp fp32"]


def _answer_cells(s: dict, ref: dict) -> str:
    a, b = s.get("final_answer_loss"), ref.get("final_answer_loss")
    if a is None or b is None:  # the stdlib corpus has no answers: its second column is the perplexity
        return f"{math.exp(s['final_eval_loss']):11.3f} | {math.exp(s['final_eval_loss'] - ref['final_eval_loss']):6.3f}"
    return f"{a:11.4f} | {a / b:6.3f}"


def _table(data: str, results: dict[str, dict]) -> None:
    base = results["ddp fp32"]
    print(f"\n{data}: DiLoCo vs DDP, {base['workers']} workers x {base['total_steps']} inner steps, "
          f"{base['params']:,} params")
    second = "perplexity" if base.get("final_answer_loss") is None else "answer loss"
    print(f"{'run':>22} | {'eval loss':>9} | {'/ DDP':>6} | {'se':>6} | {second:>11} | {'/ DDP':>6} | "
          f"{'bytes/worker':>12} | {'DDP / it':>8} | {'tcp/worker':>12} | {'DDP / it':>8} | {'wall s':>6}")
    for name, s in results.items():
        ref = _reference(name, results)
        r, rt = _ratio(ref, s), _ratio(ref, s, "tcp_bytes_sent_per_worker")
        tcp = s["tcp_bytes_sent_per_worker"]
        se = _gap_se(ref, s) if s is not ref else None
        print(f"{name:>22} | {s['final_eval_loss']:9.4f} | {s['final_eval_loss'] / ref['final_eval_loss']:6.4f} | "
              f"{'-' if se is None else f'{se:.4f}':>6} | "
              f"{_answer_cells(s, ref)} | "
              f"{s['bytes_sent_per_worker']:12,} | {'-' if r is None else f'{r:.1f}':>8} | "
              f"{'-' if tcp is None else f'{tcp:,}':>12} | {'-' if rt is None else f'{rt:.1f}':>8} | "
              f"{s['bench_wall_s']:6.0f}")


def summary_line(data: str, results: dict[str, dict], hm_skip: str | None, args_seed: int = 0) -> dict:
    """The JSON line of one data set (ratios: DDP's bytes over the run's; gaps: the run's loss over DDP's - 1)."""
    base, lone, ours = results["ddp fp32"], results["1 worker, no comm"], results["diloco default"]
    lone_dl = results["1 diloco worker, no comm"]

    def gap_closed(ddp: dict, s: dict, key: str = "final_eval_loss", alone: dict = lone) -> float | None:
        if any(x.get(key) is None for x in (ddp, s, alone)):
            return None
        span = alone[key] - ddp[key]
        return round((alone[key] - s[key]) / span, 3) if span > 0 else None

    line: dict = {
        "data": data, "task": TASKS[data].model_dump() if data in TASKS else None,
        "corpus": base.get("data"),  # the stdlib corpus's digest and split sizes (its files, sizes and contents)
        "bytes_ratio": _ratio(base, ours), "tcp_bytes_ratio": _ratio(base, ours, "tcp_bytes_sent_per_worker"),
        "loss_gap": _gap(base, ours), "loss_gap_se": _gap_se(base, ours),
        "ddp_eval_loss": round(base["final_eval_loss"], 5), "diloco_eval_loss": round(ours["final_eval_loss"], 5),
        "lone_worker_loss_gap": _gap(base, lone), "lone_worker_loss_gap_se": _gap_se(base, lone),
        "gap_closed": gap_closed(base, ours),
        # loss on the answer tokens only (determined by the prompt; the operands' entropy left out)
        "answer_loss_gap": _gap(base, ours, "final_answer_loss"),
        "lone_worker_answer_loss_gap": _gap(base, lone, "final_answer_loss"),
        "answer_gap_closed": gap_closed(base, ours, "final_answer_loss"),
        # against one worker running DiLoCo's method alone: what the averaging buys
        "lone_diloco_loss_gap": _gap(base, lone_dl), "comm_gap_closed": gap_closed(base, ours, alone=lone_dl),
        "lone_diloco_answer_loss_gap": _gap(base, lone_dl, "final_answer_loss"),
        "comm_answer_gap_closed": gap_closed(base, ours, "final_answer_loss", lone_dl),
        "ddp_bytes": base["bytes_sent_per_worker"], "diloco_bytes": ours["bytes_sent_per_worker"],
        "ddp_tcp_bytes": base["tcp_bytes_sent_per_worker"], "diloco_tcp_bytes": ours["tcp_bytes_sent_per_worker"],
        "diloco_tcp_setup_bytes": ours["tcp_setup_bytes_sent_per_worker"],
    }
    hm = results.get("diloco hivemind")
    if hm is not None:
        line.update(hivemind_bytes_ratio=_ratio(base, hm),
                    hivemind_tcp_bytes_ratio=_ratio(base, hm, "tcp_bytes_sent_per_worker"),
                    hivemind_loss_gap=_gap(base, hm), hivemind_gap_closed=gap_closed(base, hm),
                    hivemind_comm_gap_closed=gap_closed(base, hm, alone=lone_dl),
                    hivemind_answer_loss_gap=_gap(base, hm, "final_answer_loss"), hivemind_solo_rounds=hm["solo_rounds"],
                    hivemind_bytes=hm["bytes_sent_per_worker"], hivemind_tcp_bytes=hm["tcp_bytes_sent_per_worker"])
    else:
        line.update(hivemind_bytes_ratio=None, hivemind_loss_gap=None, hivemind_skipped=hm_skip)
    if "before: diloco" in results:
        bd, bo = results["before: ddp"], results["before: diloco"]
        line.update(before_ddp_eval_loss=round(bd["final_eval_loss"], 5), before_loss_gap=_gap(bd, bo),
                    before_diloco_vs_ddp_now=_gap(base, bo), before_answer_loss_gap=_gap(bd, bo, "final_answer_loss"))
    ov = results.get(f"overlap tau={DilocoConfig().inner_steps}")
    if ov is not None:
        line.update(overlap_bytes_ratio=_ratio(base, ov), overlap_loss_gap=_gap(base, ov),
                    overlap_answer_loss_gap=_gap(base, ov, "final_answer_loss"),
                    overlap_sync_s=ov["sync_s"], default_sync_s=ours["sync_s"])
    line["lone_diloco_vs_lone_adamw"] = _gap(lone, lone_dl)
    if "W=4 ddp fp32" in results:
        b4, o4 = results["W=4 ddp fp32"], results["W=4 diloco default"]
        line.update(w4_bytes_ratio=_ratio(b4, o4), w4_tcp_bytes_ratio=_ratio(b4, o4, "tcp_bytes_sent_per_worker"),
                    w4_loss_gap=_gap(b4, o4), w4_loss_gap_se=_gap_se(b4, o4),
                    w4_lone_worker_loss_gap=_gap(b4, lone), w4_lone_worker_loss_gap_se=_gap_se(b4, lone),
                    w4_gap_closed=gap_closed(b4, o4), w4_answer_loss_gap=_gap(b4, o4, "final_answer_loss"),
                    w4_lone_diloco_loss_gap=_gap(b4, lone_dl), w4_comm_gap_closed=gap_closed(b4, o4, alone=lone_dl),
                    w4_lone_worker_answer_loss_gap=_gap(b4, lone, "final_answer_loss"),
                    w4_answer_gap_closed=gap_closed(b4, o4, "final_answer_loss"))
    d = DilocoConfig()
    line["settings"] = {"workers": base["workers"], "total_steps": base["total_steps"], "batch_size": d.batch_size,
                        "seq_len": d.seq_len, "eval_seqs": d.eval_seqs, "params": base["params"], "seed": args_seed,
                        **{k: getattr(d, k) for k in METHOD_FIELDS}}
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="stdlib", help=f"comma-separated, of {', '.join(DATA)}")
    ap.add_argument("--workers", type=int, default=None, help="scenario; default: DilocoConfig's")
    ap.add_argument("--steps", type=int, default=None, help="inner steps per worker; default: DilocoConfig's")
    ap.add_argument("--no-hivemind", action="store_true")
    ap.add_argument("--no-extras", action="store_true", help="skip the before / W=4 / overlap runs")
    ap.add_argument("--no-w4", action="store_true")
    ap.add_argument("--overlap", action="store_true", help="add the overlapped-outer-step row (first data set)")
    ap.add_argument("--key-rows", action="store_true",
                    help="only ddp, diloco and the lone AdamW worker at W = 2 and 4 (e.g. a second seed)")
    ap.add_argument("--out", default="runs/bench_diloco")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = [n.strip() for n in args.data.split(",") if n.strip()]
    unknown = [n for n in names if n not in DATA]
    if unknown:
        ap.error(f"unknown data set(s) {unknown}; known: {', '.join(DATA)}")
    hm_skip = "--no-hivemind" if args.no_hivemind else None if hivemind_available() else "hivemind not installed"
    for i, data in enumerate(names):
        results = {p.name: _run(p) for p in plan(data, args, extras=i == 0 and not args.no_extras)}
        _table(data, results)
        line = summary_line(data, results, hm_skip, args.seed)
        Path(args.out, data).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / data / "bench.json").write_text(json.dumps({"runs": results, "summary": line}, indent=2,
                                                                     default=str))
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
