"""Scoring worker for the reasoning-gym environments (run as a separate process by ``swarmrl.envs.rg``).

A completion is untrusted and some of reasoning-gym's scorers cost what the answer asks for: coin_flip's
``Fraction("1e999999999")`` computes ten to the billionth power. So scorers run here, not in the validator: the
parent enforces a wall-time limit and kills/restarts this process on overrun, and this process caps its own
address space, so a hostile answer can only cost a restart (and scores 0).

Protocol: one JSON object per stdin line, ``{"op": "prepare", "dataset": str, "params_key": str, "seed": int,
"config": b64}`` (build the dataset whose ``score_answer`` scores: arc_agi takes most of a second, which must not
count against a completion's time) or the same with ``"op": "score"``, ``"entry": b64`` and ``"answer": str``
(``config`` and ``entry`` pickled by the parent, which generated them: it is trusted, the answer is not); one JSON
line back, ``{"ok": true}``, ``{"score": float}`` or ``{"error": str}``. This file imports nothing from swarmrl so
it can be run by path (``python -I``).
"""

from __future__ import annotations

import sys

# This file sits next to swarmrl/envs/math.py, which would shadow the stdlib ``math`` module if the
# script's own directory stayed on sys.path (the parent also runs us with -I).
sys.path[:] = [p for p in sys.path if p and not p.rstrip("/").endswith("swarmrl/envs")]

import base64  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

MEM_BYTES = 2 * 1024**3  # reasoning-gym loaded (numpy, sympy, matplotlib; one BLAS thread) peaks near 270 MB
CHUNK = 512  # swarmrl.envs.rg.CHUNK: the scorer instance is built as the parent's is
MAX_INSTANCES = 64  # (over it, all go: a later score builds its own within its time limit)


def _guard():  # noqa: ANN202
    """``_worker_guard.py`` beside this file, loaded by path (this directory is off sys.path, see above)."""
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("_worker_guard", Path(__file__).resolve().parent / "_worker_guard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


guard = _guard()


def main() -> None:
    guard.die_with_parent()
    import reasoning_gym  # noqa: PLC0415  # before the memory cap: its imports are ours, not the answer's

    guard.limit_memory(MEM_BYTES)
    instances: dict[tuple[str, str, int], Any] = {}
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            guard.limit_cpu(req.get("cpu_s"))
            key = (req["dataset"], req["params_key"], req["seed"])
            inst = instances.get(key)
            # stdout is the protocol: what a generator or scorer prints must not land in it
            with contextlib.redirect_stdout(io.StringIO()):
                if inst is None:
                    if len(instances) >= MAX_INSTANCES:
                        instances.clear()
                    config = pickle.loads(base64.b64decode(req["config"]))
                    inst = reasoning_gym.create_dataset(req["dataset"], seed=req["seed"], size=CHUNK, **config)
                    instances[key] = inst
                if req.get("op") == "prepare":
                    out: dict[str, Any] = {"ok": True}
                else:
                    entry = pickle.loads(base64.b64decode(req["entry"]))
                    out = {"score": float(inst.score_answer(req["answer"], entry))}
        except MemoryError:
            out = {"error": "out of memory"}
        except Exception as e:  # noqa: BLE001 - whatever a scorer raises, the answer scores 0
            out = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
