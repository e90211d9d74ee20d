"""The live dashboard: one HTML page (``static/``, charts drawn by its own small SVG code, nothing fetched from
elsewhere) that polls the stats API ``GET /v1/stats/{overview,nodes,trainer,policy}``. The orchestrator serves
page and API from its database (``swarmrl.protocol.orchestrator``); ``swarmrl run --local`` serves them from the
run directory's metrics files (``swarmrl.dashboard.server``). The response models are in ``schemas``."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

_SCRIPT = "<!-- dashboard.js -->"


@lru_cache(maxsize=1)
def page_html() -> str:
    """The page: ``dashboard.html`` with ``dashboard.js`` inlined (one self-contained response)."""
    static = resources.files("swarmrl.dashboard") / "static"
    html = (static / "dashboard.html").read_text(encoding="utf-8")
    js = (static / "dashboard.js").read_text(encoding="utf-8")
    return html.replace(_SCRIPT, "<script>\n" + js + "\n</script>")
