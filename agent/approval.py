"""The approval middleware: unique refs, a live allow-list, and the one gate before execution.

Genkit re-creates middleware from its config on every generate call, so dependencies are
closed over by a class built per application (`approval_middleware`), not passed to
`__init__`. Per-turn facts (which workspace, who asked) travel in a ContextVar, since
Genkit calls the middleware with no handle of ours. The model's last request is kept on
that scope too: what led to a call (agent/context.py) is read off it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, assert_never

from genkit import Action, GenkitError, Message, Part, ToolRequest
from genkit._ai._tools import Interrupt, run_tool_request
from genkit.middleware import (
    BaseMiddleware,
    GenerateMiddlewareContext,
    ModelHookParams,
    MultipartToolResponse,
    ToolHookParams,
)
from genkit.model import ModelResponse
from pydantic import BaseModel, ValidationError

from agent.context import Index, as_provenance, call_context
from agent.observer import ExecutionOutcome, Observer
from agent.policy import Policy, PolicyService
from agent.questions import asked
from agent.runtime import Preview
from storage.approval_store import ApprovalStore
from storage.domain import Approval, Approved, Context, Finished, Started
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


@dataclass
class ModelCalls:
    """Whether the turn's last model call went unanswered: it failed (after Retry and
    Fallback) or was still out when the turn's time ran out. A turn that fails then failed
    on the model (an outage), not on a tool or on us."""

    unanswered: bool = False


def cut_off(tool: str, seconds: float) -> dict[str, Any]:
    """What the model gets for an approved call stopped by its own timeout."""
    return {
        "ok": False,
        "error": (
            f"{tool} did not finish within {seconds:g} seconds and was stopped: its outcome "
            "is unknown. It was not run again; a human must check whether it took effect."
        ),
    }


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


class ModelTime:
    """The model-turn timeout of one turn, stopped while approved calls run (each has its own,
    ToolTimeouts): the turn's limit is on the time spent outside them."""

    def __init__(self) -> None:
        self._timeout: asyncio.Timeout | None = None
        self._running = 0  # approved calls running now (Genkit may run them in parallel)
        self._left: float | None = None

    @contextlib.asynccontextmanager
    async def limit(self, seconds: float) -> AsyncIterator[None]:
        async with asyncio.timeout(seconds) as self._timeout:
            yield

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        timeout = self._timeout
        if timeout is None or timeout.expired():  # no limit, or it already fired
            yield
            return
        loop = asyncio.get_running_loop()
        if self._running == 0:
            when = timeout.when()
            self._left = None if when is None else max(when - loop.time(), 0.0)
            timeout.reschedule(None)
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            if self._running == 0 and self._left is not None and not timeout.expired():
                timeout.reschedule(loop.time() + self._left)


@dataclass(frozen=True)
class TurnScope:
    team_id: str
    requester: str
    # Everyone whose message led to this turn (the requester among them).
    participants: tuple[str, ...] = ()
    # A resume's approvals, as claimed: the only ones a restart of this turn may carry.
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    # Each call this turn made (by its ref): its policy, rules applied, as read when the
    # call was made, and what led to it. Pausing needs no second read.
    calls: dict[str, Called] = field(default_factory=dict)
    # The conversation as the model last saw it, its answer included.
    conversation: list[Message] = field(default_factory=list)
    model: ModelCalls = field(default_factory=ModelCalls)
    model_time: ModelTime = field(default_factory=ModelTime)
    # The conversation's provenance index, built once per model answer (agent/context.py).
    indexes: dict[tuple[int, int], Index] = field(default_factory=dict)


@dataclass(frozen=True)
class Called:
    policy: Policy
    context: Context
    input: dict[str, Any] | None = None  # as the tool's schema validated it (version 1)


current_scope: ContextVar[TurnScope | None] = ContextVar("greenlight_turn", default=None)


def jsonable(value: Any) -> Any:
    """A tool's output as plain JSON, as it is recorded and replayed."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value


def stamp_refs(response: ModelResponse, new_id: Callable[[], str]) -> None:
    """Give every tool request a ref of ours (Genkit matches on name+ref), whatever the
    model sent: one it chose could repeat an earlier call's and borrow its context or its
    approval. NUL characters go from the calls' input: PostgreSQL cannot store them, and
    what the approver sees, what is stored and what runs must be the same."""
    if response.message is None:
        return
    for part in response.message.content:
        request = part.tool_request
        if request is None:
            continue
        request.ref = new_id()
        request.input = without_nul(request.input)


def without_nul(value: Any) -> Any:
    """`value` with every NUL character taken out of its strings (keys included)."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    return value


Outside = Callable[[], AbstractAsyncContextManager[None]]


