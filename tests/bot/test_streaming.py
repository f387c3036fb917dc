"""Replies stream into their thread as the model writes them (chat.startStream / appendStream /
stopStream), for a first turn and after an approval, and fall back to one message rewritten
with chat.update where Slack refuses a stream."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from agent.outcomes import Progress
from bot.app import web_client
from bot.server import Service
from bot.streaming import Streams
from storage.db import SessionFactory
from storage.domain import Thread
from storage.models import ConversationRow
from tests.bot.conftest import DM, SlackClient, new_ts, settle
from tests.bot.test_e2e import BOSS, REQUESTER, ask, reply_in_thread, said, text_of
from tests.conftest import poll
from tests.fakes.gemini import FakeGemini, text
from tests.fakes.slack_api import FakeSlack

# Every piece goes out as it comes (the default batches them a second apart).
EVERY_PIECE = pytest.mark.parametrize("service_overrides", [{"STREAM_INTERVAL_SECONDS": 0}])


def stream_calls(fake_slack: FakeSlack, ts: str | None = None) -> list[str]:
    """The stream methods called, in order (for the stream at `ts`, if given)."""
    methods = ("chat.startStream", "chat.appendStream", "chat.stopStream")
    return [
        c.method
        for c in fake_slack.calls
        if c.method in methods and not c.injected and (ts is None or c.args.get("ts") in (ts, None))
    ]


@EVERY_PIECE
async def test_a_first_reply_streams_in_pieces_and_replaces_the_placeholder(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(text("Your ", "balance ", "is ", "100 ", "dollars."))
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "balance?", ts=ts))[0] == 200
    reply = await said(fake_slack, "Your balance is 100 dollars.")
    await settle(service)
    calls = stream_calls(fake_slack)
    assert calls[0] == "chat.startStream" and calls[-1] == "chat.stopStream"
    assert calls.count("chat.appendStream") >= 2, calls
    (start,) = fake_slack.calls_to("chat.startStream")
    assert start.args["recipient_user_id"] == REQUESTER and start.args["thread_ts"] == ts
    # The "Thinking…" placeholder went once the reply streamed below it: one message remains.
    assert fake_slack.calls_to("chat.delete")
    assert [m["ts"] for m in fake_slack.thread(DM, ts)] == [reply["ts"]]


@EVERY_PIECE
async def test_a_reply_after_an_approval_streams_in_pieces(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    gemini.script(text("Sent ", "500 ", "to ", "account ", "12345."))
    assert (await client.click(team, BOSS, "approve", asked.card))[0] == 200
    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    await settle(service)
    assert text_of(reply) == "Sent 500 to account 12345."
    calls = stream_calls(fake_slack)
    assert calls[0] == "chat.startStream" and calls[-1] == "chat.stopStream"
    assert calls.count("chat.appendStream") >= 2, calls


async def test_a_reply_quicker_than_the_interval_is_one_message(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Five pieces arriving within moments (the default interval is a second): no stream,
    the placeholder becomes the reply, one call."""
    gemini.script(text("One ", "two ", "three ", "four ", "five."))
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "count", ts=ts))[0] == 200
    await said(fake_slack, "One two three four five.")
    await settle(service)
    assert stream_calls(fake_slack) == []
    assert len(fake_slack.calls_to("chat.postMessage")) == 1  # the placeholder
    assert len(fake_slack.calls_to("chat.update")) == 1  # ... made the reply
    assert [m["text"] for m in fake_slack.thread(DM, ts)] == ["One two three four five."]


@EVERY_PIECE
async def test_where_slack_refuses_a_stream_the_placeholder_is_rewritten(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.fail_next("chat.startStream", error="not_allowed_token_type")
    gemini.script(text("Plain ", "old ", "update."))
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "hello", ts=ts))[0] == 200
    reply = await said(fake_slack, "Plain old update.")
    await settle(service)
    (placeholder,) = fake_slack.calls_to("chat.postMessage")
    assert reply["ts"] != placeholder.args.get("ts") and reply["thread_ts"] == ts
    assert [m["text"] for m in fake_slack.thread(DM, ts)] == ["Plain old update."]
    assert not [c for c in fake_slack.calls_to("chat.startStream") if not c.injected]
    assert not fake_slack.calls_to("chat.appendStream")


@EVERY_PIECE
async def test_a_stream_that_expires_midway_still_ends_whole(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.fail_next("chat.appendStream", error="message_not_in_streaming_state", times=99)
    gemini.script(text("Half ", "and ", "the ", "rest."))
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "hello", ts=ts))[0] == 200
    # The stream's own message is rewritten with the whole reply.
    await said(fake_slack, "Half and the rest.")
    await settle(service)
    assert [m["text"] for m in fake_slack.thread(DM, ts)] == ["Half and the rest."]


