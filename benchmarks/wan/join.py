"""A stranger joins a running swarm (`swarmrl node join URL --run-key KEY`): time from the join to its first
accepted upload, and the base model download's share of it, on loopback and under a network profile, in one
sitting.

    python benchmarks/wan/join.py --config configs/smollm2.toml --profiles loopback wan20lossy

For each profile: `swarmrl run -c CONFIG` (its run dir ``runs/wan/join-<config>-<profile>``, one namespace left for
a guest under a profile: ``wan.guests = 1``), then, once the run prints its join line, has published its base
model and its trainer has reached step 2 (a running swarm), from an empty directory (in
the guest's namespace under a profile): `swarmrl node keygen`, the run's stake authority deposits (the printed
line), and `swarmrl node join`. The joined node's metrics (``event: join``: the base model's source, seconds and
bytes) and the orchestrator's ledger (its first credit: an accepted upload) give the figures; the run is then
stopped (SIGINT: no final evaluation) and its directory deleted unless ``--keep``. Needs root for a profile.
Prints one JSON line per profile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from swarmrl.utils.procs import child_env, stop_process

ROOT = Path(__file__).resolve().parents[2]
JOIN = re.compile(r"swarmrl node join (\S+) --run-key ([0-9a-f]{64}).*--key (\S+) --amount ([0-9.]+)")


def _swarmrl(ns: str | None, *args: str) -> list[str]:
    cmd = [sys.executable, "-m", "swarmrl", *args]
    return ["ip", "netns", "exec", ns, *cmd] if ns else cmd


def _get(url: str, ns: str | None) -> dict | None:
    """GET ``url`` as JSON (None unless 200), from namespace ``ns`` (a guest's) when given."""
    if ns:
        from swarmrl.wan.netns import inside  # noqa: PLC0415

        with inside(ns):
            r = httpx.get(url, timeout=30)
    else:
        r = httpx.get(url, timeout=30)
    return r.json() if r.status_code == 200 else None


def one(config: str, profile: str, timeout_s: float, keep: bool, min_step: int = 2) -> dict:
    run_dir = ROOT / "runs" / "wan" / f"join-{Path(config).stem}-{profile}"
    work = ROOT / "runs" / "wan" / f"join-{Path(config).stem}-{profile}-stranger"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sets = [f'rl.run_dir="{run_dir}"', "rl.eval.every_steps=0"]
    if profile != "loopback":
        sets += [f'wan.profile="{profile}"', "wan.guests=1"]
    # child_env: the run and the stranger die with this benchmark, however it ends
    env = child_env({**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
    log = work.parent / f"{work.name}.run.log"
    run = subprocess.Popen([sys.executable, "-m", "swarmrl", "run", "-c", config,
                            *(a for s in sets for a in ("--set", s))], cwd=ROOT, env=env, stdout=log.open("w"),
                           stderr=subprocess.STDOUT, start_new_session=True)
    node = None
    t_start = time.time()
    try:
        deadline, m = time.monotonic() + timeout_s, None
        while m is None:
            if time.monotonic() > deadline or run.poll() is not None:
                raise RuntimeError(f"no join line: {log.read_text()[-2000:]}")
            m = JOIN.search(log.read_text())
            time.sleep(0.5)
        url, run_key, authority, amount = m.groups()
        ns = (json.loads((run_dir / "wan.json").read_text())["roles"]["guest0"]["netns"]
              if profile != "loopback" else None)
        # a running swarm: the base model published and a few steps trained before the stranger comes
        while not ((_get(f"{url}/v1/run", ns) or {}).get("description", {}).get("base")
                   and (_get(f"{url}/v1/stats/overview", ns) or {}).get("step", 0) >= min_step):
            if time.monotonic() > deadline or run.poll() is not None:
                raise RuntimeError(f"the swarm did not start: {log.read_text()[-2000:]}")
            time.sleep(2.0)
        key = json.loads(subprocess.run(_swarmrl(ns, "node", "keygen", "--out", "w/node.pem"), cwd=work, env=env,
                                        capture_output=True, text=True, check=True).stdout)
        subprocess.run(_swarmrl(ns, "orchestrator", "deposit", "--orchestrator", url, "--key", authority,
                                "--amount", amount, "--public-key", key["public_key"]), cwd=ROOT, env=env,
                       capture_output=True, text=True, check=True)
        t_join = time.time()
        node = subprocess.Popen(_swarmrl(ns, "node", "join", url, "--run-key", run_key, "--work-dir", "w"),
                                cwd=work, env=env, stdout=(work / "join.log").open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        first_credit = None
        while first_credit is None:
            if time.monotonic() > deadline or node.poll() is not None:
                raise RuntimeError(f"no accepted upload: {(work / 'join.log').read_text()[-3000:]}")
            time.sleep(2.0)
            b = _get(f"{url}/v1/nodes/{key['node_id']}/ledger", ns)
            credits = [e for e in (b or {}).get("entries", []) if e["kind"] == "credit"]
            if credits:
                first_credit = min(e["created_at"] for e in credits)
        metrics = [json.loads(ln) for f in (work / "w" / "metrics").rglob("*.jsonl") for ln in f.open()]
        joined = next(e for e in metrics if e.get("event") == "join")
        uploads = sorted(e["time"] for e in metrics if e.get("event") == "call" and e.get("call") == "upload")
        total = first_credit - t_join
        base_s = joined.get("base_s") or 0.0
        return {"profile": profile, "config": config, "run_start_to_join_s": round(t_join - t_start, 1),
                "join_to_first_accepted_s": round(total, 1), "base_source": joined["base_source"],
                "base_bytes": joined.get("base_bytes"), "base_download_s": base_s,
                "base_share": round(base_s / total, 3) if total > 0 else None,
                "base_mbit_s": round(8 * joined["base_bytes"] / 1e6 / base_s, 1) if base_s else None,
                "join_to_first_upload_s": round(uploads[0] - t_join, 1) if uploads else None}
    finally:
        if node is not None:
            stop_process(node, term_s=120)
        stop_process(run, term_s=120)
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(work / "w" / "cache", ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/smollm2.toml")
    ap.add_argument("--profiles", nargs="+", default=["loopback", "wan20lossy"])
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    a = ap.parse_args()
    for profile in a.profiles:
        print(json.dumps(one(a.config, profile, a.timeout_s, a.keep)), flush=True)


if __name__ == "__main__":
    main()
