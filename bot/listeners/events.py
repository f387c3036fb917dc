"""Messages to the bot: DMs, @mentions, and replies in threads it is already part of."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent.outcomes import AnsweredInThread
from bot import messages
from bot.assistant import is_assistant_thread, title_of
from bot.deps import Deps
from bot.listeners.shared import message_ts, obj, settled, slack_id
from storage.domain import Thread

log = logging.getLogger(__name__)

EVENT_ID = re.compile(r"Ev[A-Za-z0-9]{1,62}")
HELLO = "Hi! Tell me what you need. Actions that need a human's approval will wait for one."


async def on_mention(
    body: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient, deps: Deps
) -> None:
    await handle(deps, client, body, context, mention=True)


async def on_message(
    body: dict[str, Any], context: AsyncBoltContext, client: AsyncWebClient, deps: Deps
) -> None:
    await handle(deps, client, body, context, mention=False)


async def handle(
    deps: Deps,
    client: AsyncWebClient,
    body: dict[str, Any],
    context: AsyncBoltContext,
    *,
    mention: bool,
) -> None:
    """Start a turn for a message meant for the bot, once per Slack event."""
    event = obj(body.get("event"))
    if event.get("subtype") or event.get("bot_id") or not slack_id(event.get("user")):
        return  # edits, deletions, joins and other bots' messages are not requests
    team = context.team_id or body.get("team_id")
    channel, ts = event.get("channel"), event.get("ts")
    thread_ts, text = event.get("thread_ts") or ts, event.get("text") or ""
    if not (slack_id(team) and slack_id(channel) and message_ts(ts)):
        return
    if not (message_ts(thread_ts) and isinstance(text, str)):
        return
    bot_mention = f"<@{context.bot_user_id}>"
    thread = Thread(team, channel, thread_ts)
    event_id = body.get("event_id")
    if not (isinstance(event_id, str) and EVENT_ID.fullmatch(event_id)):
        return  # Slack always sends one; without it a retry could not be recognised
    # In channels the app_mention event handles mentions; other messages only continue
    # threads the bot is already part of.
    in_channel = not mention and event.get("channel_type") != "im"
    if in_channel and bot_mention in text:
        return
    if not await admitted(deps, client, thread, event_id, event["user"], in_channel=in_channel):
        return
    text = re.sub(rf"{re.escape(bot_mention)}\s*", "", text).strip()
    # An assistant thread shows Slack's status line instead of a placeholder. Elsewhere a
    # turn that must wait for a free slot shows progress now; one that starts at once
    # posts it itself, after its first query is on its way.
    assistant = is_assistant_thread(event)
    posting = None
    if text and not assistant and not deps.background.has_room():
        thinking = messages.thinking_message()
        posting = asyncio.create_task(deps.delivery.say(client, thread, thinking))
    turn = run_turn(deps, client, thread, event["user"], text, posting, assistant=assistant)
    deps.background.spawn(turn, name="turn")


async def admitted(
    deps: Deps,
    client: AsyncWebClient,
    thread: Thread,
    event_id: str,
    user: str,
    *,
    in_channel: bool,
) -> bool:
    """Whether a message starts a turn: in a thread the bot is part of (for a channel
    message), not a retry, within the message limits and the backlog; whoever is not
    served is told why, where that helps."""
    try:
        if in_channel and not await deps.workflow.turns.knows(thread):
            return False
        # Slack's retry of an event already handled is not admitted (nor counted), silently.
        admission = await deps.limits.admit(thread.team_id, user, event_id=event_id)
    except Exception:
        # The database is down: a retry cannot be told apart nor the message counted, so
        # nothing runs, and whoever was talking to the bot (a DM or a mention: a channel
        # thread might not be ours) is told. Slack's retries may repeat the notice.
        log.exception("database unavailable for event %s", event_id)
        if not in_channel:
            await deps.delivery.say(client, thread, messages.failure_message(retrying=False))
        return False
    if not admission.run:
        if admission.tell and admission.over is not None:
            await deps.delivery.say(client, thread, messages.slow_down_message(admission.over))
        return False
    if deps.background.full():
        await deps.delivery.say(client, thread, messages.overloaded_message())
        return False
    return True


async def run_turn(
    deps: Deps,
    client: AsyncWebClient,
    thread: Thread,
    user: str,
    text: str,
    posting: asyncio.Task[str | None] | None = None,
    *,
    assistant: bool = False,
) -> None:
    """Show progress (unless `posting` already does), stream the reply, then the outcome.

    The turn does not wait for the placeholder: the model's first answer (often an approval
    card) need not wait for Slack's round trip. No text, no turn: a greeting.
    """
    if not text:
        await deps.delivery.say(client, thread, messages.reply_message(HELLO))
        return
    titling = None
    if assistant:
        deps.assistant.saw(thread)  # it has a status line (resumes will show it too)
    # The first message names the thread in the assistant's history (asked before the
    # turn makes the thread known).
    if assistant and not await deps.workflow.turns.knows(thread):
        titling = asyncio.create_task(title(client, thread, text))
    elif not assistant and posting is None:
        posting = asyncio.create_task(
            deps.delivery.say(client, thread, messages.thinking_message())
        )
    deps.delivery.warm(client, thread, user)  # what a card shows, if the turn posts one
    streams = deps.delivery.streams(client)
    streams.open(thread, user, posting)
    viewing = deps.assistant.viewing(thread) if assistant else None
    try:
        outcome = await deps.workflow.turns.start(
            thread, user, text, on_text=streams, viewing=viewing
        )
    finally:
        if titling is not None:
            await titling
    await deps.delivery.outcome(client, outcome, stream=streams.take(thread))
    if isinstance(outcome, AnsweredInThread):  # the reply answered the agent's question
        await settled(deps, client, outcome.decided)


async def title(client: AsyncWebClient, thread: Thread, text: str) -> None:
    try:
        await client.assistant_threads_setTitle(
            channel_id=thread.channel_id, thread_ts=thread.thread_ts, title=title_of(text)
        )
    except SlackApiError as exc:
        log.warning("could not title an assistant thread: %s", exc.response.get("error"))


def register(app: AsyncApp) -> None:
    app.event("app_mention")(on_mention)
    app.event("message")(on_message)