@EVERY_PIECE
async def test_a_url_in_a_streamed_reply_is_code_never_a_link(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Streams have no unfurl switch: a URL (maybe injected, to leak data through Slack's
    unfurler) goes out as code, even when split across pieces."""
    gemini.script(text("See https://evil.exa", "mple/x?secret=1 and <!here> ok"))
    assert (await client.dm(team, REQUESTER, "link?", ts=new_ts()))[0] == 200
    reply = await said(fake_slack, "See ", prefix=True)
    await settle(service)
    assert reply["text"] == "See `https://evil.example/x?secret=1` and &lt;!here&gt; ok"


@EVERY_PIECE
async def test_bare_domains_and_markdown_links_in_a_streamed_reply_are_code(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """A bare domain, and a markdown link written across pieces: what decides is the text
    so far, so the link goes out whole and only as text, its target as code."""
    gemini.script(text("Try evil.example now, or [click ", "here](https://evil.example/?q=1) ok"))
    assert (await client.dm(team, REQUESTER, "link?", ts=new_ts()))[0] == 200
    reply = await said(fake_slack, "Try ", prefix=True)
    await settle(service)
    assert reply["text"] == (
        "Try `evil.example` now, or click here `(https://evil.example/?q=1)` ok"
    )


async def test_a_stream_no_outcome_took_is_stopped_with_what_it_said(
    fake_slack: FakeSlack,
) -> None:
    """A resume that lost its lease midway has no outcome to close its stream: the piece of
    work stops it, so Slack does not show the bot as still writing."""
    client = web_client("xoxb-test", fake_slack.base_url)
    try:
        streams = Streams(client, interval=0)
        thread = Thread("T0TEAM", DM, new_ts())
        await streams(Progress(thread, REQUESTER))
        await streams(Progress(thread, REQUESTER, "Half a reply "))
        await streams.close_rest()
        await streams.close_rest()  # nothing left: nothing more sent
    finally:
        assert client.session is not None
        await client.session.close()
    (stopped,) = fake_slack.calls_to("chat.stopStream")
    [message] = fake_slack.thread(DM, thread.thread_ts)
    assert message["ts"] == stopped.args["ts"] and message["text"] == "Half a reply "
    assert fake_slack.finished(message)


async def test_a_quick_reply_shows_while_its_turn_is_still_being_saved(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
) -> None:
    """The model's last answer goes out as it comes, not after the turn's writes (issue 23):
    here the write that frees the thread waits on a lock the test holds, and the reply is in
    the thread meanwhile, once; the thread is freed when the lock goes."""
    gemini.script(text("Done.", delay=1.0))  # time for the test to take its lock first
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "go", ts=ts))[0] == 200
    of_thread = sa.select(ConversationRow).where(
        ConversationRow.team_id == team, ConversationRow.thread_ts == ts
    )

    async def held() -> bool:
        async with bot_sessions() as db:
            row = (await db.execute(of_thread)).scalar_one_or_none()
            return row is not None and row.busy_until is not None

    await poll(held, "the turn holds its thread")
    async with bot_sessions() as db, db.begin():
        await db.execute(of_thread.with_for_update())  # the thread's release waits on this
        await said(fake_slack, "Done.")
        assert (await db.execute(of_thread)).scalar_one().busy_until is not None
    await settle(service)
    assert [m["text"] for m in fake_slack.thread(DM, ts)] == ["Done."]  # the placeholder, now it
    assert await held() is False


@pytest.mark.parametrize("refused", [False, True])
async def test_an_early_reply_stands_only_when_slack_took_it_and_the_turn_kept_it(
    fake_slack: FakeSlack, refused: bool
) -> None:
    """The reply posted as the model answered is the outcome's when Slack took it and the
    turn ended with that very text; else the outcome's own message follows (a turn whose
    save failed says so under it; one Slack refused is posted again)."""
    client = web_client("xoxb-test", fake_slack.base_url)
    try:
        streams = Streams(client, interval=1.0)
        thread = Thread("T0TEAM", DM, new_ts())
        if refused:
            fake_slack.fail_next("chat.postMessage", error="internal_error")
        await streams(Progress(thread, REQUESTER))
        await streams(Progress(thread, REQUESTER, "All done."))
        await streams(Progress(thread, REQUESTER, "All done.", final=True))
        stream = streams.take(thread)
        assert stream is not None
        kept = await stream.close("All done.")
        other = streams.open(thread, REQUESTER)
        await streams(Progress(thread, REQUESTER, "Said.", final=True))
        failed = await other.close(None)  # the turn's save failed after all
    finally:
        assert client.session is not None
        await client.session.close()
    assert kept.delivered is not refused and kept.replace is None
    assert not failed.delivered and failed.replace is None  # the failure notice goes below
    texts = [m["text"] for m in fake_slack.thread(DM, thread.thread_ts)]
    assert texts == (["Said."] if refused else ["All done.", "Said."])
