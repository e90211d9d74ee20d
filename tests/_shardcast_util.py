"""Helpers shared by the shardcast tests (real servers on 127.0.0.1 ephemeral ports)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from swarmrl.shardcast.client.fetch import hash_file


def make_file(path: Path, size: int, seed: int = 0) -> Path:
    import random

    rnd = random.Random(seed)
    path.write_bytes(rnd.randbytes(size))
    return path


def same_file(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size and hash_file(a) == hash_file(b)


async def wait_until(pred, timeout: float = 20.0, step: float = 0.02) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(step)


def raw_http(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes (no client-side path normalisation) and return the full response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        buf = b""
        try:
            while True:
                c = s.recv(65536)
                if not c:
                    break
                buf += c
                head, sep, body = buf.partition(b"\r\n\r\n")
                if sep:  # stop after one complete response (the server may keep the connection)
                    for line in head.split(b"\r\n")[1:]:
                        k, _, v = line.partition(b":")
                        if k.strip().lower() == b"content-length" and len(body) >= int(v):
                            return buf
        except (TimeoutError, ConnectionResetError):
            pass
    return buf


def status_of(resp: bytes) -> int:
    line = resp.split(b"\r\n", 1)[0]
    return int(line.split()[1]) if line.startswith(b"HTTP/") else 0


def flip_byte(path: Path, at: int = 0) -> None:
    with path.open("r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
