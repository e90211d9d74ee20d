"""Unsigned reads (``router``): liveness, the run's signed description, Prometheus metrics, health, a node's record and ledger, the dashboard and
its ``/v1/stats/...`` API (``Stats``). All but ``/v1/ping`` spend a token of the source address's public bucket."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from swarmrl.dashboard import page_html
from swarmrl.dashboard.schemas import MAX_NODES, MAX_POINTS, NodeList, Overview, PolicyStats, TrainerCurves
from swarmrl.protocol.description import SignedDescription
from swarmrl.protocol.orchestrator.routes.deps import (
    ERRORS,
    PUBLIC,
    DescriberDep,
    LedgerDep,
    MembershipDep,
    StatsDep,
    TelemetryDep,
)
from swarmrl.protocol.schemas import Balance, ErrorBody, Health, NodeInfo

router = APIRouter()


@router.get("/v1/ping", tags=["public"])
async def ping() -> dict[str, bool]:
    """Unsigned no-op (liveness; the benchmark's baseline)."""
    return {"ok": True}


@router.get("/metrics", response_class=Response, tags=["public"], dependencies=PUBLIC,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 429: {"model": ErrorBody}})
def metrics(telemetry: TelemetryDep) -> Response:
    """Prometheus metrics (text format): counters of this process, and gauges of the database read by one
    query at most every few seconds. Rate-limited per address like the other public views."""
    return Response(telemetry.prom.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/run", response_model=SignedDescription, responses=ERRORS, tags=["public"], dependencies=PUBLIC)
def run_description(describer: DescriberDep) -> SignedDescription:
    """The run's description, signed by this orchestrator's key: contract (task, sampling, scoring, proofs), the
    packages generating its tasks, the base model's identity, weight servers and their key, heartbeat pacing and
    minimum stake: all a node needs to join (``swarmrl node join URL``)."""
    return describer.describe()


@router.get("/v1/health", response_model=Health, responses=ERRORS, tags=["public"], dependencies=PUBLIC)
def health(stats: StatsDep) -> Health:
    return stats.health()


@router.get("/v1/nodes/{node_id}", response_model=NodeInfo, responses=ERRORS, tags=["public"], dependencies=PUBLIC)
def node_info(node_id: str, members: MembershipDep) -> NodeInfo:
    return members.node_info(node_id)


@router.get("/v1/nodes/{node_id}/ledger", response_model=Balance, responses=ERRORS, tags=["public"],
            dependencies=PUBLIC)
def node_ledger(node_id: str, ledger: LedgerDep) -> Balance:
    return ledger.balance(node_id)


@router.get("/dashboard", response_class=HTMLResponse, tags=["public"], dependencies=PUBLIC,
            responses={429: {"model": ErrorBody}})
def dashboard() -> HTMLResponse:
    """The live dashboard (one self-contained HTML page polling ``/v1/stats/...``; see docs/dashboard.md)."""
    return HTMLResponse(page_html(), headers={"Cache-Control": "no-store"})


@router.get("/v1/stats/overview", response_model=Overview, responses=ERRORS, tags=["stats"], dependencies=PUBLIC)
def stats_overview(stats: StatsDep) -> Overview:
    """Step, policy version, worker nodes by status, the validation queue and verdict counts."""
    return stats.overview()


@router.get("/v1/stats/nodes", response_model=NodeList, responses=ERRORS, tags=["stats"], dependencies=PUBLIC)
def stats_nodes(stats: StatsDep, limit: Annotated[int, Query(ge=1, le=MAX_NODES)] = MAX_NODES) -> NodeList:
    """Worker nodes (at most ``limit``, active first, then by throughput) with stake, credits, verdicts,
    slashes and the policy version of their latest assignment; ``total`` counts them all."""
    return stats.nodes(limit)


@router.get("/v1/stats/trainer", response_model=TrainerCurves, responses=ERRORS, tags=["stats"], dependencies=PUBLIC)
def stats_trainer(stats: StatsDep, limit: Annotated[int, Query(ge=1, le=MAX_POINTS)] = 500) -> TrainerCurves:
    """The trainer's newest ``limit`` policy-version records (loss, reward, held-out accuracy), as it posts
    them with its step."""
    return stats.trainer(limit)


@router.get("/v1/stats/policy", response_model=PolicyStats, responses=ERRORS, tags=["stats"], dependencies=PUBLIC)
def stats_policy(stats: StatsDep) -> PolicyStats:
    """The current policy version, the SHARDCAST servers announced to nodes and the nodes per version."""
    return stats.policy()
