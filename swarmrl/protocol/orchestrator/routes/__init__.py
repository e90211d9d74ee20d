"""The orchestrator's HTTP routes, one module per group of callers, each an ``add_routes(app, api)``
that ``http.create_app`` calls in this order (the order the routes were always registered in):

- ``public``: unsigned reads, rate-limited per source address (ping, metrics, health, node and ledger views, the
  dashboard and its ``/v1/stats/...`` API)
- ``membership``: joining (registration), the stake deposits that back it, heartbeats (which carry assignments)
- ``submissions``: uploading a rollout file, a submission's status, its file (validator, trainer)
- ``validator``: pending submissions (long poll), verdicts
- ``trainer``: step, weight servers, accepted submissions (long poll)

``deps`` holds what they share: the path and query limits, the error responses, and ``RouteDeps`` (the
orchestrator, its config and the per-app dependencies that authenticate and rate-limit a request)."""
