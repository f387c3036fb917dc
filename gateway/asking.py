"""A gateway request made into an approval like any other: its request, context (door, key,
client, the caller's own words), follow-ups and card, recorded, then its card posted.

Both doors ask through here: an MCP call that policy does not allow, and every request of
the approvals API.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agent.context import SAID_MAX
from agent.keys import ApiKey
from agent.policy import HISTORY_DAYS, Policy
from storage.approval_store import ApprovalStore
from storage.domain import (
    Approval,
    Card,
    Context,
    EscalationState,
    FollowUp,
    History,
    ReminderState,
    Request,
    Said,
    Thread,
    Via,
)
from storage.gateway_store import GATEWAY_CHANNEL

Show = Callable[[Approval], Awaitable[None]]


@dataclass(frozen=True)
class Caller:
    """Who asks, through which door and key, from which client."""

    key: ApiKey
    door: str  # "mcp", "api"
    client: str | None = None
    gone: asyncio.Event = field(default_factory=asyncio.Event)


def turn_id_of(approval_id: str) -> str:
    """The request's own (done) turn and conversation: one per request, derived from it."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"greenlight:turn:{approval_id}"))


def new_approval(
    caller: Caller,
    tool: str,
    args: dict[str, Any],
    policy: Policy,
    *,
    approval_id: str,
    now: datetime,
    history: History | None,
    words: str | None = None,
) -> Approval:
    """The approval to record: `words` are the caller's own, shown on the card as untrusted."""
    key = caller.key
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
        note_required=policy.note_required,  # and no standing approval: none covers the gateway
        redact=policy.redact,
        context=Context(
            agent=None if words is None else Said(words[:SAID_MAX], len(words)),
            history=history,
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
    return Approval(
        approval_id,
        turn_id_of(approval_id),
        Thread(key.team_id, GATEWAY_CHANNEL, approval_id.replace("-", "")[:32]),
        request,
        card=Card(policy.channel) if policy.channel else None,
        reminder=reminder,
        escalation=escalation,
    )


async def history_of(approvals: ApprovalStore, key: ApiKey, tool: str, now: datetime) -> History:
    """The requester's earlier requests for the tool, for the card."""
    found = await approvals.reads.history(
        key.team_id,
        key.user_id,
        [tool],
        since=now - timedelta(days=HISTORY_DAYS),
        days=HISTORY_DAYS,
    )
    return found[tool]