PREVIEW_TIMEOUT = 2.0  # seconds a tool's preview may take before the card goes without it
PREVIEW_MAX = 20_000  # characters of a preview kept (a file write's diff, say); cards clip


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


def approval_middleware(
    *,
    store: ApprovalStore,
    policies: PolicyService,
    previews: Mapping[str, Preview],
    questions: Collection[str],
    new_id: Callable[[], str],
    clock: Callable[[], datetime],
    checks: Mapping[str, Callable[[Any], str | None]] | None = None,
    outside: Outside = contextlib.nullcontext,
    observer: Observer | None = None,
    timeouts: ToolTimeouts = DEFAULT_TOOL_TIMEOUTS,
    model_calls: AbstractAsyncContextManager[Any] | None = None,
) -> type[BaseMiddleware[Any]]:
    """Build the middleware class bound to this application's store and policy.

    `questions`: the tools that only ask a person (agent/questions.py): they are neither
    gated nor run, their calls become questions. `checks`: per tool, what refuses a call
    before any card, beyond its schema (a file write's path, agent/files.py). `outside`:
    entered around each wait on the model or a tool, so whoever runs the turn
    (bot/background.py) can give the turn's place to other work meanwhile. `observer`:
    told how each approved call ended. `model_calls`: entered (inside `outside`) around
    each model call, to cap the calls in flight (a semaphore): the turns the cap holds
    back wait without a work slot.
    """
    observer = observer or Observer()
    gates: Mapping[str, Callable[[Any], str | None]] = checks or {}
    model_gate = model_calls or contextlib.nullcontext()

    async def run_approved(
        approval_id: str,
        scope: TurnScope,
        params: ToolHookParams,
        ctx: GenerateMiddlewareContext,
        next_fn: Callable[
            [ToolHookParams, GenerateMiddlewareContext], Awaitable[MultipartToolResponse]
        ],
    ) -> MultipartToolResponse:
        """Run an approved call at most once: START_EXECUTION is committed before the tool
        runs, and only its first caller runs it (storage/lifecycle.py)."""
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
        try:
            await store.executions.start_execution(approval, now=clock())
        except IllegalTransition as refused:
            return MultipartToolResponse(output=answer_from_record(refused, tool))
        seconds = timeouts.of(tool)
        limit = asyncio.timeout(seconds)
        try:
            with scope.model_time.stopped():
                async with outside(), limit:
                    result = await next_fn(params, ctx)
            output = jsonable(result.output)
        except Exception as exc:
            if asking(exc) is not None:
                # Approved, it asked for more: a restart cannot ask (Genkit fails the resume).
                log.warning("approved tool %s asked a question; the model is told", tool)
                output = {
                    "ok": False,
                    "error": f"{tool} asked for more input after it was approved and did not "
                    "run. Ask the person with askHuman, then call it again.",
                }
            elif limit.expired():  # stopped mid-call: it stays "started", its outcome unknown
                log.error(
                    "approved tool %s ran past %gs (approval %s)",
                    tool,
                    seconds,
                    approval_id,
                    extra={"approval_id": approval_id, "turn_id": approval.turn_id},
                )
                observer.executed(tool, "unknown")
                return MultipartToolResponse(output=cut_off(tool, seconds))
            else:  # what the tool raised (Genkit wraps it in a GenkitError)
                log.exception(
                    "approved tool %s failed (approval %s)",
                    tool,
                    approval_id,
                    extra={"approval_id": approval_id, "turn_id": approval.turn_id},
                )
                output = {"ok": False, "error": f"the tool {tool} failed; it may need a retry"}
            result = MultipartToolResponse(output=output)
        await store.executions.finish_execution(approval, output=output, now=clock())
        observer.executed(tool, execution_outcome(output))
        return result

    async def preview(tool: str, input: Any) -> str | None:
        async with outside():
            return await preview_of(previews, tool, input)

    class GreenlightApproval(BaseMiddleware[Any]):
        async def wrap_model(
            self,
            params: ModelHookParams,
            ctx: GenerateMiddlewareContext,
            next_fn: Callable[
                [ModelHookParams, GenerateMiddlewareContext], Awaitable[ModelResponse]
            ],
        ) -> ModelResponse:
            calls = scope.model if (scope := current_scope.get()) is not None else ModelCalls()
            calls.unanswered = True  # until it answers: a timeout may cancel it any moment
            async with outside(), model_gate:
                response = await next_fn(params, ctx)
            calls.unanswered = False
            stamp_refs(response, new_id)
            if scope is not None and response.message is not None:
                scope.conversation[:] = [*params.request.messages, response.message]
            return response

        async def wrap_tool(
            self,
            params: ToolHookParams,
            ctx: GenerateMiddlewareContext,
            next_fn: Callable[
                [ToolHookParams, GenerateMiddlewareContext], Awaitable[MultipartToolResponse]
            ],
        ) -> MultipartToolResponse:
            scope = current_scope.get()
            tool = params.tool.name
            if scope is None:  # fail closed: no workspace, no policy, no tool
                raise Interrupt({"why": f"{tool} was called outside a Greenlight turn"})
            resumed = (params.tool_request_part.metadata or {}).get("resumed")
            if isinstance(resumed, dict) and (
                resumed.get("tool_approved") or resumed.get("toolApproved")
            ):
                approval_id = resumed.get("approval_id")
                if isinstance(approval_id, str):
                    return await run_approved(approval_id, scope, params, ctx, next_fn)
                # Approval metadata with no recorded approval behind it is not trusted.
            request = params.tool_request_part.tool_request
            raw = request.input if request else None
            ref = request.ref if request else None
            policy = await policies.get(scope.team_id, tool)
            if tool in questions:  # it would only interrupt: it asks a person, unrun
                await ask(scope, ref, raw, policy.for_call(raw, scope.requester))
                raise Interrupt({"asks": asked(raw), "why": f"{tool} asks for input"})
            # Policy reads the call as the tool's schema takes it, never the raw arguments.
            args, errors = coerced(params.tool, raw)
            problem = invalid_problem(tool, errors) if errors else None
            if problem is None and (check := gates.get(tool)) is not None:
                problem = check(raw)  # a file write's path, say (agent/files.py)
            if problem is not None and not policy.allowed:
                # An approver never sees (and never approves) a call that cannot run.
                log.info("invalid input for %s; no approval asked", tool)
                return MultipartToolResponse(output={"ok": False, "error": problem})
            # What led to the call is traced only when a rule may read it or a human will.
            context = None
            if policy.rules and not policy.allowed:
                context = await context_of(scope, ref, args)
            sources = context.sources if context else {}
            policy = policy.for_call(args, scope.requester, as_provenance(args, sources))
            if policy.allowed:
                try:
                    async with outside():
                        return await next_fn(params, ctx)
                except (Interrupt, GenkitError) as exc:
                    if (metadata := asking(exc)) is None:
                        raise
                    await ask(scope, ref, raw, policy)  # the tool asks a person: a question
                    why = str(metadata.get("message") or f"{tool} asks for input")
                    raise Interrupt({"asks": asked(raw, metadata), "why": why}) from None
            if ref:
                context = context or await context_of(scope, ref, args)
                scope.calls[ref] = Called(policy, context, args)
            shown = await preview(tool, args)
            raise Interrupt({"why": policy.why, "preview": shown})

    async def ask(scope: TurnScope, ref: str | None, args: Any, policy: Policy) -> None:
        """Note a question's policy (where it goes, who may answer) and what led to it."""
        if ref:
            scope.calls[ref] = Called(policy, await context_of(scope, ref, args))

    return GreenlightApproval


