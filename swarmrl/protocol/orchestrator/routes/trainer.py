"""The trainer's routes (``router``, reached through its adapter; over ``RunState`` and ``Submissions``): advancing
the step, announcing the weight servers, and the accepted submissions it trains on (a long poll over the verdict
counter, optionally with files inline)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi import Path as PathParam

from swarmrl.protocol.orchestrator.errors import Principal
from swarmrl.protocol.orchestrator.routes.deps import (
    ERRORS,
    MAX_CHANGES_WAIT_S,
    MAX_HAVE_CHARS,
    MAX_ID,
    RunStateDep,
    SubmissionsDep,
    signed,
)
from swarmrl.protocol.schemas import AcceptedList, StepReply, StepRequest, WeightsReply, WeightsRequest

router = APIRouter()


@router.post("/v1/trainer/step", response_model=StepReply, responses=ERRORS, tags=["trainer"])
def set_step(body: StepRequest, run: RunStateDep, p: Principal = Depends(signed("trainer"))) -> StepReply:
    return run.set_step(body)


@router.post("/v1/trainer/weights", response_model=WeightsReply, responses=ERRORS, tags=["trainer"])
def set_weights(body: WeightsRequest, run: RunStateDep, p: Principal = Depends(signed("trainer"))) -> WeightsReply:
    """Announce the SHARDCAST servers (relays) and manifest-signing key; heartbeats hand them to nodes."""
    return run.set_weights(body)


@router.get("/v1/trainer/accepted", response_model=AcceptedList, responses=ERRORS, tags=["trainer"])
def accepted_window(subs: SubmissionsDep, since: Annotated[int, Query(ge=-1, le=MAX_ID)] = -1,
                    wait: Annotated[float, Query(ge=0, le=MAX_CHANGES_WAIT_S)] = 0.0,
                    inline: Annotated[int, Query(ge=0, le=256)] = 0,
                    have: Annotated[str, Query(max_length=MAX_HAVE_CHARS, pattern=r"^([0-9]{1,19}(,[0-9]{1,19})*)?$")] = "",
                    p: Principal = Depends(signed("trainer"))) -> AcceptedList:
    """Accepted submissions of the trainer's current step and the async window after it, once the verdict
    counter (optimistic: the upload counter) is no longer ``since`` or after ``wait`` seconds (a long poll;
    ``changes`` in the answer is the counter to pass next). With ``inline=N``, ``files`` carries the files of
    up to N listed submissions whose ids are not in ``have`` (comma-separated: the ones the trainer holds)."""
    return subs.wait_accepted(since, wait, inline, frozenset(int(x) for x in have.split(",") if x))


@router.get("/v1/trainer/steps/{step}/submissions", response_model=AcceptedList, responses=ERRORS, tags=["trainer"])
def accepted(step: Annotated[int, PathParam(ge=0, le=MAX_ID)], subs: SubmissionsDep,
             p: Principal = Depends(signed("trainer"))) -> AcceptedList:
    """Accepted submissions for a step (plus pending ones when the orchestrator runs optimistic)."""
    return subs.accepted(step)
