"""What one conversation costs the service: SQL statements and Slack Web API calls (issue 23).

A conversation is the benchmark's (bench/bot.py): a DM, the model calling `transferMoney`,
the card, an Approve by someone else, the tool run and the model's reply in the thread. The
counts are pinned exactly, so a change that adds a statement or a Slack call says so here;
lower them when a cut lands. Each counts the second conversation of a service, as the
benchmark counts a warm one (the workspace's address and the approver channel's privacy are
asked once per process, not per conversation), with another requester and approver each
time, as there, every one of them in the people directory (the workspace synced): so two
directory reads (whether the requester is a guest, for the card; whether the approver is,
before they may decide) and no `users.info`. Statements
are those of the conversation's work only: the
service's periodic loops (recovery sweep, follow-ups, the gateway's) and this test's own
reads (the click helper's) are left out.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slack_bolt.request.async_request import AsyncBoltRequest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from bot.listeners import shared
from bot.server import Service
from storage.db import SessionFactory
from storage.people import PeopleStore
from tests import ledger_tools
from tests.bot.conftest import APPROVERS, LOOPS, SECRET, SlackClient, new_ts, settle
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import Call, FakeSlack

SQL_PER_CONVERSATION = 12
SLACK_PER_CONVERSATION = Counter({"chat.postMessage": 3, "chat.update": 2})
PEOPLE = ["UEMP", "UBOSS", "UEMP2", "UCFO"]  # the conversations' requesters and approvers


class Statements:
    """Statements the service runs, but those of its loops and of the test's own task."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._test: asyncio.Task[Any] | None = None

    def start(self) -> None:
        """Count from now on, but the calling task's own statements."""
        self._test = asyncio.current_task()

    def __call__(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        task = asyncio.current_task()
        if self._test is None or task is self._test or (task and task.get_name() in LOOPS):
            return
        self.seen.append(" ".join(statement.split())[:100])


@pytest.fixture
def service_overrides(fake_slack: FakeSlack, team: str) -> dict[str, Any]:
    """The service's workspace is `team`, whose users.list lists PEOPLE (set before it
    starts: its token's workspace is asked once)."""
    fake_slack.team_id, fake_slack.listed = team, PEOPLE
    return {}


@pytest.fixture
async def synced(team: str, service: Service, bot_sessions: SessionFactory) -> None:
    """PEOPLE in the directory, as the service's start-up sync left them."""
    store = PeopleStore(bot_sessions)

    async def listed() -> bool:
        since = datetime.now(UTC) - timedelta(hours=1)
        return all([await store.fresh(team, p, since=since) is not None for p in PEOPLE])

    await poll(listed, "the start-up sync")


@pytest.fixture
def statements() -> Iterator[Statements]:
    ran = Statements()
    event.listen(Engine, "before_cursor_execute", ran)
    yield ran
    event.remove(Engine, "before_cursor_execute", ran)


async def conversation(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    requester: str,
    approver: str,
) -> None:
    """The benchmark's conversation, start to end, every piece of work it started finished.
    As in the benchmark, each conversation's requester and approver are other people."""
    ts = new_ts()
    notes = len(fake_slack.calls_to("chat.update"))
    gemini.script(function_call("transferMoney", {"amount": 500, "toAccount": "12345"}))
    assert (await client.dm(team, requester, "send 500 to 12345", ts=ts))[0] == 200
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=is_card(ts))
    await fake_slack.wait_for("chat.update", notes + 1)  # the requester's note
    gemini.script(text("Sent 500 to 12345."))
    assert (await client.click(team, approver, "approve", card))[0] == 200
    await fake_slack.wait_for_message(
        lambda m: m.get("thread_ts") == ts and m.get("text") == "Sent 500 to 12345."
    )
    await settle(service)


def is_card(thread_ts: str) -> Callable[[Call], bool]:
    """The approval card of the request made in the DM thread `thread_ts` (it links to it)."""
    link = f"/p{thread_ts.replace('.', '')}"
    return lambda c: c.args.get("channel") == APPROVERS and link in json.dumps(c.args)


async def test_one_conversation_runs_its_pinned_number_of_statements(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    statements: Statements,
    synced: None,
) -> None:
    await conversation(
        client, fake_slack, gemini, team, service, "UEMP", "UBOSS"
    )  # the process warm
    statements.start()
    await conversation(client, fake_slack, gemini, team, service, "UEMP2", "UCFO")
    assert len(statements.seen) == SQL_PER_CONVERSATION, "\n".join(statements.seen)


