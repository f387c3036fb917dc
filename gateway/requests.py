"""The approvals API's requests: the caller acts itself; Greenlight decides and keeps the
gate. Asked (idempotently), read and waited on, started once (START_EXECUTION), finished,
withdrawn; and a `callback_url` owed the final status (gateway/callbacks.py delivers it).
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import replace
from typing import Any

from agent.gate import note_of
from agent.interrupts import WITHDRAWN
from agent.keys import ApiKey
from agent.outcomes import DecisionRefused
from gateway.asking import Caller
from gateway.calls import Gateway
from storage.domain import Approval, Approved, Denied, Withdrawn
from storage.gateway_store import Exists
from storage.lifecycle import IllegalTransition

ALLOWED_BY = "greenlight"  # who "approved" a request policy allowed outright


def status_of(approval: Approval) -> str:
    """pending, approved, denied, expired or cancelled (withdrawn by its requester)."""
    match approval.decision:
        case None:
            return "pending"
        case Withdrawn():
            return "cancelled"
        case Approved():
            return "approved"
        case Denied():
            return "denied"
        case _:
            return "expired"


def shown(approval: Approval) -> dict[str, Any]:
    """A request as the API answers it (and as its callback says it): to any key of the
    workspace, so its redacted fields are `•••• (N characters)`, named in `redacted` (absent
    when none are). Only `start`, for the requester's own keys, answers the input to act
    on, values and all."""
    decision = approval.decision
    reason = WITHDRAWN if isinstance(decision, Withdrawn) else None
    hidden = [s.name for s in approval.request.secrets]
    return {
        "id": approval.id,
        "status": status_of(approval),
        "decided_by": getattr(decision, "by", None),
        "reason": getattr(decision, "reason", reason),
        "input": approval.current.input,
        "note": note_shown(approval),
        **({"redacted": hidden} if hidden else {}),
    }


def note_shown(approval: Approval) -> str | None:
    """The approvers' note (Approve with note, or a note with Edit & approve) as Greenlight's
    own agent would get it (agent/gate.py `note_of`); None when they left none. A request
    policy allowed has none: its decision's reason says why it was allowed, not a note."""
    if getattr(approval.decision, "by", None) == ALLOWED_BY:
        return None
    return note_of(approval).get("note")


class Requests:
    """The approvals API over the gateway's core (gateway/calls.py)."""

    def __init__(self, gateway: Gateway) -> None:
        self._g = gateway
        self.observer = gateway.observer

    async def body(self, team_id: str, approval_id: str) -> dict[str, Any] | None:
        """What a callback says: the request as the API answers it (None: no such one)."""
        found = await self._g.workflow.reads.approval(team_id, approval_id)
        return None if found is None else shown(found)

    async def request(
        self,
        caller: Caller,
        tool: str,
        args: dict[str, Any],
        *,
        words: str | None = None,
        idempotency_key: str | None = None,
        callback_url: str | None = None,
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
                await self._owe(found, key, callback_url)  # a lost first answer: still owed
                return found, False
        policy = await self._g.policy(key, tool, args)
        allowed = policy.allowed
        if allowed:  # recorded, not carded: the gate still holds its start
            policy = replace(
                policy, channel=None, approvals=1, remind_after=None, escalate_after=None
            )
        try:
            approval = await self._g.ask(
                caller, tool, args, policy, words=words, approval_id=approval_id
            )
        except Exists:
            found = await self.read(key, approval_id or "")
            assert found is not None
            return found, False
        await self._owe(approval, key, callback_url)
        if allowed:
            now = self._g.clock()
            approval, _, _ = await self._g.approvals.decisions.decide(
                approval, Approved(ALLOWED_BY, now, "allowed by policy")
            )
        return approval, True

    async def _owe(self, approval: Approval, key: ApiKey, url: str | None) -> None:
        if url is not None and approval.request.requester == key.user_id:
            await self._g.store.owe_callback(approval, key_id=key.id, url=url, now=self._g.clock())

    async def read(self, key: ApiKey, approval_id: str) -> Approval | None:
        """A request of the approvals API in the key's workspace (None: no such one)."""
        found = await self._g.workflow.reads.approval(key.team_id, approval_id)
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
        clock = self._g.clock
        left = min(seconds, (found.request.expires_at - clock()).total_seconds())
        if left > 0 and not await self._g.decisions.wait(approval_id, left):
            self._g.decisions.forget(approval_id)
        found = await self.read(key, approval_id)
        if found is not None and found.decision is None and found.request.expires_at <= clock():
            with contextlib.suppress(IllegalTransition):
                found = await self._g.approvals.decisions.expire(found, now=clock())
                await self._g.refresh_card(found)
        return found

    async def start(self, approval: Approval) -> bool:
        """START_EXECUTION: True the first time for an approved request, False after."""
        try:
            await self._g.approvals.executions.start_execution(approval, now=self._g.clock())
        except IllegalTransition:
            return False
        return True

    async def finish(self, approval: Approval, *, ok: bool, output: Any) -> bool:
        """FINISH_EXECUTION with what the caller says happened; the card shows it."""
        recorded_output = output if ok else {"ok": False, "output": output}
        try:
            await self._g.approvals.executions.finish_execution(
                approval, output=recorded_output, now=self._g.clock()
            )
        except IllegalTransition:
            return False
        self._g.observer.executed(approval.request.tool, "ok" if ok else "error")
        done = await self._g.workflow.reads.approval(approval.thread.team_id, approval.id)
        with contextlib.suppress(Exception):
            await self._g.refresh_card(done or approval)
        return True

    async def cancel(self, approval: Approval) -> bool:
        """WITHDRAW a pending request, as its requester (the key's owner) does with Slack's
        Withdraw: False when it is no longer pending."""
        try:
            decided = await self._g.workflow.decisions.withdraw(
                approval.thread.team_id, approval.id, approval.request.requester
            )
        except DecisionRefused:
            return False
        with contextlib.suppress(Exception):
            await self._g.refresh_card(decided.approval)
        return True
