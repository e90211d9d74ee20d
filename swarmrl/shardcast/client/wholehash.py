"""SHARDCAST client, the whole-file check: the output file's BLAKE3 computed in file order on a thread while the
shards are still arriving (``InOrderHasher``), and the plain whole-file hash (``hash_file``)."""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import blake3

from swarmrl.shardcast.layout import Manifest

__all__ = ["InOrderHasher", "hash_file"]


class InOrderHasher:
    """Hashes the output file's whole-file BLAKE3 on a thread, in file order, following the download: it
    reads back each byte of shard ``next`` as soon as it is on disk (``progress``), before the shard is
    complete, so the whole-file check runs alongside the download instead of after it. Bytes written exactly
    where the hash stands are hashed by the writer from its buffer instead (no read-back). If a shard the
    hash has already read into is reset (a bad or restarted transfer), the running hash is void and
    ``finish`` hashes the finished file again from the start."""

    def __init__(self, path: Path, m: Manifest, done: set[int]) -> None:
        self.path = path
        self.m = m
        self.h = blake3.blake3()
        self.next = 1
        self.pos = 0  # bytes of shard ``next`` hashed
        self.ready = set(done)
        self.written: dict[int, int] = {}  # shard -> contiguous bytes on disk (in-progress shards)
        self.dirty = False
        self.busy = False  # the thread is reading shard ``next`` outside the lock
        self.cv = threading.Condition()
        self.closed = False
        self.fd = os.open(path, os.O_RDONLY)
        self.thread = threading.Thread(target=self._run, name="shardcast-hash", daemon=True)
        self.thread.start()

    def mark(self, index: int) -> None:
        with self.cv:
            self.ready.add(index)
            self.written.pop(index, None)
            self.cv.notify()

    def progress(self, index: int, end: int, data: memoryview | None = None) -> None:
        """``end`` contiguous bytes of shard ``index`` are on disk, the last of them ``data`` (if given): hashed
        here from that buffer when they are the next bytes of the file to hash and the thread is not reading."""
        if index != self.next:
            self.written[index] = end  # read without the lock by nobody else: the GIL keeps it whole
            return
        with self.cv:
            self.written[index] = end
            if data is None or self.busy or self.dirty or self.pos != end - len(data) or index != self.next:
                self.cv.notify()  # the thread reads them back
                return
            self.busy = True
        try:
            self.h.update(data)
        finally:
            with self.cv:
                self.busy = False
                self.pos = end
                self.cv.notify()

    def reset(self, index: int) -> None:
        with self.cv:
            self.written.pop(index, None)
            if index == self.next and (self.pos or self.busy):
                self.dirty = True
                self.cv.notify()

    def _available(self) -> int:
        """Bytes of shard ``next`` that can be hashed now (call with the lock held)."""
        if self.next in self.ready:
            return self.m.shards[self.next - 1].size
        return self.written.get(self.next, 0)

    def _run(self) -> None:
        n = self.m.num_shards
        while self.next <= n:
            with self.cv:
                while True:
                    if self.next in self.ready and self.pos >= self.m.shards[self.next - 1].size:
                        self.next += 1
                        self.pos = 0
                        if self.next > n:
                            return
                        continue
                    if not self.busy and (self.dirty or self.closed or self._available() > self.pos):
                        break
                    self.cv.wait()
                if self.dirty or self._available() <= self.pos:
                    return
                upto = self._available()
                self.busy = True
            off = self.m.shard_offset(self.next) + self.pos
            if not self._hash_range(off, upto - self.pos):
                return  # file shorter than expected: finish() reports a mismatch
            with self.cv:
                self.busy = False
                self.pos = upto

    def _hash_range(self, off: int, n: int) -> bool:
        """Hash ``n`` bytes of the file at ``off`` from the page cache (mapped: no copy); False if it is short."""
        if os.fstat(self.fd).st_size < off + n:
            return False
        if n == 0:
            return True
        start = off - off % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(self.fd, off + n - start, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                       prot=mmap.PROT_READ, offset=start) as mm, memoryview(mm) as view:
            self.h.update(view[off - start:])
        return True

    def finish(self) -> str | None:
        """The digest once every shard was hashed (None if the thread stopped early)."""
        self.close()
        if self.dirty:
            return hash_file(self.path)
        return self.h.hexdigest() if self.next > self.m.num_shards else None

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()
        self.thread.join()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def hash_file(path: Path) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update_mmap(str(path))
    return h.hexdigest()
