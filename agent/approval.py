"""The approval middleware: what happens to each model answer and each tool call of a turn.

On a model answer, every tool request gets a ref of ours (`stamp_refs`). On a tool call,
policy decides: a call it allows runs; a question asks a person; a call a live standing
approval covers is approved by it and run through the execution gate (agent/standing.py,
agent/gate.py); any other call is interrupted for approval, with why and a preview; a
restart that carries an approval this resume claimed goes through the gate. The policy is read live,
at each call.

Genkit re-creates middleware from its config on every generate call, so dependencies are
closed over by a class built per application (`approval_middleware`), not passed to
`__init__`. Per-turn facts (which workspace, who asked) come from the turn's scope
(agent/scope.py); what led to a call (agent/context.py) is read off the conversation the
model last answered, kept there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from genkit import GenkitError, Interrupt, Message, Part
from genkit.middleware import (
    BaseMiddleware,
    GenerateMiddlewareContext,
    ModelHookParams,
    MultipartToolResponse,
    ToolHookParams,
)
from genkit.model import ModelResponse

from agent.context import Index, as_provenance, call_context
from agent.gate import Gate, NextTool
from agent.inputs import coerced, invalid_problem, stamp_refs
from agent.policy import Policy, PolicyService
from agent.questions import asked, asking
from agent.runtime import Preview
from agent.scope import Called, ModelCalls, Outside, TurnScope, current_scope
from agent.standing import StandingApprovals
from storage.domain import Context

log = logging.getLogger(__name__)

PREVIEW_TIMEOUT = 2.0  # seconds a tool's preview may take before the card goes without it
PREVIEW_MAX = 20_000  # characters of a preview kept (a file write's diff, say); cards clip
INLINE_TRACE = 4 * 1024  # characters of a conversation traced on the event loop (`_small`)
Check = Callable[[Any], str | None]


async def preview_of(previews: Mapping[str, Preview], tool: str, input: Any) -> str | None:
    """The tool's preview of a call (of each version: an edit gets its own); "" when it
    failed or took too long, None when the tool has none."""
    make = previews.get(tool)
    if make is None:
        return None
    try:
        async with asyncio.timeout(PREVIEW_TIMEOUT):
            text = await make(input if isinstance(input, dict) else {"value": input})
    except Exception:
        log.warning("the preview of %s failed or took over %ss", tool, PREVIEW_TIMEOUT)
        return ""
    return str(text)[:PREVIEW_MAX]


def approved_by(part: Part) -> str | None:
    """The approval id a restart carries (`resumed` metadata, snake_case or camelCase flag as
    Genkit's ToolApproval takes either); None when it carries none. The id alone is not
    trusted: the gate runs only an approval this resume claimed, of this very call. A flag
    with no id behind it is no approval at all."""
    resumed = (part.metadata or {}).get("resumed")
    if not isinstance(resumed, dict):
        return None
    if not (resumed.get("tool_approved") or resumed.get("toolApproved")):
        return None
    approval_id = resumed.get("approval_id")
    return approval_id if isinstance(approval_id, str) else None


@dataclass(frozen=True)
class Calls:
    """How a turn's tool calls are decided: policy, questions, checks, previews, the gate."""

    policies: PolicyService
    previews: Mapping[str, Preview]
    questions: Collection[str]
    checks: Mapping[str, Check]
    gate: Gate
    outside: Outside
    standing: StandingApprovals | None = None  # None: no standing approvals (tests)

    async def decide(
        self, params: ToolHookParams, ctx: GenerateMiddlewareContext, next_fn: NextTool
    ) -> MultipartToolResponse:
        """One tool call: run by the gate, asked of a person, refused, run, or interrupted."""
        scope = current_scope.get()
        tool = params.tool.name
        if scope is None:  # fail closed: no workspace, no policy, no tool
            raise Interrupt({"why": f"{tool} was called outside a Greenlight turn"})
        if (approval_id := approved_by(params.tool_request_part)) is not None:
            return await self.gate.run_approved(approval_id, scope, params, ctx, next_fn)
        request = params.tool_request_part.tool_request
        raw = request.input if request else None
        ref = request.ref if request else None
        question = tool in self.questions  # it only asks: never gated
        # A call that needs approval needs its card's history too: both in one read.
        policy, history = await self.policies.with_history(scope.team_id, tool, scope.requester)
        # Policy reads the call as the tool's schema takes it, never the raw arguments.
        args, errors = coerced(params.tool, raw)
        problem = invalid_problem(tool, errors) if errors else None
        if problem is None and (check := self.checks.get(tool)) is not None:
            problem = check(raw)  # a file write's path, say (agent/files.py)
        if problem is not None and (question or not policy.allowed):
            # An approver never sees (and never approves) a call that cannot run; nobody
            # is asked a question that its own tool refuses.
            log.info("invalid input for %s; nobody asked", tool)
            return MultipartToolResponse(output={"ok": False, "error": problem})
        if question:
            policy = policy.for_call(raw, scope.requester)
            return await self._run(scope, ref, raw, policy, params, ctx, next_fn)
        # What led to the call is traced only when a rule may read it or a human will.
        context = None
        if policy.rules and not policy.allowed:
            context = await context_of(scope, ref, args)
        sources = context.sources if context else {}
        policy = policy.for_call(args, scope.requester, as_provenance(args, sources))
        if policy.allowed:
            return await self._run(scope, ref, raw, policy, params, ctx, next_fn)
        if self.standing and (covered := await self.standing.cover(scope, ref, args, raw, policy)):
            return await self.gate.run_covered(covered, scope, params, ctx, next_fn)  # no card
        if ref:
            context = context or await context_of(scope, ref, args)
            scope.calls[ref] = Called(policy, context, args, history)
        async with self.outside():
            shown = await preview_of(self.previews, tool, args)
        raise Interrupt({"why": policy.why, "preview": shown})

    async def _run(
        self,
        scope: TurnScope,
        ref: str | None,
        raw: Any,
        policy: Policy,
        params: ToolHookParams,
        ctx: GenerateMiddlewareContext,
        next_fn: NextTool,
    ) -> MultipartToolResponse:
        """Run a call that needs no approval. One that asks a person (it raises `Interrupt`:
        an interrupt made with `define_interrupt` always does, with its `request_metadata`)
        becomes a question: whom it asks and why come from that metadata."""
        tool = params.tool.name
        try:
            async with self.outside():
                return await next_fn(params, ctx)
        except (Interrupt, GenkitError) as exc:
            if (metadata := asking(exc)) is None:
                raise
        if ref:  # what led to it, and its policy (where it goes, who may answer)
            scope.calls[ref] = Called(policy, await context_of(scope, ref, raw))
        why = str(metadata.get("message") or f"{tool} asks for input")
        raise Interrupt({"asks": asked(raw, metadata), "why": why}) from None


def approval_middleware(
    calls: Calls,
    *,
    new_id: Callable[[], str],
    model_calls: AbstractAsyncContextManager[Any] | None = None,
) -> type[BaseMiddleware[Any]]:
    """Build the middleware class bound to this application's `calls`.

    `model_calls`: entered (inside `outside`) around each model call, to cap the calls in
    flight (a semaphore): the turns the cap holds back wait without a work slot.
    """
    model_gate = model_calls or contextlib.nullcontext()

    class GreenlightApproval(BaseMiddleware[Any]):
        async def wrap_model(
            self,
            params: ModelHookParams,
            ctx: GenerateMiddlewareContext,
            next_fn: Callable[
                [ModelHookParams, GenerateMiddlewareContext], Awaitable[ModelResponse]
            ],
        ) -> ModelResponse:
            scope = current_scope.get()
            model = scope.model if scope is not None else ModelCalls()
            model.unanswered = True  # until it answers: a timeout may cancel it any moment
            async with calls.outside(), model_gate:
                response = await next_fn(params, ctx)
            model.unanswered = False
            stamp_refs(response, new_id)
            if scope is not None and response.message is not None:
                scope.conversation[:] = [*params.request.messages, response.message]
                if scope.answered is not None and not response.message.tool_requests:
                    await scope.answered(response.message.text)  # the turn ends with it
            return response

        async def wrap_tool(
            self, params: ToolHookParams, ctx: GenerateMiddlewareContext, next_fn: NextTool
        ) -> MultipartToolResponse:
            return await calls.decide(params, ctx, next_fn)

    return GreenlightApproval


async def context_of(scope: TurnScope, ref: str | None, args: Any) -> Context:
    """What led to a call, traced against the conversation's index, built once for all the
    calls of one model answer: off the event loop (a long conversation takes a while),
    unless the conversation is small (`_small`)."""
    conversation = list(scope.conversation)
    small = _small(conversation)
    key = (len(conversation), id(conversation[-1]) if conversation else 0)
    index = scope.indexes.get(key)
    if index is None:
        index = Index(conversation) if small else await asyncio.to_thread(Index, conversation)
        scope.indexes.clear()  # the previous answer's: not needed again
        scope.indexes[key] = index
    if small:
        return call_context(conversation, ref, args, index)
    return await asyncio.to_thread(call_context, conversation, ref, args, index)


def _small(conversation: list[Message]) -> bool:
    """Whether tracing `conversation` costs less than two trips to a worker thread (about
    0.6 ms of a message → card here, where the tracing took 0.26): text only, no tool's
    result (its size is not known without reading it), INLINE_TRACE characters at most."""
    size = 0
    for message in conversation:
        for part in message.content:
            if part.text is None and part.tool_request is None:
                return False
            size += len(part.text or "")
    return size <= INLINE_TRACE


def interrupt_note(part: Part) -> dict[str, Any]:
    """What our middleware attached to an interrupted tool request (why, preview), if any."""
    meta = (part.metadata or {}).get("interrupt")
    return meta if isinstance(meta, dict) else {}
