"""The protocol: permissionless nodes with Ed25519 identities, signed requests, seeded assignments,
content-addressed submissions, a validator and an append-only ledger with stakes and slashing.

Modules: ``signing`` (pure request-signing scheme), ``tables``/``db`` (the SQLAlchemy tables, the database),
``schemas`` (API bodies), ``content_store`` (the content-addressed file store of uploads), ``orchestrator``
(services over the database, their FastAPI routers, the ledger), ``checks``/``validator`` (the validator's
checks and polling loop), ``spot_checks`` (which submissions get the model checks), ``client`` (signed httpx
clients), ``node`` (a node's membership loop).
"""
