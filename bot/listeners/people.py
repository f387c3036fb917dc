"""Slack's word that a person changed (user_change) or joined (team_join): kept in the
people directory at once (bot/people.py), so a guest made of a member, or the other way
round, is known to every replica without waiting for the next users.list sync."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext

from bot.deps import Deps
from bot.listeners.shared import obj, slack_id


async def on_person(body: dict[str, Any], context: AsyncBoltContext, deps: Deps) -> None:
    """As of when Slack sent it (`event_time`): a retry, minutes late, of an event older than
    the last sync leaves the sync's word."""
    team, at = context.team_id or body.get("team_id"), body.get("event_time")
    sent = datetime.fromtimestamp(at, UTC) if isinstance(at, int) and 0 < at < 2**40 else None
    if slack_id(team):
        await deps.people.heard(team, obj(body.get("event")).get("user"), sent=sent)


def register(app: AsyncApp) -> None:
    app.event("user_change")(on_person)
    app.event("team_join")(on_person)
