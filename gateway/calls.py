"""A tool call from outside the agent, through an API key: run at once if policy allows it,
else asked of the approvers as any call is, waited for, and run once behind the execution
gate (START_EXECUTION, FINISH_EXECUTION of storage/lifecycle.py) if approved.

Only the caller that waits runs an approved call: a caller that went away (disconnected,
or its process died) leaves an approval with nothing to run it, which is the point: its
result would have nowhere to go. A decision made in any replica is seen by the waiting one
through one batched poll of the database per process (gateway/waiting.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from genkit import Part, ToolRequest
from genkit._ai._tools import run_tool_request
from genkit.middleware import MultipartToolResponse

from agent.gate import DEFAULT_TOOL_TIMEOUTS, ToolTimeouts, recorded
from agent.inputs import input_errors, jsonable
from agent.interrupts import WITHDRAWN
from agent.keys import ApiKey
from agent.limits import MessageLimits
from agent.observer import Observer, execution_outcome
from agent.policy import Policy
from agent.policy_file import PROMPT_PREFIX as PROMPT_PREFIX
from agent.workflow import Workflow
from gateway.asking import Caller as Caller, Show, history_of, new_approval
from gateway.waiting import Decisions, Waiters
from storage.approval_store import ApprovalStore
from storage.domain import Approval, Approved, Denied, Expired, Finished, Started, Withdrawn
from storage.gateway_store import GatewayStore
from storage.lifecycle import IllegalTransition

log = logging.getLogger(__name__)

APPROVAL_PROMPT = "approval_prompt"  # Claude Code's --permission-prompt-tool contract
PROGRESS_SECONDS = 10.0  # a waiting caller hears at least this often (MCP asks every 15 s)
DEFAULT_LEASE = timedelta(seconds=15)  # RESUME_LEASE_SECONDS: a waiting caller's lease


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
class Outcome:
    """How a call ended, for the caller: `ok` with the output, or why nothing ran."""

    ok: bool
    output: Any = None
    error: str | None = None
    changes: dict[str, Any] | None = None  # approved with changes: what changed
    approval: Approval | None = None
    status: str = "ran"  # ran, denied, expired, withdrawn, unknown, allowed


@dataclass(frozen=True)
class OfferedTool:
    name: str
    description: str
    input_schema: dict[str, Any]


Progress = Callable[[float, str], Awaitable[None]]


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
        lease: timedelta = DEFAULT_LEASE,
    ) -> None:
        self.workflow = workflow
        self.approvals = approvals
        self.store = store
        self.clock = clock
        self._new_id = new_id
        self._post_card = post_card
        self.refresh_card = refresh_card
        self.observer = observer or Observer()
        self._timeouts = tool_timeouts
        self._limits = limits
        self.decisions = Decisions(store)
        self.waiters = Waiters(store, clock=clock, lease=lease)

    def tools(self) -> list[OfferedTool]:
        """The agent's tools under the names policy uses, with their input schemas (not the
        tools that only ask a person: those are the agent's own)."""
        runtime = self.workflow.runtime
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
        found = self.workflow.runtime.tools.get(tool)
        if found is None or tool in self.workflow.runtime.questions:
            raise UnknownTool(tool)
        action = found.action()
        if errors := input_errors(action, args):
            raise InvalidArguments(errors)  # before any approver sees it
        policy = await self.policy(caller.key, tool, args)
        if policy.allowed:
            output = await self._run(action, tool, args, approval=None)
            return Outcome(ok=execution_outcome(output) == "ok", output=output, status="allowed")
        approval = await self.ask(caller, tool, args, policy)
        return await self._await(caller, approval, action, progress)

    async def prompt(
        self, caller: Caller, tool_name: str, args: dict[str, Any], progress: Progress | None = None
    ) -> dict[str, Any]:
        """Claude Code's permission prompt: may it run `tool_name` with `args`? Policy names
        it `prompt.<tool_name>`. The answer is Claude Code's: allow (with the input to run,
        the edited one after Edit & approve) or deny (with why)."""
        tool = PROMPT_PREFIX + tool_name
        policy = await self.policy(caller.key, tool, args)
        if policy.allowed:
            return {"behavior": "allow", "updatedInput": args}
        approval = await self.ask(caller, tool, args, policy)
        outcome = await self._await(caller, approval, None, progress)
        if outcome.status == "ran":
            return {"behavior": "allow", "updatedInput": outcome.output}
        why = outcome.error or "not approved"  # last, so the reason is not run into more words
        return {"behavior": "deny", "message": f"{tool_name} was not allowed in Greenlight: {why}"}

    async def policy(self, key: ApiKey, tool: str, args: dict[str, Any]) -> Policy:
        """The call admitted under the owner's message limit (each call counts as a message,
        OverLimit past it), then the policy for it."""
        if (
            self._limits is not None
            and not (await self._limits.admit(key.team_id, key.user_id)).run
        ):
            raise OverLimit(key.user_id)
        return (await self.workflow.policies.get(key.team_id, tool)).for_call(args, key.user_id)

    async def ask(
        self,
        caller: Caller,
        tool: str,
        args: dict[str, Any],
        policy: Policy,
        *,
        words: str | None = None,
        approval_id: str | None = None,
    ) -> Approval:
        """Record the request (its card in the outbox; an MCP caller's lease) and post its
        card. `approval_id`: given (an idempotency key's), else new; Exists when a request of
        that id is there already."""
        now = self.clock()
        approval = new_approval(
            caller,
            tool,
            args,
            policy,
            approval_id=approval_id or self._new_id(),
            now=now,
            history=await history_of(self.approvals, caller.key, tool, now),
            words=words,
        )
        await self.store.open(approval, now=now)
        if caller.door == "mcp":  # it waits here: its lease says so to every replica
            await self.waiters.hold(approval.id)
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
        try:
            await self._decided(caller, approval, progress)
        except (asyncio.CancelledError, ConnectionResetError):
            self.decisions.forget(approval.id)
            await asyncio.shield(self.gone(approval))
            raise
        try:
            current = await self.workflow.reads.approval(approval.thread.team_id, approval.id)
            via = (current or approval).request.context.via
            if via is not None and via.gone:  # given up for lost (its lease ran out): the
                why = "given up for lost while it waited: nothing ran"  # card says so
                return Outcome(False, None, why, None, current, "unknown")
            return await self._act(current or approval, action)
        finally:
            await self.waiters.release(approval.id)

    async def _decided(self, caller: Caller, approval: Approval, progress: Progress | None) -> None:
        """Until it is decided (or expired, then recorded so): progress meanwhile; raises
        ConnectionResetError when the caller goes away first."""
        started = self.clock()
        while True:
            left = (approval.request.expires_at - self.clock()).total_seconds()
            if left <= 0:
                with contextlib.suppress(IllegalTransition):
                    expired = await self.approvals.decisions.expire(approval, now=self.clock())
                    await self.refresh_card(expired)
                return
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
                return
            if progress is not None:
                waited = (self.clock() - started).total_seconds()
                with contextlib.suppress(Exception):
                    await progress(waited, "waiting for approval in Slack")

    async def gone(self, approval: Approval) -> bool:
        """The caller went away: the card says so, and nothing will run. Whether that is
        noted; if not, its lease is left to run out, and a sweep tries again."""
        try:
            current = await self.workflow.reads.approval(approval.thread.team_id, approval.id)
            marked = await self.store.caller_gone(current or approval)
            await self.refresh_card(marked)
        except Exception:
            log.exception("could not note that the caller of %s went away", approval.id)
            self.waiters.drop(approval.id)
            return False
        await self.waiters.release(approval.id)
        return True

    async def _act(self, approval: Approval, action: Any) -> Outcome:
        match approval.decision:
            case Approved(by=by):
                return await self._approved(approval, action, by)
            case Denied(by=by, reason=reason):
                why = f"denied by {by}" + (f": {reason}" if reason else "")
                return Outcome(False, None, why, None, approval, "denied")
            case Expired():
                return Outcome(
                    False, None, "expired: nobody decided in time", None, approval, "expired"
                )
            case Withdrawn():
                return Outcome(False, None, WITHDRAWN, None, approval, "withdrawn")
            case _:
                return Outcome(False, None, "not decided", None, approval, "unknown")

    async def _approved(self, approval: Approval, action: Any, by: str) -> Outcome:
        """Run the approved call (the edited input after Edit & approve) once, behind the
        gate; a permission prompt's caller runs it itself, so its output is the input."""
        r = approval.request
        args = approval.current.actual  # redacted fields' values back: the tool's input
        changes = approval.edit.changes(r.input) if approval.edit else None
        try:
            await self.approvals.executions.start_execution(approval, now=self.clock())
        except IllegalTransition as refused:  # it ran (or began) already: the record
            now = refused.current or approval
            execution = now.execution
            output = recorded(execution) if isinstance(execution, Started | Finished) else None
            return Outcome(False, output, "it ran already", changes, now, "unknown")
        if action is None:
            output = args
        else:
            output = await self._run(action, r.tool, args, approval=approval, by=by)
        await self.approvals.executions.finish_execution(approval, output=output, now=self.clock())
        self.observer.executed(r.tool, execution_outcome(output))
        done = await self.workflow.reads.approval(approval.thread.team_id, approval.id)
        with contextlib.suppress(Exception):
            await self.refresh_card(done or approval)
        ok = execution_outcome(output) == "ok"
        return Outcome(ok, output, None, changes, done or approval, "ran")

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

    def close(self) -> None:
        self.decisions.close()
        self.waiters.close()
