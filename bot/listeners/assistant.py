"""Assistant threads opening and following the employee around Slack."""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.deps import Deps
from bot.listeners.shared import message_ts, obj, slack_id
from storage.domain import Thread

log = logging.getLogger(__name__)


def assistant_thread(body: dict[str, Any], context: AsyncBoltContext) -> Thread | None:
    """The thread an assistant event is about, or None if the payload is malformed."""
    event = obj(body.get("event"))
    info = obj(event.get("assistant_thread"))
    team = context.team_id or body.get("team_id")
    channel, ts = info.get("channel_id"), info.get("thread_ts")
    if not (slack_id(team) and slack_id(channel) and message_ts(ts)):
        return None
    return Thread(team, channel, ts)


def viewed(body: dict[str, Any]) -> str | None:
    """The channel the employee has open beside the thread (Slack's thread context)."""
    info = obj(obj(obj(body.get("event")).get("assistant_thread")).get("context"))
    channel = info.get("channel_id")
    return channel if slack_id(channel) else None


async def on_thread_started(
    body: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient, deps: Deps
) -> None:
    """Offer the suggested prompts, and remember where the employee opened the thread."""
    thread = assistant_thread(body, context)
    if thread is None:
        return
    deps.assistant.saw(thread, viewed(body))
    if not deps.assistant.prompts:
        return
    prompts = [{"title": p.title, "message": p.message} for p in deps.assistant.prompts]
    try:
        await client.assistant_threads_setSuggestedPrompts(
            channel_id=thread.channel_id, thread_ts=thread.thread_ts, prompts=prompts
        )
    except SlackApiError as exc:
        log.warning("could not suggest prompts: %s", exc.response.get("error"))


async def on_context_changed(body: dict[str, Any], context: AsyncBoltContext, deps: Deps) -> None:
    thread = assistant_thread(body, context)
    if thread is not None:
        deps.assistant.saw(thread, viewed(body))


def register(app: AsyncApp) -> None:
    app.event("assistant_thread_started")(on_thread_started)
    app.event("assistant_thread_context_changed")(on_context_changed)
