"""The Deny modal: its submission records the denial with the optional reason."""

from __future__ import annotations

from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from agent.workflow import DecisionRefused
from bot import blocks
from bot.deps import Deps
from bot.listeners.actions import facts_for, in_modal, resume_when_ready
from bot.listeners.fields import obj

MAX_REASON = 500


def submitted(body: dict[str, Any]) -> tuple[str, str, str | None, str, str | None] | None:
    """(team, user, channel, approval id, reason) from a view_submission, or None."""
    opened = in_modal(body)
    if opened is None:
        return None
    team, user, channel, approval_id = opened
    field = obj(obj(obj(obj(body.get("view")).get("state")).get("values")).get("reason"))
    reason = obj(field.get("reason")).get("value")
    if isinstance(reason, str):  # free text; PostgreSQL stores no NUL
        reason = reason.replace("\x00", "").strip()[:MAX_REASON] or None
    else:
        reason = None
    return team, user, channel, approval_id, reason


async def on_deny_submitted(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    parsed = submitted(body)
    if parsed is None:
        await ack()
        return
    team, user, channel, approval_id, reason = parsed
    facts = facts_for(deps, client, user, channel)
    try:
        decided = await deps.workflow.decide(
            team, approval_id, user, approve=False, reason=reason, facts=facts
        )
    except DecisionRefused as refusal:
        text = blocks.refusal_text(refusal.reason, refusal.approval)
        await ack(response_action="errors", errors={"reason": text})
        if refusal.reason == "already_decided" and refusal.approval is not None:
            await deps.delivery.refresh_card(client, refusal.approval)  # the state changed
        return
    await ack()
    if decided.turn_ready:  # first: the requester waits on it, the card can follow
        resume_when_ready(deps, client, decided.turn_id)
    await deps.delivery.refresh_card(client, decided.approval)


def register(app: AsyncApp) -> None:
    app.view("deny_reason")(on_deny_submitted)
