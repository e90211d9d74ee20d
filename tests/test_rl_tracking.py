"""Experiment tracking (``rl.tracking``): a real trainer's step records and config reach trackio's local database
and an offline W&B run, and a tracker that fails never stops training."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_rl_trainer_parts import MemorySource, _cfg

from swarmrl.rl.tracking import SafeTracker, TrackingSection
from swarmrl.rl.trainer import Trainer


def _trainer(tmp_path, model, backend: str, steps: int = 3) -> Trainer:
    cfg = _cfg(tmp_path, model, steps)
    cfg = cfg.model_copy(update={"tracking": TrackingSection(backend=backend, project="t", run_name="r")})
    return Trainer(cfg, source=MemorySource(steps))


TRACKIO_RUN = """
import sys
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from test_rl_tracking import _trainer
assert _trainer(Path(sys.argv[1]), Path(sys.argv[2]), "trackio").run_loop() == 3
"""


def test_trackio_gets_every_step_record_and_the_config(tmp_path, tiny_model_dir):
    """In a process of its own, as a trainer is (trackio fixes its directory when it is imported)."""
    if importlib.util.find_spec("trackio") is None:
        pytest.skip("trackio is not installed (pip install 'swarmrl[tracking]')")
    tests = str(Path(__file__).parent)
    subprocess.run([sys.executable, "-c", TRACKIO_RUN, str(tmp_path), str(tiny_model_dir), tests], check=True,
                   timeout=300, capture_output=True)
    db = sqlite3.connect(tmp_path / "run" / "tracking" / "t.db")
    rows = [(s, json.loads(m)) for s, m in db.execute("select step, metrics from metrics order by id").fetchall()]
    steps = [r for r in rows if "loss" in r[1]]
    assert [s for s, _ in steps] == [0, 1, 2]
    assert all({"reward", "mismatch_kl", "grad_norm"} <= set(m) for _, m in steps)
    assert any("final/heldout_acc" in m for _, m in rows)  # the final evaluation too
    (config,) = db.execute("select config from configs").fetchall()
    assert json.loads(config[0])["contract"]["task"]["name"] == "add"


def _holds_records(data: bytes) -> bool:
    return b"mismatch_kl" in data and b"grad_norm" in data and b"final/heldout_acc" in data


def test_wandb_offline_run_holds_the_records_and_resumes_the_same_run(tmp_path, tiny_model_dir):
    pytest.importorskip("wandb")
    t = _trainer(tmp_path, tiny_model_dir, "wandb", steps=2)
    assert t.run_loop() == 2
    track = tmp_path / "run" / "tracking"
    run_id = (track / "run_id").read_text()
    (run_file,) = track.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    # wandb's service process writes the offline file; under load its last records land after finish() returns
    deadline = time.monotonic() + 60
    while not _holds_records(data := run_file.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"mismatch_kl" in data and b"grad_norm" in data and b"final/heldout_acc" in data
    again = _trainer(tmp_path, tiny_model_dir, "wandb", steps=3)  # resumed: the same W&B run id
    assert again.run_loop() == 3 and (track / "run_id").read_text() == run_id


def test_a_failing_tracker_is_dropped_not_fatal(caplog):
    class Broken:
        def __init__(self) -> None:
            self.calls = 0

        def log(self, step, values) -> None:  # noqa: ANN001
            self.calls += 1
            raise OSError("disk full")

        def close(self) -> None:
            raise AssertionError("a dropped tracker is not closed")

    b = Broken()
    t = SafeTracker(b)
    t.log(0, {"loss": 1.0})
    t.log(1, {"loss": 1.0})
    t.close()
    assert b.calls == 1 and "tracking is off" in caplog.text
