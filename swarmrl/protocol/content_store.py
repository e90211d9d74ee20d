"""A content-addressed file store: files live at ``<root>/<sha[:2]>/<sha>`` and are written once.

``receive`` streams untrusted bytes to a temp file under a byte cap while hashing them; the file
is only moved into place (atomically) after the caller has validated it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path


class UploadTooLarge(ValueError):
    pass


class ContentStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path_for(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError("not a sha256 hex digest")
        return self.root / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    async def receive(self, chunks: AsyncIterator[bytes], max_bytes: int) -> tuple[Path, str, int]:
        """Stream to a temp file; returns (temp path, sha256 hex, size). Raises UploadTooLarge past the cap."""
        tmp = self.tmp / f"up-{secrets.token_hex(8)}"
        h = hashlib.sha256()
        size = 0
        try:
            with open(tmp, "wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise UploadTooLarge(f"upload exceeds the {max_bytes}-byte limit")
                    h.update(chunk)
                    f.write(chunk)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp, h.hexdigest(), size

    def commit(self, tmp: Path, sha256: str) -> Path:
        dst = self.path_for(sha256)
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
        return dst

    def discard(self, tmp: Path) -> None:
        tmp.unlink(missing_ok=True)
