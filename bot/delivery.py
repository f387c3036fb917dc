"""Puts the workflow's outcomes into Slack: replies in threads, cards in approver channels.

Slack failures are logged with detail and never shown raw to anyone; a card or reply that
cannot be posted leaves the approval in the database, where /approvals pending finds it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent.outcomes import (
    AnsweredInThread,
    AwaitingApproval,
    Busy,
    Due,
    Failed,
    Owed,
    Reply,
    Resumed,
    SweepReport,
    TurnOutcome,
)
from agent.workflow import Workflow
from bot import messages
from bot.card import approval_card, question_card
from bot.links import KEPT, Links
from bot.people import People
from bot.streaming import ReplyStream, Streams
from storage.domain import Approval, Thread
from storage.gateway_store import GATEWAY_CHANNEL

log = logging.getLogger(__name__)

THINKING = "is thinking…"
# Marks a card in the channel as an approval's, so a sweep can find a post cut off.
CARD_EVENT = "greenlight_approval_card"
# How far before its request a card is looked for: Slack's clock and ours may differ.
HISTORY_MARGIN = timedelta(minutes=5)
# Slack errors worth another try later (a sweep retries the card); any other is final.
TRANSIENT = {"ratelimited", "internal_error", "fatal_error", "service_unavailable"}


def card_mark(approval: Approval) -> dict[str, Any]:
    """The message metadata that says which approval a card is."""
    return {"event_type": CARD_EVENT, "event_payload": {"approval_id": approval.id}}


class Delivery:
    def __init__(
        self,
        workflow: Workflow,
        *,
        clock: Callable[[], datetime],
        stream_interval: float = 1.0,
        assistant_thread: Callable[[Thread], bool] = lambda thread: False,
        people: People | None = None,
    ) -> None:
        self._workflow = workflow
        # Whether a channel is private (a card in a public one quotes no conversation), and a
        # requester a guest (the card says so). None: all private, no guests (the demo's).
        self._people = people
        self._clock = clock
        self._stream_interval = stream_interval
        self._assistant_thread = assistant_thread
        self._channel_names: dict[str, str] = {}
        self._on_change: Callable[[AsyncWebClient, Approval], None] | None = None
        self._links = Links()
        self._permalink = self._links.link
        # What each card was last redrawn as (a digest, by channel and ts): a redraw that
        # would change nothing is not sent (a resume's, after the card said the call ran).
        self._drawn: dict[tuple[str, str], bytes] = {}

    def watch(self, on_change: Callable[[AsyncWebClient, Approval], None]) -> None:
        """Be told of every change a card is redrawn for (the Home tabs, bot/home.py)."""
        self._on_change = on_change

    async def outcome(
        self, client: AsyncWebClient, outcome: TurnOutcome, *, stream: ReplyStream | None = None
    ) -> None:
        """Render a turn's outcome into its thread: the end of its streamed reply, or a
        message (replacing the placeholder, if the turn left one)."""
        placeholder = None
        if stream is not None:
            closed = await stream.close(outcome.text if isinstance(outcome, Reply) else None)
            if closed.delivered:
                await self._count_covered(client, outcome)
                return
            placeholder = closed.replace
        if isinstance(outcome, Reply):
            message = messages.reply_message(outcome.text)
        elif isinstance(outcome, AwaitingApproval):
            message = await self._post_cards(client, outcome.approvals)
        elif isinstance(outcome, Busy):
            message = messages.busy_message(outcome)
        elif isinstance(outcome, AnsweredInThread):
            message = messages.answer_taken()
        else:
            message = messages.failure_message(outcome.retrying, outcome.model_unavailable)
        await self.say(client, outcome.thread, message, replace=placeholder)
        # An assistant thread's status line says what the turn waits for; set after the
        # note, since a post clears it.
        if isinstance(outcome, AwaitingApproval) and self._assistant_thread(outcome.thread):
            await self.status(client, outcome.thread, await self._waiting(client, outcome))
        await self._count_covered(client, outcome)

    async def _count_covered(self, client: AsyncWebClient, outcome: TurnOutcome) -> None:
        """Redraw the cards of the standing approvals that covered calls of the turn: each
        counts the calls that ran under it."""
        if isinstance(outcome, Reply | AwaitingApproval):
            for grant in outcome.standing:
                await self.refresh_card(client, grant)

    def streams(self, client: AsyncWebClient) -> Streams:
        """The text sink for the turns one piece of work runs: each reply streams into its
        thread, and an assistant thread shows "is thinking…" as its turn starts."""
        return Streams(
            client,
            interval=self._stream_interval,
            on_start=lambda thread: self.status(client, thread, THINKING),
        )

    async def status(self, client: AsyncWebClient, thread: Thread, status: str) -> None:
        """The line under an assistant thread's composer ("is thinking…"), in the assistant
        threads this process has seen (elsewhere Slack would refuse the call)."""
        if not self._assistant_thread(thread):
            return
        try:
            await client.assistant_threads_setStatus(
                channel_id=thread.channel_id, thread_ts=thread.thread_ts, status=status
            )
        except (SlackApiError, aiohttp.ClientError) as exc:
            log.debug("no status in %s: %r", thread.channel_id, exc)

    async def _waiting(self, client: AsyncWebClient, outcome: AwaitingApproval) -> str:
        """ "is waiting for approval in #finance" (or for an answer, for a question)."""
        first = outcome.approvals[0] if outcome.approvals else None
        what = "an answer" if first is not None and first.request.question else "approval"
        channel = first.card.channel if first is not None and first.card else None
        if channel is None or channel == outcome.thread.channel_id:
            return f"is waiting for {what}"
        name = await self._channel_name(client, channel)
        return f"is waiting for {what} in #{name}" if name else f"is waiting for {what}"

    async def _channel_name(self, client: AsyncWebClient, channel: str) -> str | None:
        """A channel's name, asked once per process (a rename shows after a restart)."""
        if (known := self._channel_names.get(channel)) is not None:
            return known
        try:
            name = (await client.conversations_info(channel=channel))["channel"].get("name")
        except (SlackApiError, aiohttp.ClientError, KeyError) as exc:
            log.warning("no name for channel %s: %r", channel, exc)
            return None
        if isinstance(name, str) and name:
            if len(self._channel_names) >= KEPT:
                self._channel_names.clear()
            self._channel_names[channel] = name
            return name
        return None

    async def resumed(
        self, client: AsyncWebClient, resumed: Resumed, streams: Streams | None = None
    ) -> None:
        # The thread first: the requester is waiting for the answer; the cards' redraw can
        # follow it. A failure the sweep retries stays quiet until it is settled.
        retrying = isinstance(resumed.outcome, Failed) and resumed.outcome.retrying
        stream = streams.take(resumed.outcome.thread) if streams is not None else None
        if not retrying:
            await self.outcome(client, resumed.outcome, stream=stream)
        elif stream is not None:
            await stream.close(None)  # what it said stays; the retry says the rest
        for approval in resumed.settled:
            await self.refresh_card(client, approval, current=not retrying)

    async def sweep(
        self, client: AsyncWebClient, report: SweepReport, streams: Streams | None = None
    ) -> None:
        for approval in report.uncarded:
            await self._post_again(client, approval, escalated=False)
        for approval in report.unescalated:
            await self._post_again(client, approval, escalated=True)
        for approval in report.expired:
            await self.refresh_card(client, approval, current=True)
        for resumed in report.resumed:
            await self.resumed(client, resumed, streams)

    async def _post_again(
        self, client: AsyncWebClient, approval: Approval, *, escalated: bool
    ) -> None:
        """A card (`escalated`: the escalated card) whose post failed or was cut off: if it
        is in the channel already, recorded as posted there; else posted."""
        found = await self._find_card(client, approval, escalated=escalated)
        if found is None:
            link = await self._permalink(client, approval.thread)
            channel = _channel(approval, escalated)
            if await self._post(client, approval, channel, link, escalated=escalated) and escalated:
                await self.refresh_card(client, approval)  # the first card says so
        elif found:
            done = await self._workflow.follow_ups.card_posted(
                approval, ts=found, escalated=escalated
            )
            if done is not None and escalated:
                await self.refresh_card(client, done)

    async def refresh_card(
        self, client: AsyncWebClient, approval: Approval, *, current: bool = False
    ) -> None:
        """Redraw a card in place from the recorded state (decided cards lose their buttons).

        Unless `current` (as the write that changed it returned it, or read after its last
        change: its turn finished, or it expired), the state is re-read just before drawing,
        so a late redraw (a losing click) does not paint over a newer one (the call has run)
        with what it saw earlier.
        """
        if not current:
            approval = (
                await self._workflow.reads.approval(approval.thread.team_id, approval.id)
                or approval
            )
        if self._on_change is not None:
            self._on_change(client, approval)
        places = [
            (c.channel, c.ts)
            for c in (approval.card, approval.escalation)
            if c is not None and c.channel and c.ts
        ]
        if not places:
            return
        link = await self._permalink(client, approval.thread)
        for channel, ts in places:  # the card, and its copy in the escalation channel
            card = await self._card(client, channel, approval, link)
            drawn = hashlib.blake2b(json.dumps(card, sort_keys=True).encode()).digest()
            if self._drawn.get((channel, ts)) == drawn:
                continue  # as this process last drew it there: nothing to change
            try:
                await client.chat_update(
                    channel=channel,
                    ts=ts,
                    metadata=card_mark(approval),  # kept, so a sweep can still find the card
                    **card,
                )
            except SlackApiError as exc:
                log.error("could not update card %s: %s", approval.id, exc.response.get("error"))
                continue
            if len(self._drawn) >= KEPT:
                del self._drawn[next(iter(self._drawn))]  # the oldest
            self._drawn[(channel, ts)] = drawn

    async def follow_ups(self, client: AsyncWebClient, due: Owed) -> None:
        """Do the reminders and escalations this process now owes (each recorded as done)."""
        for reminder in due.reminders:
            await self._remind(client, reminder)
        for escalation in due.escalations:
            await self._escalate(client, escalation)

    async def _remind(self, client: AsyncWebClient, due: Due) -> None:
        """In the card's thread, naming the explicit approvers (nobody, when the channel's
        members decide), and a DM with a link to the card to each approver named."""
        approval, policy = due.approval, due.policy
        card = approval.card
        if card is None or card.ts is None:
            return  # never posted: the requester was told, and there is nothing to remind of
        text = messages.reminder_text(approval, policy.approver_users, policy.approver_groups)
        await self.say(client, Thread("", card.channel, card.ts), text)
        in_thread = approval.thread.thread_ts if approval.request.asks == "requester" else None
        link = await self._permalink(client, Thread("", card.channel, card.ts), in_thread=in_thread)
        for user in policy.approver_users:
            note = messages.reminder_dm(approval, link)
            try:
                await client.chat_postMessage(
                    channel=user, unfurl_links=False, unfurl_media=False, **note
                )
            except SlackApiError as exc:
                log.warning("could not remind %s: %s", user, exc.response.get("error"))

    async def _escalate(self, client: AsyncWebClient, due: Due) -> None:
        """The card, also in the escalation channel, through its outbox (a post that fails
        is retried by a sweep); both are redrawn on every change."""
        approval = due.approval
        if approval.escalation is None or approval.escalation.channel is None:
            return
        link = await self._permalink(client, approval.thread)
        if await self._post(client, approval, approval.escalation.channel, link, escalated=True):
            await self.refresh_card(client, approval)  # the first card says it was escalated

    async def say(
        self,
        client: AsyncWebClient,
        thread: Thread,
        message: dict[str, Any],
        *,
        replace: str | None = None,
    ) -> str | None:
        """Post into the thread (or replace a message in it); returns the message ts."""
        if thread.channel_id == GATEWAY_CHANNEL:
            return None  # a gateway request's: no Slack thread to post in
        try:
            if replace is not None:
                await client.chat_update(channel=thread.channel_id, ts=replace, **message)
                return replace
            # Never unfurled: a prompt-injected reply must not make Slack fetch a URL.
            response = await client.chat_postMessage(
                channel=thread.channel_id,
                thread_ts=thread.thread_ts,
                unfurl_links=False,
                unfurl_media=False,
                **message,
            )
            return str(response["ts"])
        except SlackApiError as exc:
            log.error("could not post to %s: %s", thread.channel_id, exc.response.get("error"))
            return None

    async def _post_cards(
        self, client: AsyncWebClient, approvals: Sequence[Approval]
    ) -> dict[str, Any]:
        """Post one card per approval and return the note for the requester's thread."""
        links: list[str | None] = []
        thread_link = await self._permalink(client, approvals[0].thread) if approvals else None
        for approval in approvals:
            links.append(await self._post_card(client, approval, thread_link))
        return messages.requester_note(list(approvals), card_links=links)

    async def post_card(self, client: AsyncWebClient, approval: Approval) -> None:
        """The card of a request with no Slack thread behind it (the gateway's), through the
        same outbox as every card."""
        await self._post_card(client, approval, None)

    async def _post_card(
        self, client: AsyncWebClient, approval: Approval, thread_link: str | None
    ) -> str | None:
        if approval.card is None:
            tool = approval.request.tool
            log.error("no approver channel for %s: set APPROVER_CHANNEL or route it", tool)
            return None
        channel = approval.card.channel
        if (ts := await self._post(client, approval, channel, thread_link)) is None:
            return None
        in_thread = approval.thread.thread_ts if approval.request.asks == "requester" else None
        return await self._permalink(client, Thread("", channel, ts), in_thread=in_thread)

    async def _post(
        self,
        client: AsyncWebClient,
        approval: Approval,
        channel: str,
        thread_link: str | None,
        *,
        escalated: bool = False,
    ) -> str | None:
        """Post the card (`escalated`: its copy in the escalation channel) from its outbox,
        and record it posted; the ts of the card recorded, None when there is none. A
        failure Slack may get over is left to a sweep; one for good is recorded (and the
        requester told of the card's). A post that lost the race to be recorded (another
        attempt's card is) is deleted: never two live cards."""
        # A question to the requester is asked in their thread.
        asks_requester = not escalated and approval.request.asks == "requester"
        try:
            posted = await client.chat_postMessage(
                channel=channel,
                thread_ts=approval.thread.thread_ts if asks_requester else None,
                metadata=card_mark(approval),
                unfurl_links=False,
                unfurl_media=False,
                **await self._card(client, channel, approval, thread_link),
            )
        except SlackApiError as exc:
            error = exc.response.get("error")
            log.error("could not post card %s in %s: %s", approval.id, channel, error)
            if error not in TRANSIENT:  # for good: the requester must hear of their card's
                await self._workflow.follow_ups.card_failed(approval, escalated=escalated)
                if not escalated:
                    await self.say(client, approval.thread, messages.card_failed_message(approval))
            return None
        except aiohttp.ClientError as exc:  # after the client's retries; a sweep tries again
            log.error("could not post card %s in %s: %r", approval.id, channel, exc)
            return None
        ts = str(posted["ts"])
        follow_ups = self._workflow.follow_ups
        if await follow_ups.card_posted(approval, ts=ts, escalated=escalated) is not None:
            return ts
        return await self._withdraw(client, approval, channel, ts, escalated=escalated)

    async def _withdraw(
        self, client: AsyncWebClient, approval: Approval, channel: str, ts: str, *, escalated: bool
    ) -> str | None:
        """A card posted whose outbox had moved on: deleted unless it is the one recorded;
        the recorded card's ts."""
        now = await self._workflow.reads.approval(approval.thread.team_id, approval.id)
        place = (now.escalation if escalated else now.card) if now is not None else None
        recorded = place.ts if place is not None else None
        if recorded != ts:
            try:
                await client.chat_delete(channel=channel, ts=ts)
            except (SlackApiError, aiohttp.ClientError) as exc:
                log.error("could not delete a second card of %s: %r", approval.id, exc)
        return recorded

    async def _find_card(
        self, client: AsyncWebClient, approval: Approval, *, escalated: bool = False
    ) -> str | None:
        """The ts of the approval's card (`escalated`: its escalated card) if a post cut off
        reached the channel; None if it did not; "" when the channel could not be read (the
        card is left for a later sweep rather than risk a second one)."""
        place = approval.escalation if escalated else None  # posted once it was due
        since = (
            (place.at if place else approval.request.requested_at) - HISTORY_MARGIN
        ).timestamp()
        channel, oldest = _channel(approval, escalated), f"{since:.6f}"
        # One page, Slack's most: a card is posted soon after its request.
        try:
            if approval.request.asks == "requester" and not escalated:  # in their thread
                history = await client.conversations_replies(
                    channel=channel,
                    ts=approval.thread.thread_ts,
                    oldest=oldest,
                    limit=999,
                    include_all_metadata=True,
                )
            else:
                history = await client.conversations_history(
                    channel=channel, oldest=oldest, limit=999, include_all_metadata=True
                )
        except (SlackApiError, aiohttp.ClientError) as exc:
            log.error("could not look for the card of %s: %r", approval.id, exc)
            return ""
        for message in history.get("messages") or []:
            meta = message.get("metadata") or {}
            payload = meta.get("event_payload") or {}
            if meta.get("event_type") == CARD_EVENT and payload.get("approval_id") == approval.id:
                return str(message["ts"])
        return None

    async def _card(
        self, client: AsyncWebClient, channel: str, approval: Approval, thread_link: str | None
    ) -> dict[str, Any]:
        """The card as posted in `channel`: in a public one (a route whose approvers are
        named), anyone in the workspace can read it, so it quotes nothing of the
        conversation (Show conversation, for those who may decide, still does)."""
        r, now = approval.request, self._clock()
        description = self._workflow.runtime.describe(r.tool)
        quotes = (
            self._people is None
            or channel == approval.thread.channel_id  # the requester's own thread
            or await self._people.is_private(client, channel)
        )
        if r.question:
            return question_card(
                approval, description=description, thread_link=thread_link, now=now, quotes=quotes
            )
        editable = self._workflow.runtime.edit_form(r.tool, approval.current.input) is not None
        return approval_card(
            approval,
            description=description,
            thread_link=thread_link,
            now=now,
            editable=editable,
            note=self._workflow.runtime.note(r.tool),
            quotes=quotes,
            requester=await self._requester(client, approval),
        )

    async def _requester(self, client: AsyncWebClient, approval: Approval) -> str | None:
        """Whether the requester is a guest or of another organisation, for the card; None
        when not, or when Slack cannot say (the card goes out without it)."""
        if self._people is None:
            return None
        try:
            requester, team = approval.request.requester, approval.thread.team_id
            return await self._people.outsider_kind(client, requester, team)
        except Exception as exc:
            log.warning("no facts on the requester of %s: %r", approval.id, exc)
            return None

    async def link(self, client: AsyncWebClient, thread: Thread) -> str | None:
        """The message's permalink (a thread's, or a card's), asked of Slack once."""
        return await self._links.link(client, thread)

    def warm(self, client: AsyncWebClient, thread: Thread, user: str) -> None:
        """Start what a card of a turn `user` starts in `thread` shows, beside the model's
        call: the thread's link, whether its requester is a guest (users.info, asked for a
        turn that posts no card too: once a person a minute, bot/people.py CACHE_TTL)."""
        self._links.warm(client, thread)
        if self._people is not None:
            self._people.warm(client, user, thread.team_id)


def _channel(approval: Approval, escalated: bool) -> str:
    """Where the card (`escalated`: its escalated copy) goes."""
    place = approval.escalation if escalated else approval.card
    assert place is not None and place.channel is not None
    return place.channel