async def test_one_conversation_makes_its_pinned_slack_calls(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    synced: None,
) -> None:
    await conversation(
        client, fake_slack, gemini, team, service, "UEMP", "UBOSS"
    )  # the process warm
    before = len(fake_slack.calls)
    await conversation(client, fake_slack, gemini, team, service, "UEMP2", "UCFO")
    made = Counter(c.method for c in fake_slack.calls[before:])
    assert made == SLACK_PER_CONVERSATION, "\n".join(
        f"{c.method} {c.args.get('channel')} {str(c.args.get('text'))[:60]!r}"
        for c in fake_slack.calls[before:]
    )


async def test_a_click_is_answered_before_its_work_begins(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    statements: Statements,
) -> None:
    """Bolt answers an Approve as soon as it is acknowledged: nothing the click does (the
    decision, the Slack calls it makes) has begun when the answer goes (issue 23). Sent
    straight to the Bolt app, so that its answer is the moment it returns."""
    ts = new_ts()
    gemini.script(function_call("transferMoney", {"amount": 500, "toAccount": "12345"}))
    assert (await client.dm(team, "UEMP", "send 500 to 12345", ts=ts))[0] == 200
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=is_card(ts))
    await settle(service)
    gemini.script(text("Sent 500 to 12345."))
    payload = await client.click_payload(team, "UBOSS", "approve", card)
    slack_calls = len(fake_slack.calls)
    headers = sp.signed_headers(SECRET, payload.body, content_type=payload.content_type)
    assert service.app is not None
    statements.start()
    answer = await service.app.async_dispatch(
        AsyncBoltRequest(body=payload.body.decode(), headers=dict(headers))
    )
    assert answer.status == 200
    assert statements.seen == [] and len(fake_slack.calls) == slack_calls
    await fake_slack.wait_for_message(
        lambda m: m.get("thread_ts") == ts and m.get("text") == "Sent 500 to 12345."
    )
    await settle(service)


async def test_a_slow_calls_card_says_approved_before_it_ran(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An approved call's card waits for the call to have run before it is redrawn (one
    redraw, not two), but not long: a slow call's card says who approved it after
    REDRAW_WITHIN, and once the call ran, that it ran."""
    monkeypatch.setattr(shared, "REDRAW_WITHIN", 0.2)
    ts = new_ts()
    gemini.script(function_call("transferMoney", {"amount": 5, "toAccount": "slow-1.5"}))
    assert (await client.dm(team, "UEMP", "send 5 to slow-1.5", ts=ts))[0] == 200
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=is_card(ts))
    gemini.script(text("Sent."))
    assert (await client.click(team, "UBOSS", "approve", card))[0] == 200

    def redrawn(c: Call) -> bool:
        return c.args.get("channel") == APPROVERS and "Approved by <@UBOSS>" in json.dumps(c.args)

    (approved,) = await fake_slack.wait_for("chat.update", predicate=redrawn)
    assert "Ran." not in json.dumps(approved.args)
    assert [e for e in ledger_tools.entries() if e["tool"] == "transferMoney:finished"] == []
    _, ran = await fake_slack.wait_for("chat.update", 2, predicate=redrawn)
    assert "Ran." in json.dumps(ran.args)
    await settle(service)


@pytest.mark.parametrize(
    ("thinks", "reply_first", "first"), [(0.0, 30.0, "reply"), (1.0, 0.1, "card")]
)
async def test_a_ran_calls_card_waits_for_the_reply_but_not_for_a_slow_model(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    monkeypatch: pytest.MonkeyPatch,
    thinks: float,
    reply_first: float,
    first: str,
) -> None:
    """The card's redraw is not in the way of the reply the requester waits on: a model that
    answers within REPLY_FIRST has its reply posted first; a slower one's card says the call
    ran while the model thinks. (REPLY_FIRST long for the first case: however slow the
    machine, the card waits for the reply.)"""
    monkeypatch.setattr(shared, "REPLY_FIRST", reply_first)
    ts = new_ts()
    gemini.script(function_call("transferMoney", {"amount": 5, "toAccount": "12345"}))
    assert (await client.dm(team, "UEMP", "send 5 to 12345", ts=ts))[0] == 200
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=is_card(ts))
    await settle(service)
    gemini.script(text("Sent.", delay=thinks))
    assert (await client.click(team, "UBOSS", "approve", card))[0] == 200

    def ran(c: Call) -> bool:
        return c.args.get("channel") == APPROVERS and "Ran." in json.dumps(c.args)

    def reply(c: Call) -> bool:
        return c.args.get("thread_ts") == ts and c.args.get("text") == "Sent."

    (redrawn,) = await fake_slack.wait_for("chat.update", predicate=ran)
    (replied,) = await fake_slack.wait_for("chat.postMessage", predicate=reply)
    order = sorted(
        [(fake_slack.calls.index(redrawn), "card"), (fake_slack.calls.index(replied), "reply")]
    )
    assert order[0][1] == first
    await settle(service)
