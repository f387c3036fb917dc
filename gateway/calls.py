"""A tool call from outside the agent, through an API key: run at once if policy allows it,
else asked of the approvers as any call is, waited for, and run once behind the execution
gate (START_EXECUTION, FINISH_EXECUTION of storage/lifecycle.py) if approved.

Only the caller that waits runs an approved call: a caller that went away (disconnected,
or its process died) leaves an approval with nothing to run it, which is the point: its
result would have nowhere to go. A decision made in any replica is seen by the waiting one
through one batched poll of the database per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from genkit import Part, ToolRequest
from genkit._ai._tools import run_tool_request
from genkit.middleware import MultipartToolResponse

from agent.context import SAID_MAX
from agent.gate import DEFAULT_TOOL_TIMEOUTS, ToolTimeouts, recorded
from agent.inputs import input_errors, jsonable
from agent.interrupts import HISTORY_DAYS
from agent.keys import ApiKey
from agent.limits import MessageLimits
from agent.observer import Observer, execution_outcome
from agent.policy_file import PROMPT_PREFIX as PROMPT_PREFIX
from agent.workflow import Workflow
from storage.approval_store import ApprovalStore
from storage.domain import (
    Approval,
    Approved,
    Card,
    Context,
    Denied,
    EscalationState,
    Expired,
    Finished,
    FollowUp,
    ReminderState,
    Request,
    Said,
    Started,
    Thread,
    Via,
)
from storage.gateway_store import GATEWAY_CHANNEL, Exists, GatewayStore
from storage.lifecycle import IllegalTransition

log = logging.getLogger(__name__)

APPROVAL_PROMPT = "approval_prompt"  # Claude Code's --permission-prompt-tool contract
POLL_SECONDS = 0.25  # how often one process asks the database which waited-on calls are decided
PROGRESS_SECONDS = 10.0  # a waiting caller hears at least this often (MCP asks every 15 s)


class InvalidArguments(ValueError):
    """The call does not fit the tool's input schema: what is wrong, by field."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


class UnknownTool(LookupError):
    pass


class OverLimit(Exception):
    """The key's owner sent more than their messages per minute (USER_MESSAGES_PER_MINUTE)."""


@dataclass(frozen=True)
class Caller:
    """Who asks, through which door and key, from which client."""

    key: ApiKey
    door: str  # "mcp", "api"
    client: str | None = None
    gone: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Outcome:
    """How a call ended, for the caller: `ok` with the output, or why nothing ran."""

    ok: bool
    output: Any = None
    error: str | None = None
    changes: dict[str, Any] | None = None  # approved with changes: what changed
    approval: Approval | None = None
    status: str = "ran"  # ran, denied, expired, unknown, allowed


@dataclass(frozen=True)
class OfferedTool:
    name: str
    description: str
    input_schema: dict[str, Any]


Progress = Callable[[float, str], Awaitable[None]]
Show = Callable[[Approval], Awaitable[None]]


class Decisions:
    """The calls this process waits on, each told once it is decided; one query per poll
    for all of them, whichever replica decided."""

    def __init__(self, store: GatewayStore) -> None:
        self._store = store
        self._waiting: dict[str, asyncio.Event] = {}
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, approval_id: str, timeout: float) -> bool:  # noqa: ASYNC109
        """Whether it was decided within `timeout` seconds."""
        event = self._waiting.setdefault(approval_id, asyncio.Event())
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="gateway decisions")
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            if self._waiting.get(approval_id) is event and event.is_set():
                del self._waiting[approval_id]

    def forget(self, approval_id: str) -> None:
        self._waiting.pop(approval_id, None)

    async def _poll(self) -> None:
        while self._waiting:
            try:
                for done in await self._store.settled(list(self._waiting)):
                    if (event := self._waiting.get(done)) is not None:
                        event.set()
            except Exception:  # the database: the next poll tries again
                log.warning("could not read the gateway's decisions", exc_info=True)
            await asyncio.sleep(POLL_SECONDS)

    def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()


