"""The trainer's read-ahead: files of the steps after the current one are parsed in the background and handed
out once, as exactly what reading them would give (rows, or the RolloutError); passed steps are forgotten."""

import time

from test_rl_rollouts import row

from swarmrl.contract import AsyncWindow
from swarmrl.rl.readahead import ReadAhead
from swarmrl.rollouts.wire import RolloutError, write_rollouts
from swarmrl.rundir.writer import RunDir


def _until(cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "the read-ahead thread did not get there"
        time.sleep(0.01)


def test_next_steps_are_read_ahead_and_handed_out_once(tmp_path):
    run = RunDir(tmp_path / "run")
    rows = [row(step=1), row(step=1, group_id="g1", reward=0.0)]
    good = write_rollouts(rows, run.make_step_dir(1) / "w0-1-g1.parquet")
    bad = run.make_step_dir(2) / "w0-2-g1.parquet"
    bad.write_bytes(b"PAR1 not a parquet file PAR1")
    current = write_rollouts([row(step=0)], run.make_step_dir(0) / "w0-3-g1.parquet")
    far = write_rollouts([row(step=3)], run.make_step_dir(3) / "w0-4-g1.parquet")
    ra = ReadAhead(run, AsyncWindow(2), poll_s=0.01).start(0)
    try:
        _until(lambda: ra._done.get(1) and ra._done.get(2))
        assert ra.take(0, current) is None  # the current step is the trainer's own to read
        assert ra.take(1, good) == rows
        assert ra.take(1, good) is None  # once
        err = ra.take(2, bad)
        assert isinstance(err, RolloutError)
        assert ra.take(3, far) is None  # beyond the window: not read
        ra.at_step(2)
        _until(lambda: ra._done.get(3))
        assert ra.take(3, far) == [row(step=3)]
        late = write_rollouts([row(step=1)], run.make_step_dir(1) / "w0-5-g1.parquet")
        time.sleep(0.1)
        assert ra.take(1, late) is None and 1 not in ra._done  # a passed step is neither read nor kept
    finally:
        ra.stop()
