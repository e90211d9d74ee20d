"""Server base URLs as users type them (``host:port``, ``http://host:port/``, ``http://host:port//path``)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

__all__ = ["normalize_url", "normalize_urls"]

_SLASHES = re.compile(r"/{2,}")


def normalize_url(url: str) -> str:
    """A server's base URL as users type it, made canonical: ``host:port`` gets ``http://``, runs of slashes
    in the path count as one, trailing slashes go (``http://h:1//x/`` -> ``http://h:1/x``). ValueError for what
    is not a plain http:// base URL (other schemes, credentials, queries, fragments, a bad port)."""
    u = str(url).strip()
    if not u:
        raise ValueError("empty server URL")
    if "://" not in u:
        u = "http://" + u.lstrip("/")
    parts = urlsplit(u)
    if parts.scheme.lower() != "http":
        raise ValueError(f"server URL {url!r}: only http:// is supported")
    if not parts.hostname or "@" in parts.netloc:
        raise ValueError(f"server URL {url!r}: expected http://HOST[:PORT][/PATH]")
    try:
        parts.port  # noqa: B018  # raises ValueError for a bad port
    except ValueError as e:
        raise ValueError(f"server URL {url!r}: {e}") from None
    if parts.query or parts.fragment:
        raise ValueError(f"server URL {url!r}: a base URL has no query or fragment")
    path = _SLASHES.sub("/", parts.path).rstrip("/")
    return f"http://{parts.netloc}{path}"


def normalize_urls(v: object) -> object:
    """A config's list of server URLs as users type them (a pydantic "before" validator: anything but a list of
    strings is left for the field's own validation to refuse)."""
    if isinstance(v, list):
        return [normalize_url(u) if isinstance(u, str) else u for u in v]
    return v
