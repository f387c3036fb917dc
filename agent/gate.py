"""The execution gate: an approved call runs at most once, and only the version approved.

START_EXECUTION is committed for the approval before the tool runs (storage/executions.py);
only its first caller runs the call, and FINISH_EXECUTION records the output after. Any
later caller (a second resume of the same turn, a recovery after a crash, another replica)
is answered from the record: the output of a call that finished, "outcome unknown" for
one that started and never finished. It is never run again.

Three roads lead here: a restart of an approved call, through the approval middleware
(`run_approved`); a call a standing approval covers, approved as it is made (`run`, from the
middleware too); and an approved call with an approver's changes, which Genkit would refuse
to restart, run by the resume itself (`run_edited`). What the model gets is the tool's
output, with the approvers' notes beside it when they left any (`noted`); the record keeps
the tool's own output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, assert_never

from genkit import Action, Interrupt, MultipartToolResponse, Part, ToolRequest
from genkit._ai._tools import (
    run_tool_request,  # private: no public name runs a tool with resumed metadata
)
from genkit.middleware import GenerateMiddlewareContext, ToolHookParams

from agent.inputs import jsonable
from agent.observer import Watch
from agent.questions import asking
from agent.scope import Outside, TurnScope
from storage.domain import Approval, Approved, Finished, Started
from storage.executions import ExecutionStore
from storage.lifecycle import IllegalTransition

log = logging.getLogger(__name__)

UNKNOWN_OUTCOME = {
    "ok": False,
    "error": (
        "outcome unknown: the approved call started but its result was never recorded "
        "(the process stopped, or the call ran past its time limit). It was not run again; "
        "a human must check whether it took effect."
    ),
}
NextTool = Callable[[ToolHookParams, GenerateMiddlewareContext], Awaitable[MultipartToolResponse]]


@dataclass(frozen=True)
class ToolTimeouts:
    """How long an approved call may run before it is stopped (TOOL_TIMEOUT_SECONDS, or its
    tool's `tool_timeout` in POLICY_FILE). Not the model-turn timeout: that one stops while
    an approved call runs, so a long tool is never cut off by it."""

    default: timedelta = timedelta(minutes=15)
    tools: Mapping[str, timedelta] = field(default_factory=dict)

    def of(self, tool: str) -> float:
        return self.tools.get(tool, self.default).total_seconds()


DEFAULT_TOOL_TIMEOUTS = ToolTimeouts()  # every tool: 15 minutes


@dataclass(frozen=True)
class Gate:
    """The one gate before an approved call runs; one per application, shared by the
    middleware (restarts) and the resume (edited calls). How each call ended is counted
    when its turn ends (agent/observer.py), not here; but a call a standing approval
    covered is in no resume's settled requests, so the gate tells `watch` of it."""

    executions: ExecutionStore
    clock: Callable[[], datetime]
    timeouts: ToolTimeouts = DEFAULT_TOOL_TIMEOUTS
    # Entered around the call, so whoever runs the turn can give its place to other work.
    outside: Outside = contextlib.nullcontext
    watch: Watch | None = None  # told of covered calls (None: nobody counts them)

    async def run_approved(
        self,
        approval_id: str,
        scope: TurnScope,
        params: ToolHookParams,
        ctx: GenerateMiddlewareContext,
        next_fn: NextTool,
    ) -> MultipartToolResponse:
        """Run a restarted call under `approval_id` at most once: only an approval this
        resume claimed, of this very call, and only its first caller runs it."""
        tool, ref = params.tool.name, params.tool_request_part.tool_request.ref or ""  # type: ignore[union-attr]
        approval = scope.approvals.get(approval_id)
        if approval is None or (approval.request.tool, approval.request.ref) != (tool, ref):
            log.warning(
                "a restart of %s carried approval %s, not this call's",
                tool,
                approval_id,
                extra={"approval_id": approval_id},
            )
            raise Interrupt({"why": f"{tool} needs approval (the approval given was not valid)"})
        return await self.run(approval, scope, params, ctx, next_fn)

    async def run_covered(
        self,
        approval: Approval,
        scope: TurnScope,
        params: ToolHookParams,
        ctx: GenerateMiddlewareContext,
        next_fn: NextTool,
    ) -> MultipartToolResponse:
        """Run a call a standing approval approved as it was made (agent/standing.py): the
        tool sees it as any approved call, its approval id (its idempotency key) and who
        approved it in `resumed` metadata, and the standing approval it ran under."""
        assert isinstance(approval.decision, Approved)
        meta = {"tool_approved": True, "approval_id": approval.id}
        meta |= {"approved_by": approval.decision.by, "standing": approval.under}
        part = params.tool_request_part
        resumed = part.model_copy(update={"metadata": (part.metadata or {}) | {"resumed": meta}})
        approved = ToolHookParams(tool_request_part=resumed, tool=params.tool)
        if self.watch is not None:
            self.watch.covered(approval)
        return await self.run(approval, scope, approved, ctx, next_fn)

    async def run(
        self,
        approval: Approval,
        scope: TurnScope,
        params: ToolHookParams,
        ctx: GenerateMiddlewareContext,
        next_fn: NextTool,
    ) -> MultipartToolResponse:
        """Run an approved call of this turn (a restart's, checked above, or one a standing
        approval covers) at most once; the model gets its output, with the approvers' notes
        (`noted`)."""
        tool = approval.request.tool
        try:
            await self.executions.start_execution(approval, now=self.clock())
        except IllegalTransition as refused:
            return MultipartToolResponse(output=noted(approval, answer_from_record(refused, tool)))
        seconds = self.timeouts.of(tool)
        limit = asyncio.timeout(seconds)
        try:
            with scope.model_time.stopped():
                async with self.outside(), limit:
                    result = await next_fn(params, ctx)
            output = jsonable(result.output)
        except Exception as exc:
            if asking(exc) is None and limit.expired():  # it stays "started": outcome unknown
                _ran_past(tool, seconds, approval)
                self._covered_ended(approval, Started())
                return MultipartToolResponse(output=noted(approval, cut_off(tool, seconds)))
            output = _failed(tool, approval, exc)
            result = MultipartToolResponse(output=output)
        finished = await self.executions.finish_execution(approval, output=output, now=self.clock())
        self._covered_ended(approval, Finished(output))
        if scope.ran is not None:
            scope.ran(finished)
        if approval.notes():  # the record keeps the tool's own output; the model gets both
            return MultipartToolResponse(
                output=noted(approval, output), content=result.content, metadata=result.metadata
            )
        return result

    def _covered_ended(self, approval: Approval, execution: Started | Finished) -> None:
        """A call a standing approval covered ended: the watch counts it (a restarted call
        is counted when its resume ends)."""
        if approval.under is not None and self.watch is not None:
            self.watch.covered_ended(replace(approval, execution=execution))

    async def run_edited(self, tool: Action | None, approval: Approval) -> None:
        """Run an approved call with its approver's changes, at most once: Genkit refuses a
        restart whose input differs, so the resume runs it here, behind the same gate as
        `run_approved`. The tool sees the approval id (`resumed_metadata`) and the input it
        was asked for (`original_input`). Only a call whose start is recorded here runs;
        any other caller changes nothing. One that runs past its time is stopped and stays
        "started" (outcome unknown)."""
        version = approval.current
        assert version.edit is not None
        try:
            await self.executions.start_execution(approval, now=self.clock())
        except IllegalTransition:
            return  # started before (a crash, or another replica): the record answers it
        r = approval.request
        meta = {"tool_approved": True, "approval_id": approval.id, "approved_by": version.edit.by}
        part = Part(
            tool_request=ToolRequest(name=r.tool, ref=r.ref or None, input=version.actual),
            metadata={"resumed": meta, "replacedInput": r.actual},
        )
        seconds = self.timeouts.of(r.tool)
        limit = asyncio.timeout(seconds)
        try:
            if tool is None:
                raise LookupError(f"the agent no longer has {r.tool}")
            async with limit:
                raw = await run_tool_request(tool=tool, tool_request_part=part)
            output = jsonable(raw.output if isinstance(raw, MultipartToolResponse) else raw)
        except Exception as exc:
            if asking(exc) is None and limit.expired():
                _ran_past(r.tool, seconds, approval)
                return
            output = _failed(r.tool, approval, exc)
        await self.executions.finish_execution(approval, output=output, now=self.clock())


def _ran_past(tool: str, seconds: float, approval: Approval) -> None:
    log.error(
        "approved tool %s ran past %gs (approval %s)",
        tool,
        seconds,
        approval.id,
        extra={"approval_id": approval.id, "turn_id": approval.turn_id},
    )


def _failed(tool: str, approval: Approval, exc: Exception) -> dict[str, Any]:
    """What the model gets for an approved call that raised (logged once): that it asked a
    person for more instead of running (a restart cannot ask: docs/contributors.md), or
    that it failed."""
    if asking(exc) is not None:
        log.warning("approved tool %s asked a question; the model is told", tool)
        return {
            "ok": False,
            "error": f"{tool} asked for more input after it was approved and did not "
            "run. Ask the person with askHuman, then call it again.",
        }
    log.error(  # what the tool raised (Genkit wraps it in a GenkitError)
        "approved tool %s failed (approval %s)",
        tool,
        approval.id,
        exc_info=exc,
        extra={"approval_id": approval.id, "turn_id": approval.turn_id},
    )
    return {"ok": False, "error": f"the tool {tool} failed; it may need a retry"}


def noted(approval: Approval, output: Any) -> Any:
    """What the model gets for an approved call: the tool's output as it is, or, when its
    approvers left notes, `{"output": <the output>, "note": "<text>"}` (`note_of`)."""
    return {"output": output} | note if (note := note_of(approval)) else output


def note_of(approval: Approval) -> dict[str, str]:
    """`{"note": …}` when the call's approvers left notes ({} when not): one approver's
    note as written; several (a quorum's votes) one per line, as `<user id>: <note>`."""
    if not (notes := approval.notes()):
        return {}
    if len(notes) == 1:
        return {"note": notes[0][1]}
    return {"note": "\n".join(f"{by}: {note}" for by, note in notes)}


def cut_off(tool: str, seconds: float) -> dict[str, Any]:
    """What the model gets for an approved call stopped by its own timeout."""
    return {
        "ok": False,
        "error": (
            f"{tool} did not finish within {seconds:g} seconds and was stopped: its outcome "
            "is unknown. It was not run again; a human must check whether it took effect."
        ),
    }


def answer_from_record(refused: IllegalTransition, tool: str) -> Any:
    """What the model gets for a call whose execution gate refused it: a second resume of a
    call that already ran (or died running) is answered from the record, never rerun; a
    restart that its approval does not allow is interrupted again."""
    current = refused.current
    if (
        current is not None
        and isinstance(current.decision, Approved)
        and isinstance(current.execution, Started | Finished)
    ):
        return recorded(current.execution)
    log.warning("a restart of %s that its approval does not allow: %s", tool, refused)
    raise Interrupt({"why": f"{tool} needs approval (the approval given was not valid)"})


def recorded(execution: Started | Finished) -> Any:
    """A call that already ran (or died running) is answered with its record, never rerun."""
    match execution:
        case Finished(output=output):
            return output
        case Started():
            return UNKNOWN_OUTCOME
        case unreachable:
            assert_never(unreachable)
