"""The orchestrator: membership, signed requests, seeded assignments, uploads, verdicts, ledger.

``Orchestrator`` (``service``) is the service logic over the database, with no HTTP: one module per
responsibility (``errors``, ``auth``, ``membership``, ``assigning``, ``submissions``, ``views``) composed in
``service``. ``create_app`` (``http``) wraps it in a FastAPI app whose request/response bodies are the
pydantic models in ``schemas`` (so the API is documented by its OpenAPI schema at ``/openapi.json``). Every
state change is a database transaction, so restarting the process on the same database loses nothing.
"""

from __future__ import annotations

from swarmrl.protocol.orchestrator.auth import RateLimiter
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.utils.lazy import lazy_exports

# The HTTP layer loads on first use: the service (e.g. ``swarmrl.protocol.orchestrator.service``) must not
# pull in fastapi, starlette or uvicorn. ``serve`` (``runner``) hands uvicorn
# "swarmrl.protocol.orchestrator:app_from_env".
_HTTP = "swarmrl.protocol.orchestrator.http"
_RUNNER = "swarmrl.protocol.orchestrator.runner"
_EXPORTS = {**{name: _HTTP for name in ("create_app", "UPLOAD_PREFIX", "MAX_ID", "IdParam", "API_DESCRIPTION")},
            "app_from_env": _RUNNER, "serve": _RUNNER}
__all__ = ["Orchestrator", "ProtocolError", "Principal", "RateLimiter", "create_app", "app_from_env", "serve",
           "UPLOAD_PREFIX", "MAX_ID", "IdParam", "API_DESCRIPTION"]

__getattr__ = lazy_exports(_EXPORTS)
