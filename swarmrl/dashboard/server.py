"""A small HTTP server (standard library, one thread per request) for ``swarmrl run --local``: the dashboard
page at ``/dashboard`` and the stats API ``/v1/stats/...`` of ``RunDirStats``, the same paths and JSON as the
orchestrator serves in swarm mode. Each answer is reused for ``CACHE_S``, so many open pages cost little."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel

from swarmrl.dashboard import page_html
from swarmrl.dashboard.runfiles import RunDirStats
from swarmrl.dashboard.schemas import MAX_NODES, MAX_POINTS

log = logging.getLogger("swarmrl.dashboard")

CACHE_S = 1.0


def _limit(query: dict[str, list[str]], default: int, most: int) -> int:
    try:
        return max(1, min(most, int(query.get("limit", [default])[0])))
    except ValueError:
        return default


class DashboardServer:
    """Serves a run directory's dashboard on ``host:port`` (0: a free port) from a daemon thread."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.stats = RunDirStats(root)
        self._cache: dict[tuple, tuple[float, bytes]] = {}
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                server._handle(self)

            def log_message(self, fmt: str, *args: object) -> None:  # requests are not worth a log line each
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="dashboard", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/dashboard"

    def start(self) -> DashboardServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def _json(self, key: tuple, make: Callable[[], BaseModel]) -> bytes:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit[0] < CACHE_S:
                return hit[1]
        body = make().model_dump_json().encode()
        with self._lock:
            self._cache[key] = (now, body)
        return body

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        u = urlsplit(h.path)
        q = parse_qs(u.query)
        st = self.stats
        routes: dict[str, Callable[[], tuple[tuple, Callable[[], BaseModel]]]] = {
            "/v1/stats/overview": lambda: (("overview",), st.overview),
            "/v1/stats/nodes": lambda: (("nodes", n := _limit(q, MAX_NODES, MAX_NODES)), lambda: st.nodes(n)),
            "/v1/stats/trainer": lambda: (("trainer", n := _limit(q, 500, MAX_POINTS)), lambda: st.trainer(n)),
            "/v1/stats/policy": lambda: (("policy",), st.policy),
        }
        try:
            if u.path in ("/dashboard", "/dashboard/", "/"):
                status, ctype, body = 200, "text/html; charset=utf-8", page_html().encode()
            elif u.path in routes:
                status, ctype, body = 200, "application/json", self._json(*routes[u.path]())
            else:
                status, ctype, body = 404, "application/json", b'{"detail":"not found"}'
        except Exception:  # a torn file or a race with the run: an error reply, not a dead server
            log.exception("dashboard request %s failed", u.path)
            status, ctype, body = 500, "application/json", b'{"detail":"internal error"}'
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Cache-Control", "no-store")
        h.end_headers()
        h.wfile.write(body)
