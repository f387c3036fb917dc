"""The App Home tab: published when a person opens it (bot/home.py builds it). Its buttons
are the approval card's, handled in bot/listeners/actions.py."""

from __future__ import annotations

from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_sdk.web.async_client import AsyncWebClient

from bot.deps import Deps
from bot.listeners.shared import obj, slack_id


async def on_home_opened(
    body: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient, deps: Deps
) -> None:
    """Publish the Home afresh (its Messages tab opens this event too: nothing to do)."""
    event = obj(body.get("event"))
    team, user = context.team_id or body.get("team_id"), event.get("user")
    if event.get("tab") != "home" or not (slack_id(team) and slack_id(user)):
        return
    await deps.home.publish(client, team, user, opened=True)


def register(app: AsyncApp) -> None:
    app.event("app_home_opened")(on_home_opened)
