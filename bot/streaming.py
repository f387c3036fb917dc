"""The agent's reply, streamed into its thread as the model writes it.

Slack's streaming messages (`chat.startStream` / `appendStream` / `stopStream`, through
slack_sdk's `chat_stream`) show the text as it grows. Appends are batched: text goes out at
most once per `interval` (Slack rate limits the calls per channel), the first once it is
`interval` old, so a reply the model finishes sooner is one ordinary message, not a stream
of three calls; the stop carries the last words. Where Slack refuses a stream (an old
workspace, a surface without streaming, a stream that expired) the reply falls back to one
message rewritten with `chat.update`, at most once per `interval`, as before streams
existed.

Model output is untrusted: every piece is escaped (bot/safe_text.py `escape`) before it is
sent; escaping is per character, so escaping the pieces equals escaping the whole.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.models.messages.chunk import MarkdownTextChunk
from slack_sdk.web.async_chat_stream import AsyncChatStream
from slack_sdk.web.async_client import AsyncWebClient

from agent.outcomes import Progress
from bot import messages, safe_text
from storage.domain import Thread

log = logging.getLogger(__name__)

# What one append may carry (Slack's limit is 12,000 characters).
PIECE_MAX = 10000
WORD_MAX = 2000  # characters held back waiting for the end of a word, at most
SHORTENED = "\n\n_(reply shortened: too long for one Slack message)_"
SlackError = (SlackApiError, SlackRequestError, aiohttp.ClientError, TimeoutError)


@dataclass(frozen=True)
class Closed:
    """How a stream ended: whether the model's text is in the thread already, and which
    message (the placeholder, or the fallback's) an outcome should replace, if any."""

    delivered: bool
    replace: str | None


def _word_end(text: str, start: int) -> int:
    """Where the last whole word after `start` ends: the text up to its last whitespace
    (all of it past WORD_MAX, so a long run of text without spaces still streams)."""
    end = max(text.rfind(" ", start), text.rfind("\n", start)) + 1
    return end if end > start or len(text) - start < WORD_MAX else len(text)


def _link_whole(text: str, start: int, end: int) -> int:
    """`end`, or earlier: before a `[` that may open a markdown link the model has not
    finished writing, so that the link goes out in one piece and is neutralised whole
    (unless it stays open past WORD_MAX characters: then it is no link)."""
    opened = text.rfind("[", start, end)
    if opened == -1 or end - opened > WORD_MAX:
        return end
    link = safe_text.MARKDOWN_LINK.match(text, opened)
    return end if link is not None and link.end() <= end else opened


class ReplyStream:
    """One turn's reply in one thread. `placeholder` is the "Thinking…" message posted
    while the model starts (None where Slack shows a status instead: assistant threads);
    it is deleted once the reply streams under it, or rewritten by the fallback."""

    def __init__(
        self,
        client: AsyncWebClient,
        thread: Thread,
        recipient: str,
        *,
        interval: float,
        placeholder: asyncio.Task[str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client, self._thread, self._recipient = client, thread, recipient
        self._interval, self._clock = interval, clock
        self._placeholder = placeholder
        self._streamer: AsyncChatStream | None = None
        self._stream_ts: str | None = None
        self._fallback_ts: str | None = None  # once streaming failed: the message rewritten
        self._failed = False
        self._seen = ""  # the model's text so far (raw)
        self._sent = 0  # how much of it was handed to Slack
        self._last = 0.0
        self._stopped = False
        # The whole reply posted as the model gave it, while the turn is saved: its text.
        self._early: tuple[str, asyncio.Task[bool]] | None = None

    @property
    def started(self) -> bool:
        return self._stream_ts is not None or self._fallback_ts is not None

    async def write(self, so_far: str) -> None:
        """The model's text so far in this turn (it only grows). Nothing is sent before the
        text is `interval` old: a quick reply goes out whole, as one message (one call)."""
        if self._early is not None or not so_far.startswith(self._seen):
            return  # the reply went out whole; or never for Genkit's accumulated text
        now = self._clock()
        if not self._seen:
            self._last = now  # the first text: the interval runs from here
        self._seen = so_far[: messages.REPLY_MAX]
        if self._sent < len(self._seen) and now - self._last >= self._interval:
            await self._flush()

    def answered(self, reply: str) -> None:
        """The model's last answer, whole, while the turn is being saved: a reply held back
        (a quick one: none of it streamed yet) goes out now, not after the turn's two
        writes. A reply that streams, or would by now (`interval` 0), ends at `close`."""
        if self.started or self._stopped or self._early is not None or not reply.strip():
            return
        first = self._last if self._seen else self._clock()  # when its first words came
        if self._clock() - first >= self._interval:
            return
        self._early = (reply, asyncio.create_task(self._rewrite(reply)))

    async def close(self, reply: str | None) -> Closed:
        """End the reply. `reply` is the turn's final text when it ended with one (else it
        stopped on an approval or failed): it is in the thread already if it streamed, or
        went out whole (`answered`)."""
        if self._stopped:
            return Closed(False, None)
        self._stopped = True
        if self._early is not None:
            said, posting = self._early
            if await posting and reply == said:
                return Closed(True, None)
        if not self.started:  # the whole reply, if any, is the outcome's one message
            return Closed(False, await self._placeholder_ts())
        if self._stream_ts is not None and self._streamer is not None:
            rest = self._seen[self._sent :]
            self._sent = len(self._seen)
            tail = safe_text.inert_links(safe_text.escape(rest)) + self._tail(reply)
            try:
                await self._streamer.stop(markdown_text=tail or None)
                return Closed(reply is not None, None)
            except SlackError as exc:  # the stream expired: the message gets the whole text
                log.warning("could not stop the reply stream: %r", exc)
                self._fallback_ts, self._stream_ts = self._stream_ts, None
        if self._fallback_ts is not None:
            if reply is None:
                return Closed(False, None)  # the text stays; the outcome follows it
            return Closed(False, self._fallback_ts)  # rewritten with the whole reply
        return Closed(False, await self._placeholder_ts())

    def _tail(self, reply: str | None) -> str:
        """The note that the reply was cut, if it was."""
        return SHORTENED if reply is not None and len(reply) > messages.REPLY_MAX else ""

    async def _flush(self) -> None:
        self._last = self._clock()
        upto = _link_whole(self._seen, self._sent, _word_end(self._seen, self._sent))
        if upto <= self._sent:
            return  # one word (or an open link) so far: it goes out whole, seen whole
        piece = safe_text.inert_links(safe_text.escape(self._seen[self._sent : upto]))
        self._sent = upto
        if not self._failed:
            try:
                await self._append(piece)
                return
            except SlackError as exc:
                log.info(
                    "streaming unavailable in %s (%r): updating a message instead",
                    self._thread.channel_id,
                    exc,
                )
                self._failed = True
                self._fallback_ts = self._stream_ts
                self._stream_ts = self._streamer = None
        await self._rewrite(self._seen)

    async def _append(self, piece: str) -> None:
        if self._streamer is None:
            self._streamer = await self._client.chat_stream(
                channel=self._thread.channel_id,
                thread_ts=self._thread.thread_ts,
                recipient_team_id=self._thread.team_id,
                recipient_user_id=self._recipient,
            )
        first = self._stream_ts is None
        for at in range(0, len(piece), PIECE_MAX):  # chunks: sent now, not buffered
            text = piece[at : at + PIECE_MAX]
            await self._streamer.append(chunks=[MarkdownTextChunk(text=text)])
            self._stream_ts = self._streamer.ts
        if first:
            await self._drop_placeholder()

    async def _rewrite(self, text: str) -> bool:
        """The fallback: the placeholder (or one message) rewritten with the text so far;
        whether Slack took it."""
        message = messages.reply_message(text)
        if self._fallback_ts is None:
            self._fallback_ts = await self._placeholder_ts()
        try:
            if self._fallback_ts is None:
                posted = await self._client.chat_postMessage(
                    channel=self._thread.channel_id,
                    thread_ts=self._thread.thread_ts,
                    unfurl_links=False,
                    unfurl_media=False,
                    **message,
                )
                self._fallback_ts = str(posted["ts"])
            else:
                await self._client.chat_update(
                    channel=self._thread.channel_id, ts=self._fallback_ts, **message
                )
        except SlackError as exc:
            log.error("could not show the reply in %s: %r", self._thread.channel_id, exc)
            return False
        return True

    async def _placeholder_ts(self) -> str | None:
        return await self._placeholder if self._placeholder is not None else None

    async def _drop_placeholder(self) -> None:
        """The reply now streams below the "Thinking…" message, which would only linger."""
        ts = await self._placeholder_ts()
        self._placeholder = None
        if ts is not None:
            try:
                await self._client.chat_delete(channel=self._thread.channel_id, ts=ts)
            except SlackError as exc:
                log.warning("could not delete the placeholder: %r", exc)


class Streams:
    """The replies of the turns one piece of work runs (a message, a click's resume, a
    sweep's recoveries), by thread: the workflow's text sink (agent/workflow.py
    `TextSink`). A turn's stream opens when the turn starts (its Progress with no text)."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        interval: float,
        on_start: Callable[[Thread], Awaitable[None]] | None = None,
    ) -> None:
        self._client, self._interval = client, interval
        self._open: dict[Thread, ReplyStream] = {}
        self._on_start = on_start

    def open(
        self, thread: Thread, recipient: str, placeholder: asyncio.Task[str | None] | None = None
    ) -> ReplyStream:
        stream = ReplyStream(
            self._client,
            thread,
            recipient,
            interval=self._interval,
            placeholder=placeholder,
        )
        self._open[thread] = stream
        return stream

    async def __call__(self, progress: Progress) -> None:
        stream = self._open.get(progress.thread)
        if stream is None:
            stream = self.open(progress.thread, progress.requester)
        if progress.final:
            stream.answered(progress.text)
            await asyncio.sleep(0)  # the post goes out first, the turn's save after it
        elif progress.text:
            await stream.write(progress.text)
        elif self._on_start is not None:
            await self._on_start(progress.thread)

    def take(self, thread: Thread) -> ReplyStream | None:
        """The thread's stream, for its outcome to close (each is closed once)."""
        return self._open.pop(thread, None)

    async def close_rest(self) -> None:
        """Stop the streams no outcome took (a resume that lost its lease midway): what
        they said stays, and Slack does not show them as still typing."""
        rest, self._open = list(self._open.values()), {}
        for stream in rest:
            await stream.close(None)
