"""The trainer's routes (reached through its adapter): advancing the step, announcing the weight servers,
and the accepted submissions it trains on (a long poll over the verdict counter, optionally with files inline)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Query
from fastapi import Path as PathParam

from swarmrl.protocol.orchestrator.errors import Principal
from swarmrl.protocol.orchestrator.routes.deps import ERRORS, MAX_CHANGES_WAIT_S, MAX_HAVE_CHARS, MAX_ID, RouteDeps
from swarmrl.protocol.schemas import AcceptedList, StepReply, StepRequest, WeightsReply, WeightsRequest


def add_routes(app: FastAPI, api: RouteDeps) -> None:
    """The trainer's step, weight servers and accepted lists, on ``app``."""
    orch, signed = api.orch, api.signed

    @app.post("/v1/trainer/step", response_model=StepReply, responses=ERRORS, tags=["trainer"])
    def set_step(body: StepRequest, p: Principal = Depends(signed("trainer"))) -> StepReply:
        return orch.set_step(body)

    @app.post("/v1/trainer/weights", response_model=WeightsReply, responses=ERRORS, tags=["trainer"])
    def set_weights(body: WeightsRequest, p: Principal = Depends(signed("trainer"))) -> WeightsReply:
        """Announce the SHARDCAST servers (relays) and manifest-signing key; heartbeats hand them to nodes."""
        return orch.set_weights(body)

    @app.get("/v1/trainer/accepted", response_model=AcceptedList, responses=ERRORS, tags=["trainer"])
    def accepted_window(since: Annotated[int, Query(ge=-1, le=MAX_ID)] = -1,
                        wait: Annotated[float, Query(ge=0, le=MAX_CHANGES_WAIT_S)] = 0.0,
                        inline: Annotated[int, Query(ge=0, le=256)] = 0,
                        have: Annotated[str, Query(max_length=MAX_HAVE_CHARS, pattern=r"^([0-9]{1,19}(,[0-9]{1,19})*)?$")] = "",
                        p: Principal = Depends(signed("trainer"))) -> AcceptedList:
        """Accepted submissions of the trainer's current step and the async window after it, once the verdict
        counter (optimistic: the upload counter) is no longer ``since`` or after ``wait`` seconds (a long poll;
        ``changes`` in the answer is the counter to pass next). With ``inline=N``, ``files`` carries the files of
        up to N listed submissions whose ids are not in ``have`` (comma-separated: the ones the trainer holds)."""
        kind = "uploads" if orch.cfg.optimistic else "verdicts"
        orch.changes.wait(kind, since, wait)
        seen = orch.changes.generation(kind)  # before listing
        got = orch.accepted_window()
        got.changes = seen
        if inline and got.items:
            held = {int(x) for x in have.split(",") if x}
            got.files = orch.inline_files([it for it in got.items if it.submission_id not in held], inline)
        return got

    @app.get("/v1/trainer/steps/{step}/submissions", response_model=AcceptedList, responses=ERRORS,
             tags=["trainer"])
    def accepted(step: Annotated[int, PathParam(ge=0, le=MAX_ID)], p: Principal = Depends(signed("trainer"))) -> AcceptedList:
        """Accepted submissions for a step (plus pending ones when the orchestrator runs optimistic)."""
        return orch.accepted(step)

