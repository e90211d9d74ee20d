"""The base model as one file: what SHARDCAST version 0 carries to a node that has nothing on disk.

A run's base model is a Hugging Face model directory (weights, ``config.json``, tokenizer and template files).
``write_bundle`` packs its top-level files into one uncompressed tar, built deterministically (names sorted,
mtime, owner and mode fixed), so the same files always give the same bytes and ``bundle_hash`` of a directory is
the BLAKE3 of its bundle without writing it: the run's **base model identity**. The origin publishes the bundle as
version 0; a node checks the signed manifest's whole-file hash against the run's (before downloading anything),
and one that already holds the same files (same ``bundle_hash``) downloads nothing.

``extract_bundle`` reads a bundle that came from another machine as hostile: regular files only, plain names
(no paths, no links), at most ``MAX_FILES`` of them and ``max_bytes`` in all, extracted into a fresh directory
beside the destination that is renamed into place only when whole (nothing half-written is ever left under the
destination's name). Standard library and blake3 only: the policy sources and the CLI import it.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
from pathlib import Path

import blake3

__all__ = ["BundleError", "MAX_FILES", "bundle_files", "bundle_hash", "extract_bundle", "write_bundle"]

MAX_FILES = 64
# what a model directory's bundle carries: weights, configs, tokenizer and template files; no code (a model's
# remote code would run on every node) and nothing hidden (markers, partial downloads)
_SUFFIXES = (".safetensors", ".json", ".txt", ".model", ".jinja", ".tiktoken", ".md")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_READ = 8 << 20


class BundleError(ValueError):
    """A model directory that cannot be bundled, or a bundle refused (with the reason)."""


def bundle_files(model_dir: str | Path) -> list[Path]:
    """The files of ``model_dir`` that go into its bundle, sorted by name."""
    d = Path(model_dir)
    if not (d / "config.json").is_file():
        raise BundleError(f"{d} is not a model directory (no config.json)")
    files = sorted((p for p in d.iterdir() if p.is_file() and not p.is_symlink() and _NAME.match(p.name)
                    and p.name.endswith(_SUFFIXES)), key=lambda p: p.name)
    if not any(p.name.endswith(".safetensors") for p in files):
        raise BundleError(f"{d} holds no .safetensors weights")
    if len(files) > MAX_FILES:
        raise BundleError(f"{d} holds {len(files)} bundle files, over {MAX_FILES}")
    return files


def _info(p: Path) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(p.name)
    ti.size = p.stat().st_size
    ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0o644, 0, 0, "", ""
    return ti


class _Hasher(io.RawIOBase):
    """A write-only stream that hashes what is written (``bundle_hash`` without a file)."""

    def __init__(self) -> None:
        self.h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        self.n = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # noqa: ANN001
        self.h.update(b)
        self.n += len(b)
        return len(b)


def _pack(model_dir: str | Path, out: io.RawIOBase | io.BufferedWriter) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.USTAR_FORMAT, bufsize=_READ) as tar:
        for p in bundle_files(model_dir):
            with p.open("rb") as f:
                tar.addfile(_info(p), f)


def bundle_hash(model_dir: str | Path) -> tuple[str, int]:
    """(BLAKE3 hex, size in bytes) of ``model_dir``'s bundle: its base model identity."""
    h = _Hasher()
    _pack(model_dir, h)
    return h.h.hexdigest(), h.n


def write_bundle(model_dir: str | Path, out: str | Path) -> tuple[str, int]:
    """Write ``model_dir``'s bundle to ``out`` (atomically); returns (BLAKE3 hex, size)."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    with tmp.open("wb") as f:
        _pack(model_dir, f)
    os.replace(tmp, out)
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update_mmap(str(out))
    return h.hexdigest(), out.stat().st_size


def extract_bundle(bundle: str | Path, dest: str | Path, max_bytes: int) -> Path:
    """Unpack ``bundle`` into the new directory ``dest`` (module docstring: hostile input); returns ``dest``.
    Raises ``BundleError`` with the reason, leaving nothing at ``dest``."""
    dest = Path(dest)
    if dest.exists():
        raise BundleError(f"{dest} exists already")
    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        total, names = 0, set()
        try:
            tar = tarfile.open(bundle, mode="r:")  # uncompressed only: sizes on disk are sizes decoded
        except (tarfile.TarError, OSError) as e:
            raise BundleError(f"not a model bundle: {e}") from None
        with tar:
            for ti in tar:
                if len(names) >= MAX_FILES:
                    raise BundleError(f"more than {MAX_FILES} files")
                if not ti.isreg() or not _NAME.match(ti.name) or not ti.name.endswith(_SUFFIXES):
                    raise BundleError(f"member {ti.name[:80]!r} is not a plain model file")
                if ti.name in names:
                    raise BundleError(f"member {ti.name!r} twice")
                total += ti.size
                if total > max_bytes:
                    raise BundleError(f"members add up to more than {max_bytes:,} bytes")
                names.add(ti.name)
                src = tar.extractfile(ti)
                assert src is not None  # a regular file
                with (tmp / ti.name).open("wb") as f:
                    shutil.copyfileobj(src, f, _READ)
        if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
            raise BundleError("no config.json or no .safetensors weights in it")
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
