"""The orchestrator's HTTP routes: one module-level ``fastapi.APIRouter`` per group of callers, each endpoint
getting its service and the auth / rate-limit dependencies from ``deps`` (read from the app's state).
``http.create_app`` includes them in this order (the order the routes were always registered in):

- ``public``: unsigned reads, rate-limited per source address (ping, metrics, health, node and ledger views, the
  dashboard and its ``/v1/stats/...`` API)
- ``membership``: joining (registration), the stake deposits that back it, heartbeats (which carry assignments)
- ``submissions``: uploading a rollout file (or declining an assignment), a submission's status, its file (validator, trainer)
- ``validator``: pending submissions (long poll), verdicts
- ``trainer``: step, weight servers, accepted submissions (long poll)

``deps`` holds what they share: the path and query limits, the error responses, the service dependencies,
``signed(...)`` (authentication) and ``JOINS`` / ``PUBLIC`` (the per-address buckets of ``AddressLimits``)."""