class Gateway:
    def __init__(
        self,
        workflow: Workflow,
        approvals: ApprovalStore,
        store: GatewayStore,
        *,
        clock: Callable[[], datetime],
        new_id: Callable[[], str],
        post_card: Show,
        refresh_card: Show,
        observer: Observer | None = None,
        tool_timeouts: ToolTimeouts = DEFAULT_TOOL_TIMEOUTS,
        limits: MessageLimits | None = None,
    ) -> None:
        self._workflow = workflow
        self._approvals = approvals
        self._store = store
        self._clock = clock
        self._new_id = new_id
        self._post_card = post_card
        self._refresh_card = refresh_card
        self._observer = self.observer = observer or Observer()
        self._timeouts = tool_timeouts
        self._limits = limits
        self.decisions = Decisions(store)

    def tools(self) -> list[OfferedTool]:
        """The agent's tools under the names policy uses, with their input schemas (not the
        tools that only ask a person: those are the agent's own)."""
        runtime = self._workflow.runtime
        offered = []
        for name, tool in runtime.tools.items():
            if name in runtime.questions:
                continue
            schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
            offered.append(OfferedTool(name, tool.description or "", schema or {"type": "object"}))
        return offered

    async def call(
        self, caller: Caller, tool: str, args: dict[str, Any], progress: Progress | None = None
    ) -> Outcome:
        """Run `tool` with `args` for the caller under policy (see the module's docstring)."""
        found = self._workflow.runtime.tools.get(tool)
        if found is None or tool in self._workflow.runtime.questions:
            raise UnknownTool(tool)
        action = found.action()
        if errors := input_errors(action, args):
            raise InvalidArguments(errors)  # before any approver sees it
        key = caller.key
        await self._admit(key)
        policy = (await self._workflow.policies.get(key.team_id, tool)).for_call(args, key.user_id)
        if policy.allowed:
            output = await self._run(action, tool, args, approval=None)
            return Outcome(ok=execution_outcome(output) == "ok", output=output, status="allowed")
        approval = await self._ask(caller, tool, args, policy)
        return await self._await(caller, approval, action, progress)

    async def prompt(
        self, caller: Caller, tool_name: str, args: dict[str, Any], progress: Progress | None = None
    ) -> dict[str, Any]:
        """Claude Code's permission prompt: may it run `tool_name` with `args`? Policy names
        it `prompt.<tool_name>`. The answer is Claude Code's: allow (with the input to run,
        the edited one after Edit & approve) or deny (with why)."""
        tool = PROMPT_PREFIX + tool_name
        key = caller.key
        await self._admit(key)
        policy = (await self._workflow.policies.get(key.team_id, tool)).for_call(args, key.user_id)
        if policy.allowed:
            return {"behavior": "allow", "updatedInput": args}
        approval = await self._ask(caller, tool, args, policy)
        outcome = await self._await(caller, approval, None, progress)
        if outcome.status == "ran":
            return {"behavior": "allow", "updatedInput": outcome.output}
        why = outcome.error or "not approved"
        return {"behavior": "deny", "message": f"{tool_name} was {why} in Greenlight (Slack)."}

    async def _admit(self, key: ApiKey) -> None:
        """Per-person message limits hold for keys too: each call counts as a message."""
        if (
            self._limits is not None
            and not (await self._limits.admit(key.team_id, key.user_id)).run
        ):
            raise OverLimit(key.user_id)

    async def _ask(
        self,
        caller: Caller,
        tool: str,
        args: dict[str, Any],
        policy: Any,
        *,
        words: str | None = None,
        approval_id: str | None = None,
    ) -> Approval:
        """Record the request (its card in the outbox) and post its card. `words`: the
        caller's own, shown on the card as untrusted; `approval_id`: given (an idempotency
        key's), else new; Exists when a request of that id is there already."""
        now, key = self._clock(), caller.key
        approval_id = approval_id or self._new_id()
        history = await self._approvals.reads.history(
            key.team_id,
            key.user_id,
            [tool],
            since=now - timedelta(days=HISTORY_DAYS),
            days=HISTORY_DAYS,
        )
        request = Request(
            tool=tool,
            ref=approval_id,
            input=args,
            requester=key.user_id,
            why=policy.why,
            requested_at=now,
            expires_at=now + policy.timeout,
            participants=(key.user_id,),
            approvals_needed=policy.approvals,
            context=Context(
                agent=None if words is None else Said(words[:SAID_MAX], len(words)),
                history=history[tool],
                via=Via(caller.door, key.name, caller.client),
            ),
        )
        reminder = escalation = None
        if policy.remind_after is not None:
            reminder = FollowUp(now + policy.remind_after, ReminderState.SCHEDULED)
        if policy.escalate_after and policy.escalate_to is not None:
            escalation = FollowUp(
                now + policy.escalate_after, EscalationState.SCHEDULED, policy.escalate_to
            )
        approval = Approval(
            approval_id,
            str(uuid.uuid5(uuid.NAMESPACE_URL, f"greenlight:turn:{approval_id}")),
            Thread(key.team_id, GATEWAY_CHANNEL, approval_id.replace("-", "")[:32]),
            request,
            card=Card(policy.channel) if policy.channel else None,
            reminder=reminder,
            escalation=escalation,
        )
        await self._store.open(approval, now=now)
        if approval.card is None:
            return approval  # allowed by policy (the API records it), or no channel at all
        try:
            await self._post_card(approval)
        except Exception:  # the outbox has it: the sweep posts it
            log.exception("could not post the card of gateway request %s", approval.id)
        return approval

    async def _await(
        self, caller: Caller, approval: Approval, action: Any, progress: Progress | None
    ) -> Outcome:
        """Wait for the decision (telling the caller meanwhile), then act on it once."""
        started = self._clock()
        try:
            while True:
                left = (approval.request.expires_at - self._clock()).total_seconds()
                if left <= 0:
                    with contextlib.suppress(IllegalTransition):
                        expired = await self._approvals.decisions.expire(
                            approval, now=self._clock()
                        )
                        await self._refresh_card(expired)
                    break
                wait = asyncio.ensure_future(
                    self.decisions.wait(approval.id, min(left, PROGRESS_SECONDS))
                )
                gone = asyncio.ensure_future(caller.gone.wait())
                try:
                    await asyncio.wait({wait, gone}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    gone.cancel()
                if caller.gone.is_set():
                    wait.cancel()
                    raise ConnectionResetError("the caller went away")
                if wait.result():
                    break
                if progress is not None:
                    waited = (self._clock() - started).total_seconds()
                    with contextlib.suppress(Exception):
                        await progress(waited, "waiting for approval in Slack")
        except (asyncio.CancelledError, ConnectionResetError):
            self.decisions.forget(approval.id)
            await asyncio.shield(self._gone(approval))
            raise
        current = (
            await self._workflow.reads.approval(approval.thread.team_id, approval.id) or approval
        )
        return await self._act(current, action)

    async def _gone(self, approval: Approval) -> None:
        """The caller went away: the card says so, and nothing will run."""
        try:
            current = await self._workflow.reads.approval(approval.thread.team_id, approval.id)
            marked = await self._store.caller_gone(current or approval)
            await self._refresh_card(marked)
        except Exception:
            log.exception("could not note that the caller of %s went away", approval.id)

    async def _act(self, approval: Approval, action: Any) -> Outcome:
        r = approval.request
        match approval.decision:
            case Approved(by=by):
                args = approval.edit.input if approval.edit else r.input
                changes = approval.edit.changes(r.input) if approval.edit else None
                try:
                    await self._approvals.executions.start_execution(approval, now=self._clock())
                except IllegalTransition as refused:  # it ran (or began) already: the record
                    now = refused.current or approval
                    execution = now.execution
                    output = (
                        recorded(execution) if isinstance(execution, Started | Finished) else None
                    )
                    return Outcome(False, output, "it ran already", changes, now, "unknown")
                if action is None:  # a permission prompt: the caller runs it; allowed once
                    output = args
                else:
                    output = await self._run(action, r.tool, args, approval=approval, by=by)
                await self._approvals.executions.finish_execution(
                    approval, output=output, now=self._clock()
                )
                self._observer.executed(r.tool, execution_outcome(output))
                done = await self._workflow.reads.approval(approval.thread.team_id, approval.id)
                with contextlib.suppress(Exception):
                    await self._refresh_card(done or approval)
                ok = execution_outcome(output) == "ok"
                return Outcome(ok, output, None, changes, done or approval, "ran")
            case Denied(by=by, reason=reason):
                why = f"denied by {by}" + (f": {reason}" if reason else "")
                return Outcome(False, None, why, None, approval, "denied")
            case Expired():
                return Outcome(
                    False, None, "expired: nobody decided in time", None, approval, "expired"
                )
            case _:
                return Outcome(False, None, "not decided", None, approval, "unknown")

    async def _run(
        self,
        action: Any,
        tool: str,
        args: dict[str, Any],
        *,
        approval: Approval | None,
        by: str = "",
    ) -> Any:
        """Run the tool once; its output as JSON, or {"ok": false, …} when it failed. An
        approved call gets its approval id (`resumed_metadata`) as idempotency key."""
        meta = {}
        if approval is not None:
            meta = {
                "resumed": {"tool_approved": True, "approval_id": approval.id, "approved_by": by}
            }
        part = Part(tool_request=ToolRequest(name=tool, input=args), metadata=meta or None)
        try:
            async with asyncio.timeout(self._timeouts.of(tool)):
                raw = await run_tool_request(tool=action, tool_request_part=part)
        except Exception:
            log.exception("gateway call of %s failed", tool)
            return {"ok": False, "error": f"the tool {tool} failed; it may need a retry"}
        return jsonable(raw.output if isinstance(raw, MultipartToolResponse) else raw)

    # -- the approvals API: the caller acts itself; Greenlight decides and keeps the gate ----

    async def request(
        self,
        caller: Caller,
        tool: str,
        args: dict[str, Any],
        *,
        words: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[Approval, bool]:
        """A request for `tool` (any name: policy applies by name), and whether it is new.
        The same idempotency key again (same owner) is the same request: no second card.
        One policy allows is recorded approved at once, by Greenlight."""
        key = caller.key
        approval_id = None
        if idempotency_key is not None:
            name = f"greenlight:{key.team_id}:{key.user_id}:{idempotency_key}"
            approval_id = str(uuid.uuid5(uuid.NAMESPACE_URL, name))
            if (found := await self.read(key, approval_id)) is not None:
                return found, False
        await self._admit(key)
        policy = (await self._workflow.policies.get(key.team_id, tool)).for_call(args, key.user_id)
        allowed = policy.allowed
        if allowed:  # recorded, not carded: the gate still holds its start
            policy = replace(
                policy, channel=None, approvals=1, remind_after=None, escalate_after=None
            )
        try:
            approval = await self._ask(
                caller, tool, args, policy, words=words, approval_id=approval_id
            )
        except Exists:
            found = await self.read(key, approval_id or "")
            assert found is not None
            return found, False
        if allowed:
            now = self._clock()
            approval, _ = await self._approvals.decisions.decide(
                approval, Approved(ALLOWED_BY, now, "allowed by policy")
            )
        return approval, True

    async def read(self, key: ApiKey, approval_id: str) -> Approval | None:
        """A request of the approvals API in the key's workspace (None: no such one)."""
        found = await self._workflow.reads.approval(key.team_id, approval_id)
        if (
            found is None
            or found.request.context.via is None
            or found.request.context.via.door != "api"
        ):
            return None
        return found

    async def wait(self, key: ApiKey, approval_id: str, seconds: float) -> Approval | None:
        """The request once decided, or as it is after `seconds`."""
        found = await self.read(key, approval_id)
        if found is None or found.decision is not None or seconds <= 0:
            return found
        left = min(seconds, (found.request.expires_at - self._clock()).total_seconds())
        if left > 0 and not await self.decisions.wait(approval_id, left):
            self.decisions.forget(approval_id)
        found = await self.read(key, approval_id)
        if (
            found is not None
            and found.decision is None
            and found.request.expires_at <= self._clock()
        ):
            with contextlib.suppress(IllegalTransition):
                found = await self._approvals.decisions.expire(found, now=self._clock())
                await self._refresh_card(found)
        return found

    async def start(self, approval: Approval) -> bool:
        """START_EXECUTION: True the first time for an approved request, False after."""
        try:
            await self._approvals.executions.start_execution(approval, now=self._clock())
        except IllegalTransition:
            return False
        return True

    async def finish(self, approval: Approval, *, ok: bool, output: Any) -> bool:
        """FINISH_EXECUTION with what the caller says happened; the card shows it."""
        recorded_output = output if ok else {"ok": False, "output": output}
        try:
            await self._approvals.executions.finish_execution(
                approval, output=recorded_output, now=self._clock()
            )
        except IllegalTransition:
            return False
        self._observer.executed(approval.request.tool, "ok" if ok else "error")
        done = await self._workflow.reads.approval(approval.thread.team_id, approval.id)
        with contextlib.suppress(Exception):
            await self._refresh_card(done or approval)
        return True

    async def cancel(self, approval: Approval) -> bool:
        """Withdraw a pending request (a DENY by its own requester, saying so): False when
        it is no longer pending."""
        now = self._clock()
        try:
            done, _ = await self._approvals.decisions.decide(
                approval, Denied(approval.request.requester, now, WITHDRAWN)
            )
        except IllegalTransition:
            return False
        with contextlib.suppress(Exception):
            await self._refresh_card(done)
        return True

    def close(self) -> None:
        self.decisions.close()


ALLOWED_BY = "greenlight"  # who "approved" a request policy allowed outright
WITHDRAWN = "withdrawn by the caller"


def status_of(approval: Approval) -> str:
    """pending, approved, denied, expired or cancelled (withdrawn by its caller)."""
    match approval.decision:
        case None:
            return "pending"
        case Denied(by=by, reason=reason) if (
            by == approval.request.requester and reason == WITHDRAWN
        ):
            return "cancelled"
        case Approved():
            return "approved"
        case Denied():
            return "denied"
        case _:
            return "expired"
