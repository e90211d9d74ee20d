"""The orchestrator: membership, signed requests, seeded assignments, uploads, verdicts, ledger, stats.

Services over one injected database (``db.Database``, the session factory), each a plain class with a public API
that gets what it uses at construction (never another's private members): ``membership.Membership``
(principals, deposits, registration, the sweep of dead nodes), ``assignments.Assignments`` (heartbeats, seeded
assignments, demand, orphan reassignment) with ``hot_path.HotPath`` (steady-state heartbeats from memory),
``submissions.Submissions`` (upload admission and acceptance, the pending queue, the views of submissions),
``verdicts.Verdicts`` (a verdict's bookkeeping), ``ledger.Ledger`` (credits, slashes, balances), ``stats.Stats``
(the dashboard's and operators' views); small shared pieces: ``auth`` (signatures, nonces, the per-key rate
limit), ``run_state`` (step, policy version, weight servers), ``orphans`` (work put back up), ``telemetry``,
``changes`` (long polls), ``heartbeat_cache`` (the hot path's memory and batch writer). ``Orchestrator``
(``service``) is the composition root that builds and closes them.

``create_app`` (``http``) puts them in a FastAPI app, with one router per group of callers (``routes``), whose
request/response bodies are the pydantic models in ``schemas`` (so the API is documented by its OpenAPI schema at
``/openapi.json``). Every state change is a database transaction, so restarting the process on the same database
loses nothing.
"""

from __future__ import annotations

from swarmrl.protocol.orchestrator.auth import RateLimiter, SignedRequest
from swarmrl.protocol.orchestrator.errors import Principal, ProtocolError
from swarmrl.protocol.orchestrator.service import Orchestrator
from swarmrl.utils.lazy import lazy_exports

# The HTTP layer loads on first use: the services (e.g. ``swarmrl.protocol.orchestrator.service``) must not
# pull in fastapi, starlette or uvicorn. ``serve`` (``runner``) hands uvicorn
# "swarmrl.protocol.orchestrator:app_from_env".
_HTTP = "swarmrl.protocol.orchestrator.http"
_RUNNER = "swarmrl.protocol.orchestrator.runner"
_EXPORTS = {**{name: _HTTP for name in ("create_app", "UPLOAD_PREFIX", "MAX_ID", "IdParam", "API_DESCRIPTION")},
            "app_from_env": _RUNNER, "serve": _RUNNER}
__all__ = ["Orchestrator", "ProtocolError", "Principal", "RateLimiter", "SignedRequest", "create_app",
           "app_from_env", "serve", "UPLOAD_PREFIX", "MAX_ID", "IdParam", "API_DESCRIPTION"]

__getattr__ = lazy_exports(_EXPORTS)
