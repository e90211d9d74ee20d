"""The on-disk layout of committed policy versions (written by the trainer, read by every holder):

    <dir>/v000007/        HF model dir of policy version 7 (+ trainer_state/, the trainer's own state: only
                          the newest version keeps it, ``drop_older_states``; + toploc_thresholds.json when the
                          base model has a TOPLOC calibration file)
    <dir>/LATEST          "7": newest complete version (written after the dir rename)
    <dir>/.staging-v000008/  a version being written

Every write is a rename, so a reader never sees half a version.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class PolicyDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def version_dir(self, v: int) -> Path:
        return self.root / f"v{v:06d}"

    def latest_version(self) -> int | None:
        try:
            return int((self.root / "LATEST").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def staging_path(self, v: int) -> Path:
        return self.root / f".staging-v{v:06d}"

    def staging_dir(self, v: int) -> Path:
        """An empty staging directory for version ``v`` (what a crash left there is deleted)."""
        d = self.staging_path(v)
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def commit_version(self, v: int, staged: Path) -> Path:
        """Move a fully written staging dir into place as version ``v`` and point LATEST at it."""
        final = self.version_dir(v)
        if final.exists():  # left by a crash after rename but before LATEST moved
            shutil.rmtree(final)
        os.replace(staged, final)
        atomic_write_text(self.root / "LATEST", str(v))
        return final

    def drop_older_states(self, name: str = "trainer_state") -> int:
        """Delete ``name`` (a file or a directory) from every version older than LATEST, once LATEST's own copy is
        in place (so a crash at any point leaves at least one version, the newest complete one, with it). Returns
        how many were deleted."""
        latest = self.latest_version()
        if latest is None or not (self.version_dir(latest) / name).exists():
            return 0
        n = 0
        for d in self.root.glob("v*"):
            try:
                v = int(d.name[1:])
            except ValueError:
                continue
            f = d / name
            if v < latest and f.is_dir():
                shutil.rmtree(f, ignore_errors=True)
                n += 1
            elif v < latest and f.exists():
                f.unlink(missing_ok=True)
                n += 1
        return n

    def prune_versions(self, keep: int) -> None:
        latest = self.latest_version()
        if latest is None:
            return
        for d in self.root.glob("v*"):
            try:
                v = int(d.name[1:])
            except ValueError:
                continue
            if v <= latest - keep:
                shutil.rmtree(d, ignore_errors=True)
