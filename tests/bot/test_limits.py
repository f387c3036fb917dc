"""Back-pressure and fair use, end to end: messages per person and workspace per minute
(counted in the database, so across replicas), the backlog a process keeps, the model calls
it makes at once, and a database that fails under a turn or an event.

Each service here runs on a clock stopped inside one minute, so the limits count exactly the
messages a test sends, whenever it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import event, select
from sqlalchemy.engine import Engine

from bot.server import Service
from storage.db import SessionFactory
from storage.models import MessageCountRow
from tests.bot.conftest import ACK_DEADLINE, DM, SlackClient, bot_settings, new_ts, settle
from tests.bot.test_e2e import REQUESTER, TRANSFER, said, thread_posts
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import Call, FakeSlack

WAIT = "faster than I can take them"
BUSY = "I'm busy right now"
FAILED_TEXT = "Sorry — something went wrong on my side"
NOW = datetime.now(UTC).replace(second=30)


def posts_saying(fake_slack: FakeSlack, words: str) -> list[Call]:
    return [
        c
        for c in fake_slack.calls
        if c.method in ("chat.postMessage", "chat.update") and words in str(c.args.get("text"))
    ]


@contextlib.asynccontextmanager
async def running(
    fake_slack: FakeSlack, gemini: FakeGemini, database: str, **overrides: Any
) -> AsyncIterator[SlackClient]:
    settings = bot_settings(fake_slack, gemini, DATABASE_URL=database, **overrides)
    service = Service(settings, host="127.0.0.1", clock=lambda: NOW)
    await service.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield SlackClient(http, service, fake_slack)
    finally:
        await service.stop()


@pytest.fixture
def start(
    fake_slack: FakeSlack, gemini: FakeGemini, ledger: Path, bot_database: str
) -> Callable[..., contextlib.AbstractAsyncContextManager[SlackClient]]:
    """Start a service (a replica: all share the database) with settings of the test's."""
    return lambda **overrides: running(fake_slack, gemini, bot_database, **overrides)


Start = Callable[..., contextlib.AbstractAsyncContextManager[SlackClient]]


