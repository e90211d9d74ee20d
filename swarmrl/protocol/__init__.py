"""The protocol: permissionless nodes with Ed25519 identities, signed requests, seeded assignments,
content-addressed submissions, a validator and an append-only ledger with stakes and slashing.

Modules: ``signing`` (pure request-signing scheme), ``models``/``db`` (SQLAlchemy state), ``schemas``
(API bodies), ``assignment`` (seeded tasks, budgets), ``ledger``, ``store``, ``orchestrator`` (FastAPI
app), ``validator`` (checks + polling loop), ``client`` (signed httpx clients).
"""