async def context_of(scope: TurnScope, ref: str | None, args: Any) -> Context:
    """What led to a call, traced off the event loop (a long conversation takes a while)
    against the conversation's index, built once for all the calls of one model answer."""
    conversation = list(scope.conversation)
    key = (len(conversation), id(conversation[-1]) if conversation else 0)
    index = scope.indexes.get(key)
    if index is None:
        index = await asyncio.to_thread(Index, conversation)
        scope.indexes.clear()  # the previous answer's: not needed again
        scope.indexes[key] = index
    return await asyncio.to_thread(call_context, conversation, ref, args, index)


def asking(exc: BaseException) -> dict[str, Any] | None:
    """The metadata of the interrupt a tool raised (Genkit may wrap it), or None."""
    found = exc.cause if isinstance(exc, GenkitError) else exc
    if not isinstance(found, Interrupt):
        return None
    return found.metadata if isinstance(found.metadata, dict) else {}


def invalid_problem(tool: str, errors: Mapping[str, str]) -> str:
    """What is wrong with a call's input by its tool's own schema, said so that the model can
    correct it."""
    problems = "; ".join(f"{field}: {message}" for field, message in list(errors.items())[:10])
    return (
        f"invalid input for {tool} ({problems}); it did not run and nobody was "
        "asked to approve it. Correct the input and call the tool again."
    )


def input_errors(tool: Action, value: Any) -> dict[str, str]:
    """What is wrong with `value` as the tool's input, by its own schema, by field ("input"
    for the whole); {} when it is valid or the tool declares no schema."""
    return coerced(tool, value)[1]