async def test_a_burst_from_one_person_runs_their_limit_and_is_told_to_wait_once(
    start: Start, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    gemini.script(*[text("ok")] * 20)  # a 21st model call would fail the test
    async with start() as client:
        began = time.monotonic()
        for i in range(100):
            sent = time.monotonic()
            assert (await client.dm(team, REQUESTER, f"message {i}"))[0] == 200
            assert time.monotonic() - sent < ACK_DEADLINE  # over the limit too
        assert time.monotonic() - began < 10.0
        await settle(client.service)
    assert len(gemini.generate_requests()) == 20 and gemini.pending == 0
    [told] = posts_saying(fake_slack, WAIT)
    assert told.args["text"].startswith("You're sending")
    replies = [c for c in fake_slack.calls_to("chat.update") if c.args.get("text") == "ok"]
    assert len(replies) == 20  # each run turn's placeholder became its reply


async def test_the_limits_hold_across_replicas(
    start: Start, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    gemini.script(*[text("ok")] * 5)
    limits = {"USER_MESSAGES_PER_MINUTE": 3, "TEAM_MESSAGES_PER_MINUTE": 5}
    async with start(**limits) as one, start(**limits) as two:
        for i in range(6):  # one person, both replicas in turn: 3 run
            await (one, two)[i % 2].dm(team, "UFIRST", f"first {i}")
        for i in range(4):  # another: 2 run, then the workspace's 5 are used up
            await (two, one)[i % 2].dm(team, "USECOND", f"second {i}")
            # Each counted before the next: which limit a refusal names depends on the order
            # (acknowledged at once, two messages sent back to back may be counted as a pair).
            await settle(one.service)
            await settle(two.service)
        await settle(one.service)
        await settle(two.service)
    assert len(gemini.generate_requests()) == 5 and gemini.pending == 0
    told = sorted(c.args["text"].split(" sending")[0] for c in posts_saying(fake_slack, WAIT))
    assert told == ["You're", "Your workspace is"]  # once each: the person, then the workspace


async def test_a_full_backlog_turns_new_messages_away_until_it_drains(
    start: Start, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    gemini.script(text("first"), text("second"), text("fourth"))
    gemini.open.clear()  # the model answers nobody until the test says
    async with start(MAX_CONCURRENT_TURNS=1, MAX_QUEUED_TURNS=2) as client:
        await client.dm(team, REQUESTER, "first")
        await poll(lambda: gemini.answering == 1, "the first model call")
        await client.dm(team, REQUESTER, "second")
        await poll(lambda: gemini.answering == 2, "the second model call")
        third = new_ts()
        await client.dm(team, REQUESTER, "third", ts=third)
        [busy] = await fake_slack.wait_for(
            "chat.postMessage", predicate=lambda c: BUSY in str(c.args.get("text"))
        )
        assert busy.args["thread_ts"] == third
        assert len(thread_posts(fake_slack, third)) == 1  # the notice alone: no turn

        gemini.open.set()
        await said(fake_slack, "second")
        await settle(client.service)
        await client.dm(team, REQUESTER, "fourth")
        await said(fake_slack, "fourth")
    assert len(gemini.generate_requests()) == 3


async def test_model_calls_in_flight_are_capped(
    start: Start, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    gemini.script(*[text("ok", delay=0.2)] * 6)
    async with start(MAX_CONCURRENT_TURNS=8, MAX_MODEL_CALLS=2) as client:
        for i in range(6):
            await client.dm(team, REQUESTER, f"message {i}")
        await settle(client.service)
    assert len(gemini.generate_requests()) == 6
    assert gemini.most_answering == 2  # reached, never passed


async def test_the_sweep_removes_the_counters_of_past_minutes(
    start: Start, bot_sessions: SessionFactory, team: str
) -> None:
    old, current = NOW - timedelta(minutes=10), NOW.replace(second=0)
    async with bot_sessions() as db:
        for minute in (old, current):
            db.add(MessageCountRow(team_id=team, user_id="", minute=minute, count=1, told=False))
        await db.commit()

    async def minutes() -> set[datetime]:
        async with bot_sessions() as db:
            query = select(MessageCountRow.minute).where(MessageCountRow.team_id == team)
            return set((await db.scalars(query)).all())

    async with start():  # its recovery sweep runs at once
        for _ in range(200):  # polled, for 10 s at most
            if await minutes() == {current}:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"the sweep left {await minutes()}")


@contextlib.contextmanager
def database_fails_on(fragment: str) -> Iterator[list[str]]:
    """Terminate the connection, from the server side, as it runs the first statement that
    contains `fragment` (in any engine of this process: the service's is private to it)."""
    killed: list[str] = []

    def kill(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not killed and fragment in " ".join(statement.upper().split()):
            killed.append(statement)
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    event.listen(Engine, "before_cursor_execute", kill)
    try:
        yield killed
    finally:
        event.remove(Engine, "before_cursor_execute", kill)


@pytest.mark.parametrize(
    "fragment",
    [
        "INSERT INTO SEEN_EVENTS",  # the event's dedup: no turn begins
        "INSERT INTO CONVERSATIONS",  # taking the thread for the turn
        "INSERT INTO TURNS",  # pausing the turn on its approval
    ],
)
async def test_a_database_failure_tells_the_requester_and_frees_the_thread(
    start: Start, fake_slack: FakeSlack, gemini: FakeGemini, team: str, fragment: str
) -> None:
    if fragment == "INSERT INTO TURNS":
        gemini.script(function_call("transferMoney", TRANSFER, id="call-1"))
    gemini.script(text("done"))
    ts = new_ts()
    async with start() as client:
        with database_fails_on(fragment) as killed:
            await client.dm(team, REQUESTER, "send 500 to 12345", ts=ts)
            told = await said(fake_slack, FAILED_TEXT, prefix=True)
        assert killed, "the fault was never injected"
        assert told in fake_slack.thread(DM, ts)
        assert not [m for m in fake_slack.thread(DM, ts) if "Thinking" in str(m.get("text"))]
        await settle(client.service)
        # The thread is free at once: the next message in it runs.
        again = sp.message_im_event(team, REQUESTER, DM, "again?", new_ts(), thread_ts=ts)
        assert (await client.send(again))[0] == 200
        await said(fake_slack, "done")
        await settle(client.service)
    assert gemini.pending == 0
    assert not fake_slack.calls_to("chat.postMessage") or all(
        c.args["channel"] == DM for c in fake_slack.calls_to("chat.postMessage")
    )  # no approval card went out for the failed pause
