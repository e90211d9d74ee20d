"""The dashboard in a real headless browser (Debian's `chromium`, its own --headless mode: --dump-dom and
--screenshot after the page's scripts ran against a live server): nodes and curves are drawn from live data.
A PNG screenshot is kept as a test artifact under $SWARMRL_TEST_ARTIFACTS (default: the test's tmp_path).
Skipped when no chromium is installed (CI installs it: .ci/run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from dashboard_support import STEPS, live_swarm
from test_dashboard import _write_rows

from swarmrl.dashboard.server import DashboardServer


def _chromium() -> str | None:
    for name in (os.environ.get("SWARMRL_CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install -y chromium; "
                                "or set SWARMRL_CHROMIUM)")


def _browse(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    # --virtual-time-budget: run the page's timers (its polls) for 4 virtual seconds; network waits do not count
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
            f"--user-data-dir={profile}", "--window-size=1280,900", "--hide-scrollbars",
            "--virtual-time-budget=4000", *args, url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=45, check=False)


def _artifacts(tmp_path: Path) -> Path:
    d = Path(os.environ.get("SWARMRL_TEST_ARTIFACTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _series(dom: str) -> dict[str, int]:
    """{series name: number of points} of the charts' <path class="series"> elements."""
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r'<path class="series" d="M[^"]+"[^>]*data-series="(\w+)" data-points="(\d+)"', dom)}


@pytest.mark.timeout(120)
def test_browser_renders_live_orchestrator_dashboard(tmp_path):
    with live_swarm(tmp_path / "swarm") as sw:
        url = sw["url"] + "/dashboard"
        r = _browse(url, tmp_path / "profile", "--dump-dom")
        assert r.returncode == 0, r.stderr[-2000:]
        dom = r.stdout
        for nid in sw["nodes"]:  # every node is a row of the table, drawn from /v1/stats/nodes
            assert f'data-node="{nid}"' in dom, nid
        assert 'class="st-ejected"' in dom and "1 (50.0)" in dom  # the slashed cheat
        assert _series(dom) == {"loss": STEPS, "reward": STEPS, "task_reward": STEPS, "heldout_acc": 4}
        assert 'data-version="6"' in dom and "relay-a" in dom  # the spread and the SHARDCAST servers
        assert re.search(r'id="conn">updated ', dom), "the page's polls did not all succeed"
        png = _artifacts(tmp_path) / "dashboard-orchestrator.png"
        r = _browse(url, tmp_path / "profile", f"--screenshot={png}")
        assert r.returncode == 0 and png.stat().st_size > 10_000, r.stderr[-2000:]
        print(f"dashboard screenshot: {png}")


@pytest.mark.timeout(120)
def test_browser_renders_local_run_dashboard(tmp_path):
    root = tmp_path / "run"
    _write_rows(root / "metrics" / "trainer.jsonl",
                [{"step": s, "version": s + 1, "reward": 0.1 * s, "task_reward": 0.1 * s, "loss": 1 / (s + 1)}
                 for s in range(5)])
    _write_rows(root / "metrics" / "worker-w7.jsonl", [{"worker": "w7", "step": 4, "policy_version": 4,
                                                        "tokens_per_s": 50.0}])
    dash = DashboardServer(root).start()
    try:
        r = _browse(dash.url, tmp_path / "profile", "--dump-dom")
    finally:
        dash.stop()
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'data-node="w7"' in r.stdout and "local run" in r.stdout
    assert _series(r.stdout) == {"loss": 5, "reward": 5, "task_reward": 5}