def coerced(tool: Action, value: Any) -> tuple[Any, dict[str, str]]:
    """`value` as the tool's schema validates and coerces it ("250000" for a number field
    becomes 250000; keys the schema does not take are dropped), and what is wrong with it
    by field ({}: it is valid). The tool itself gets exactly this, so policy and approvers
    are shown it. Wherever the schema leaves a value as it was, the value is kept as given
    (an integer 500 stays 500, not 500.0). A tool with a JSON schema and no Python type (an
    MCP server's `inputSchema`) is checked against the schema and takes `value` as it is; a
    tool without a schema takes it unchecked."""
    if tool.input_type is None:
        schema = tool.input_schema
        if not isinstance(schema, dict) or not schema:
            return value, {}
        import jsonschema  # only tools with a bare JSON schema (MCP) need it

        found: dict[str, str] = {}
        validator = jsonschema.validators.validator_for(schema)(schema)
        for error in validator.iter_errors(value):
            found.setdefault(
                ".".join(str(p) for p in error.absolute_path) or "input", error.message
            )
        return value, found
    try:
        valid = tool.input_type.validate_python(value)
    except ValidationError as exc:
        errors: dict[str, str] = {}
        for e in exc.errors():
            errors.setdefault(".".join(str(p) for p in e["loc"]) or "input", e["msg"])
        return value, errors
    dumped = tool.input_type.dump_python(valid, mode="json", by_alias=True, exclude_unset=True)
    return _kept(value, dumped), {}


def _kept(given: Any, valid: Any) -> Any:
    """`valid`, with each part that equals `given`'s (as JSON values) taken from `given`."""
    if same_value(given, valid):
        return given
    if isinstance(given, dict) and isinstance(valid, dict):
        return {k: _kept(given[k], v) if k in given else v for k, v in valid.items()}
    if isinstance(given, list) and isinstance(valid, list) and len(given) == len(valid):
        return [_kept(g, v) for g, v in zip(given, valid, strict=True)]
    return valid


def same_value(a: Any, b: Any) -> bool:
    """Whether two JSON values are the same value: numbers by value (500 is 500.0), but a
    boolean is never a number, nor a string anything else."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


async def run_edited(
    store: ApprovalStore,
    tool: Action | None,
    approval: Approval,
    *,
    clock: Callable[[], datetime],
    observer: Observer,
    seconds: float,
) -> None:
    """Run an approved call with its approver's changes, at most once: Genkit refuses a
    restart whose input differs, so the workflow runs it here, behind the same gate as
    `run_approved` (START_EXECUTION first, FINISH_EXECUTION with the output). The tool sees
    the approval id (`resumed_metadata`) and the input it was asked for (`original_input`).
    Only a call whose start is recorded here runs; any other caller changes nothing. One
    that runs past `seconds` is stopped and stays "started" (outcome unknown)."""
    version = approval.current
    assert version.edit is not None
    try:
        await store.executions.start_execution(approval, now=clock())
    except IllegalTransition:
        return  # started before (a crash, or another replica): the record answers it
    r = approval.request
    meta = {"tool_approved": True, "approval_id": approval.id, "approved_by": version.edit.by}
    part = Part(
        tool_request=ToolRequest(name=r.tool, ref=r.ref or None, input=version.input),
        metadata={"resumed": meta, "replacedInput": r.input},
    )
    limit = asyncio.timeout(seconds)
    try:
        if tool is None:
            raise LookupError(f"the agent no longer has {r.tool}")
        async with limit:
            raw = await run_tool_request(tool=tool, tool_request_part=part)
        output = jsonable(raw.output if isinstance(raw, MultipartToolResponse) else raw)
    except Exception:
        log.exception(
            "approved tool %s failed with changes (approval %s)",
            r.tool,
            approval.id,
            extra={"approval_id": approval.id, "turn_id": approval.turn_id},
        )
        if limit.expired():
            log.error("approved tool %s ran past %gs (approval %s)", r.tool, seconds, approval.id)
            return
        log.exception("approved tool %s failed with changes (approval %s)", r.tool, approval.id)
        output = {"ok": False, "error": f"the tool {r.tool} failed; it may need a retry"}
    await store.executions.finish_execution(approval, output=output, now=clock())
    observer.executed(r.tool, execution_outcome(output))


def execution_outcome(output: Any) -> ExecutionOutcome:
    """A recorded output's outcome: a tool that raised (or said so) answered {"ok": false}."""
    return "error" if isinstance(output, dict) and output.get("ok") is False else "ok"


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


def interrupt_note(part: Part) -> dict[str, Any]:
    """What our middleware attached to an interrupted tool request (why, preview), if any."""
    meta = (part.metadata or {}).get("interrupt")
    return meta if isinstance(meta, dict) else {}
