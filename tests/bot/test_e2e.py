"""End to end through the running service: signed HTTP (or Socket Mode) into the real Bolt app,
the fake Slack Web API out, the fake Gemini behind the real Genkit plugin, PostgreSQL beneath.

Effects are awaited with `FakeSlack.wait_for` and deadlines, never with sleeps; `settle` waits
for the service's own in-flight work before a test counts what did *not* happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from sqlalchemy import event, func, select

from bot.server import Service
from bot.settings import ConfigError
from storage.db import SessionFactory
from storage.domain import Approved
from storage.models import ConversationRow, SeenEventRow
from tests import ledger_tools
from tests.bot.conftest import (
    ACK_DEADLINE,
    ADMIN,
    APPROVERS,
    DM,
    LOOPS,
    SlackClient,
    approval_id_of,
    bot_settings,
    in_channel,
    new_ts,
    settle,
)
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import DEADLINE, Call, FakeSlack

TRANSFER = {"amount": 500, "toAccount": "12345"}
REQUESTER = "UEMP"
BOSS = "UBOSS"
PINGS = ("<!channel>", "<@U123>", "<!subteam^S1>")
NASTY = " ".join(PINGS)
TO_SLACK = (
    "chat.postMessage",
    "chat.update",
    "chat.postEphemeral",
    "views.open",
    "chat.startStream",
    "chat.appendStream",
    "chat.stopStream",
)


@dataclass
class Asked:
    """A DM that stopped on an approval: its thread, placeholder, card and approval id."""

    thread_ts: str
    placeholder: Call
    card: Call
    note: Call
    approval_id: str


async def ask(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    *,
    requester: str = REQUESTER,
    args: dict[str, Any] | None = None,
) -> Asked:
    """DM the bot; the model calls transferMoney; wait for the card and the requester's note."""
    gemini.script(function_call("transferMoney", args or TRANSFER, id="call-1"))
    ts = new_ts()
    status, _ = await client.dm(team, requester, "send 500 to 12345", ts=ts)
    assert status == 200
    (placeholder,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(DM, ts))
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    (note,) = await fake_slack.wait_for(
        "chat.update", predicate=lambda c: in_channel(DM)(c) and "approval" in text_of(c)
    )
    return Asked(ts, placeholder, card, note, approval_id_of(card))


def text_of(call: Call) -> str:
    return str(call.args.get("text", ""))


def blocks_of(call: Call) -> list[dict[str, Any]]:
    return list(call.args.get("blocks") or [])


def decided_card(marker: str) -> Callable[[Call], bool]:
    """A chat.update of a card that shows `marker` (e.g. 'Approved by <@UBOSS>')."""

    def match(call: Call) -> bool:
        return in_channel(APPROVERS)(call) and marker in json.dumps(blocks_of(call))

    return match


async def reply_in_thread(
    fake_slack: FakeSlack,
    thread_ts: str,
    timeout: float = DEADLINE,  # noqa: ASYNC109
) -> Call:
    """The message in the requester's thread after the first (the placeholder, or the note
    it became), as the requester reads it once whole (posted, or streamed and stopped)."""

    def second(message: dict[str, Any]) -> bool:
        thread = fake_slack.thread(DM, thread_ts)
        return len(thread) >= 2 and message is thread[1]

    message = await fake_slack.wait_for_message(second, timeout=timeout)
    return Call("message", message, CIMultiDict())


async def said(
    fake_slack: FakeSlack,
    text: str,
    channel: str = DM,
    *,
    prefix: bool = False,
    timeout: float = DEADLINE,  # noqa: ASYNC109
) -> dict[str, Any]:
    """Wait for a message in `channel` that reads `text` (or starts with it) once whole."""

    def match(m: dict[str, Any]) -> bool:
        got = str(m.get("text", ""))
        return m.get("channel") == channel and (got.startswith(text) if prefix else got == text)

    return await fake_slack.wait_for_message(match, timeout=timeout)


def replies(fake_slack: FakeSlack) -> list[str]:
    """The quick replies (each its placeholder rewritten), in the order they were made."""
    return [text_of(c) for c in fake_slack.calls_to("chat.update") if not c.injected]


def thread_posts(fake_slack: FakeSlack, thread_ts: str) -> list[Call]:
    """Messages the bot started in the thread: posts and streams."""
    return [
        c
        for c in fake_slack.calls
        if c.method in ("chat.postMessage", "chat.startStream")
        and not c.injected
        and in_channel(DM, thread_ts)(c)
    ]


# -- approve and deny ------------------------------------------------------------------------


async def test_dm_to_card_to_approve_to_reply(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    assert service.deps is not None

    # The placeholder went into the requester's thread at once, then became the note.
    assert text_of(asked.placeholder) == "_Thinking…_"
    assert asked.placeholder.args["thread_ts"] == asked.thread_ts
    assert asked.note.args["channel"] == DM and "`transferMoney`" in text_of(asked.note)
    assert "<#C0APPROVE>" in text_of(asked.note)

    # The card: header names the tool; both buttons carry the approval id and nothing else.
    card_blocks = blocks_of(asked.card)
    assert card_blocks[0] == {
        "type": "header",
        "text": {"type": "plain_text", "text": "Approval needed: transferMoney"},
    }
    (actions,) = [b for b in card_blocks if b.get("block_id") == "approval"]
    *buttons, menu = actions["elements"]
    assert [(e["action_id"], e["value"]) for e in buttons] == [
        ("approve", f"{asked.approval_id}~1"),
        ("edit_approve", f"{asked.approval_id}~1"),
        ("deny", f"{asked.approval_id}~1"),
    ]
    assert [o["value"] for o in menu["options"]] == [
        f"note:{asked.approval_id}~1",
        f"conversation:{asked.approval_id}",
    ]
    assert "thread_ts" not in asked.card.args
    [pending] = await service.deps.workflow.reads.pending(team)
    assert pending.id == asked.approval_id and pending.request.requester == REQUESTER
    assert ledger_tools.entries() == []

    gemini.script(text("Sent 500 to 12345."))
    status, _ = await client.click(team, BOSS, "approve", asked.card)
    assert status == 200

    # The card is updated in place: same channel and ts, no buttons, says who approved.
    (update,) = await fake_slack.wait_for("chat.update", predicate=decided_card("Approved by"))
    info = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert info is not None and isinstance(info.decision, Approved)
    assert info.card is not None and update.args["ts"] == info.card.ts
    assert all(b.get("block_id") != "approval" for b in blocks_of(update))
    assert "Approved by <@UBOSS>" in json.dumps(blocks_of(update))

    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    assert text_of(reply) == "Sent 500 to 12345."
    [entry] = ledger_tools.entries()
    assert (entry["tool"], entry["amount"], entry["to"]) == ("transferMoney", 500, "12345")
    assert entry["key"] == asked.approval_id
    [response] = gemini.function_responses()
    # The call's ref is Greenlight's own, not the model's "call-1"; the answer carries it.
    assert response["id"] == info.request.ref != "call-1"
    assert response["name"] == "transferMoney"
    assert response["response"]["content"]["success"] is True
    assert gemini.pending == 0
    await settle(service)
    final = json.dumps(fake_slack.messages[update.args["ts"]]["blocks"])  # what approvers see
    assert "Approved by <@UBOSS>" in final and "Ran." in final
    # The thread's link, built as Slack builds it (the workspace's address from auth.test):
    # the card links to the thread, the requester's note to the card; nothing asked.
    assert fake_slack.calls_to("chat.getPermalink") == []
    thread_link = f"https://example.slack.com/archives/{DM}/p{asked.thread_ts.replace('.', '')}"
    assert f"<{thread_link}|" in final
    card_link = f"archives/{APPROVERS}/p{update.args['ts'].replace('.', '')}|"
    assert any(card_link in json.dumps(c.args) for c in fake_slack.calls_to("chat.update"))


async def test_deny_with_a_reason_reaches_the_model_and_nothing_runs(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    status, _ = await client.click(team, BOSS, "deny", asked.card)
    assert status == 200
    (opened,) = await fake_slack.wait_for("views.open")
    view = opened.args["view"]
    assert view["callback_id"] == "deny_reason" and view["type"] == "modal"
    assert json.loads(view["private_metadata"])["approval_id"] == asked.approval_id
    assert opened.args["trigger_id"].startswith("trigger-")
    assert "`transferMoney`" in json.dumps(view["blocks"])
    assert ledger_tools.entries() == []

    gemini.script(text("The transfer was denied: not this month."))
    reason = {"reason": {"reason": {"type": "plain_text_input", "value": "not this month"}}}
    status, body = await client.submit(team, BOSS, view, reason)
    assert (status, body) == (200, "")

    (update,) = await fake_slack.wait_for("chat.update", predicate=decided_card("Denied by"))
    shown = json.dumps(blocks_of(update))
    assert "Denied by <@UBOSS>" in shown and "not this month" in shown
    assert all(b.get("block_id") != "approval" for b in blocks_of(update))
    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    assert text_of(reply) == "The transfer was denied: not this month."
    [response] = gemini.function_responses()
    assert response["id"] != "call-1"  # Greenlight's own ref
    assert response["response"]["content"] == {
        "ok": False,
        "error": "denied by UBOSS: not this month",
    }
    await settle(service)
    assert ledger_tools.entries() == []


# -- who may decide --------------------------------------------------------------------------


async def test_self_approval_is_refused_privately_and_nothing_runs(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    status, _ = await client.click(team, REQUESTER, "approve", asked.card)
    assert status == 200
    (ephemeral,) = await fake_slack.wait_for("chat.postEphemeral")
    assert ephemeral.args["user"] == REQUESTER and ephemeral.args["channel"] == APPROVERS
    assert "You asked for this" in text_of(ephemeral)
    await settle(service)
    assert service.deps is not None
    [pending] = await service.deps.workflow.reads.pending(team)
    assert pending.id == asked.approval_id
    assert ledger_tools.entries() == []
    assert len(gemini.generate_requests()) == 1
    assert len(thread_posts(fake_slack, asked.thread_ts)) == 1  # just the placeholder
    assert not fake_slack.calls_to("chat.update") or all(
        "Approved by" not in json.dumps(c.args) for c in fake_slack.calls_to("chat.update")
    )


async def test_only_the_policys_approvers_may_decide(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    status, body = await client.command(team, ADMIN, "approvers transferMoney <@UBOSS|boss>")
    assert status == 200 and body.startswith("Done.") and "approvers: <@UBOSS>" in body

    asked = await ask(client, fake_slack, gemini, team)
    status, _ = await client.click(team, "UOTHER", "approve", asked.card)
    assert status == 200
    (ephemeral,) = await fake_slack.wait_for("chat.postEphemeral")
    assert ephemeral.args["user"] == "UOTHER"
    assert "not one of the approvers for `transferMoney`" in text_of(ephemeral)
    await settle(service)
    assert ledger_tools.entries() == []
    assert len(gemini.generate_requests()) == 1

    # The named approver still can.
    gemini.script(text("Done."))
    await client.click(team, BOSS, "approve", asked.card)
    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    assert text_of(reply) == "Done."
    assert len(ledger_tools.entries()) == 1


async def test_twenty_concurrent_approvals_run_the_tool_once(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    gemini.script(text("Sent."))  # one model reply: a second resume would run out of script
    approvers = [f"UAPPR{i:02d}" for i in range(20)]
    results = await asyncio.gather(
        *(client.click(team, u, "approve", asked.card) for u in approvers)
    )
    assert [status for status, _ in results] == [200] * 20

    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    await fake_slack.wait_for("chat.postEphemeral", count=19)
    await settle(service)

    assert text_of(reply) == "Sent."
    assert len(thread_posts(fake_slack, asked.thread_ts)) == 2  # placeholder + one reply
    assert len(ledger_tools.entries()) == 1
    assert len(gemini.function_responses()) == 1
    refused = fake_slack.calls_to("chat.postEphemeral")
    assert len(refused) == 19 and all("Already approved by" in text_of(c) for c in refused)
    assert service.deps is not None
    info = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert info is not None and isinstance(info.decision, Approved)
    decider = info.decision.by
    assert decider in approvers
    assert {c.args["user"] for c in refused} == set(approvers) - {decider}
    assert info.card is not None and info.card.ts is not None
    final = json.dumps(fake_slack.messages[info.card.ts]["blocks"])
    assert f"Approved by <@{decider}>" in final and '"approval"' not in final


@pytest.mark.parametrize("service_overrides", [{"DATABASE_POOL_SIZE": 2}])
async def test_more_conversations_than_connections_queue_for_the_pool(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Six conversations at once on a pool of two: each statement waits its turn for a
    connection (none is held while another is awaited), and no third one is ever opened."""
    used: set[int] = set()  # the pool's connections that statements were given
    pool = service._engine.sync_engine.pool
    event.listen(pool, "checkout", lambda _conn, record, _proxy: used.add(id(record)))
    people = [f"UEMP{i}" for i in range(6)]
    for _ in people:
        gemini.script(function_call("transferMoney", TRANSFER, id="call-1"))
    threads = {person: new_ts() for person in people}
    sent = await asyncio.gather(
        *(client.dm(team, person, "send 500 to 12345", ts=ts) for person, ts in threads.items())
    )
    assert [status for status, _ in sent] == [200] * 6
    cards = await fake_slack.wait_for("chat.postMessage", count=6, predicate=in_channel(APPROVERS))
    for _ in people:
        gemini.script(text("Sent."))
    clicked = await asyncio.gather(*(client.click(team, BOSS, "approve", c) for c in cards))
    assert [status for status, _ in clicked] == [200] * 6
    answers = await asyncio.gather(*(reply_in_thread(fake_slack, ts) for ts in threads.values()))
    assert [text_of(a) for a in answers] == ["Sent."] * 6
    await settle(service)
    assert len(ledger_tools.entries()) == 6  # each approved call ran, once
    assert len(used) <= 2


@pytest.mark.parametrize("service_overrides", [{"DATABASE_POOL_SIZE": 4}])
async def test_one_conversation_at_a_time_keeps_to_the_last_used_connections(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """After a burst filled the pool, one conversation's statements go to the connections
    used last (warm: their statements prepared and planned), not to each of the pool's in
    turn: it uses no more of them than were ever out at once (two where a statement
    overlaps another; three on a loaded machine, where the card's record, the click's
    read and a timer's statement can overlap)."""
    engine = service._engine
    async with contextlib.AsyncExitStack() as burst:  # the pool's four, all opened
        for _ in range(4):
            await burst.enter_async_context(engine.connect())
    used: set[int] = set()
    out: set[int] = set()
    peak = 0

    def checkout(_conn: Any, record: Any, _proxy: Any) -> None:
        nonlocal peak
        out.add(id(record))
        peak = max(peak, len(out))
        task = asyncio.current_task()
        if not (task and task.get_name() in LOOPS):  # a timer may take any meanwhile
            used.add(id(record))

    def checkin(_conn: Any, record: Any) -> None:
        out.discard(id(record))

    event.listen(engine.sync_engine.pool, "checkout", checkout)
    event.listen(engine.sync_engine.pool, "checkin", checkin)
    asked = await ask(client, fake_slack, gemini, team)
    gemini.script(text("Sent."))
    assert (await client.click(team, BOSS, "approve", asked.card))[0] == 200
    assert text_of(await reply_in_thread(fake_slack, asked.thread_ts)) == "Sent."
    await settle(service)
    assert peak < 4  # else any pool would pass
    assert len(used) <= peak  # a pool taking each of its connections in turn uses all four


# -- events ----------------------------------------------------------------------------------


async def test_a_retried_event_runs_the_agent_once(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(text("Hello there."))
    ts = new_ts()
    payload = sp.message_im_event(team, REQUESTER, DM, "hi", ts, event_id=f"Ev{team}")
    assert (await client.send(payload))[0] == 200
    retries = [
        client.send(payload, headers={"X-Slack-Retry-Num": n, "X-Slack-Retry-Reason": "timeout"})
        for n in ("1", "1", "2")  # Slack's retry, and a twin racing it
    ]
    assert [status for status, _ in await asyncio.gather(*retries)] == [200, 200, 200]

    done = await said(fake_slack, "Hello there.")
    await settle(service)
    assert done["thread_ts"] == ts
    assert len(gemini.generate_requests()) == 1
    assert len(thread_posts(fake_slack, ts)) == 1  # one placeholder, one turn
    assert [m["text"] for m in fake_slack.thread(DM, ts)] == ["Hello there."]


async def test_pings_from_the_model_or_tool_input_never_reach_slack_raw(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args={"amount": 5, "toAccount": NASTY})
    assert "&lt;!channel&gt;" in json.dumps(blocks_of(asked.card))
    gemini.script(text(f"Done, told {NASTY}"))
    await client.click(team, BOSS, "approve", asked.card)
    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    assert text_of(reply).startswith("Done, told &lt;!channel&gt; &lt;@U123&gt;")
    [entry] = ledger_tools.entries()
    assert entry["to"] == NASTY  # the tool itself gets the input as typed

    # A direct answer (no tool), streamed in pieces, is escaped as well.
    gemini.script(text("Sure ", NASTY, delay=0.0))
    ts = new_ts()
    await client.dm(team, REQUESTER, "ping everyone", ts=ts)
    await said(fake_slack, "Sure ", prefix=True)
    await settle(service)

    sent = [c for c in fake_slack.calls if c.method in TO_SLACK]
    assert len(sent) >= 6
    for call in sent:
        raw = json.dumps(call.args, ensure_ascii=False)
        for ping in PINGS:
            assert ping not in raw, f"{call.method} sent a raw {ping}: {raw[:300]}"


# -- /approvals ------------------------------------------------------------------------------


async def test_admin_allows_a_tool_and_it_then_runs_without_approval(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    status, body = await client.command(team, ADMIN, "allow getBalance")
    assert status == 200
    assert body.startswith("Done.") and "`getBalance` — runs freely" in body

    gemini.script(function_call("getBalance", {"account": "A1"}), text("Your balance is 100."))
    ts = new_ts()
    await client.dm(team, REQUESTER, "what's my balance?", ts=ts)
    await said(fake_slack, "Your balance is 100.")
    await settle(service)
    assert ledger_tools.entries() == [{"tool": "getBalance", "account": "A1"}]
    assert not [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)]
    assert gemini.function_responses()[0]["response"]["content"]["balance"] == 100.0


async def test_non_admins_cannot_change_policy(
    client: SlackClient, fake_slack: FakeSlack, team: str, service: Service
) -> None:
    status, body = await client.command(team, REQUESTER, "allow transferMoney")
    assert status == 200 and "Only workspace admins" in body
    (lookup,) = fake_slack.calls_to("users.info")
    assert lookup.args["user"] == REQUESTER

    _, listing = await client.command(team, REQUESTER, "list")
    (line,) = [ln for ln in listing.splitlines() if "`transferMoney`" in ln]
    assert "needs approval" in line
    _, trail = await client.command(team, ADMIN, "audit")
    assert trail == "The audit trail is empty."


async def test_unknown_tool_help_pending_and_audit(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    _, body = await client.command(team, ADMIN, "allow launchRockets")
    assert body == (
        "There is no tool `launchRockets`. Known tools: `askHuman`, `getBalance`, `transferMoney`"
    )

    _, help_text = await client.command(team, REQUESTER, "help")
    assert help_text.startswith("*`/approvals`*") and "`allow <tool>`" in help_text
    assert (await client.command(team, REQUESTER, ""))[1] == help_text
    _, unknown = await client.command(team, REQUESTER, "frobnicate")
    assert unknown.startswith("I don't know `frobnicate`.") and help_text in unknown

    assert (await client.command(team, REQUESTER, "pending"))[1] == (
        "Nothing is waiting for approval."
    )
    await client.command(team, ADMIN, "timeout transferMoney 4h")
    await ask(client, fake_slack, gemini, team)
    _, pending = await client.command(team, REQUESTER, "pending")
    assert pending.startswith("• `transferMoney` for <@UEMP>, asked <!date^")
    assert pending.endswith("in <#C0APPROVE>")

    _, trail = await client.command(team, REQUESTER, "audit")
    lines = trail.splitlines()
    assert len(lines) == 2
    assert any("requested `transferMoney` by <@UEMP>" in ln for ln in lines)
    assert any("policy_changed `transferMoney` by <@UADMIN>" in ln for ln in lines)
    _, filtered = await client.command(team, REQUESTER, "audit getBalance")
    assert filtered == "The audit trail is empty."


# -- transport -------------------------------------------------------------------------------


async def test_forged_or_stale_requests_are_rejected_and_change_nothing(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
) -> None:
    at_start = len(fake_slack.calls)  # the start-up check of the approver channel
    event_id = f"Ev{team}"
    payload = sp.message_im_event(team, REQUESTER, DM, "send 500", new_ts(), event_id=event_id)
    forged = {"X-Slack-Signature": "v0=" + "0" * 64}
    assert (await client.send(payload, headers=forged))[0] == 401
    assert (await client.send(payload, secret="someone-elses-secret"))[0] == 401
    stale = int(time.time()) - 6 * 60
    assert (await client.send(payload, timestamp=stale))[0] == 401
    approve = sp.block_actions(
        team, BOSS, APPROVERS, "1.2", "approve", "0" * 36, "t", fake_slack.response_url()
    )
    assert (await client.send(approve, timestamp=stale))[0] == 401
    command = sp.slash_command(
        team, ADMIN, "/approvals", "allow getBalance", "C1", fake_slack.response_url(), "t"
    )
    assert (await client.send(command, headers=forged))[0] == 401

    await settle(service)
    assert fake_slack.calls[at_start:] == [] and gemini.requests == []
    async with bot_sessions() as db:
        assert await db.scalar(select(func.count()).where(ConversationRow.team_id == team)) == 0
        seen = select(func.count()).where(SeenEventRow.event_id == event_id)
        assert await db.scalar(seen) == 0
    _, listing = await client.command(team, REQUESTER, "list")
    assert "`getBalance` — needs approval" in listing


async def test_ack_is_immediate_while_the_model_is_slow(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    gemini.script(text("Finally.", delay=6))
    ts = new_ts()
    started = time.perf_counter()
    status, _ = await client.dm(team, REQUESTER, "take your time", ts=ts)
    elapsed = time.perf_counter() - started
    assert status == 200 and elapsed < ACK_DEADLINE, f"acknowledged after {elapsed:.2f}s"
    await fake_slack.wait_for("chat.postMessage", predicate=in_channel(DM, ts))  # placeholder
    reply = await said(fake_slack, "Finally.")
    assert reply["thread_ts"] == ts


@pytest.fixture
async def one_slot(
    fake_slack: FakeSlack, gemini: FakeGemini, ledger: Path, bot_database: str
) -> AsyncIterator[SlackClient]:
    """A bot that works on one thing at a time."""
    settings = bot_settings(fake_slack, gemini, DATABASE_URL=bot_database, MAX_CONCURRENT_TURNS=1)
    svc = Service(settings, host="127.0.0.1")
    await svc.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield SlackClient(http, svc, fake_slack)
    finally:
        await svc.stop()


async def test_a_turn_waiting_on_the_model_gives_its_slot_to_the_next(
    one_slot: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    gemini.script(text("first", delay=3), text("second"))
    assert (await one_slot.dm(team, REQUESTER, "one", ts=new_ts()))[0] == 200
    await poll(lambda: len(gemini.generate_requests()) == 1, "the first model call")
    assert (await one_slot.dm(team, REQUESTER, "two", ts=new_ts()))[0] == 200
    await said(fake_slack, "first")
    answers = replies(fake_slack)
    assert answers.index("second") < answers.index("first")


async def test_a_turn_waiting_for_a_free_slot_shows_progress_at_once(
    one_slot: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    gemini.script(text("first"), text("second"))
    # The first turn keeps its slot while Slack is slow to take its answer.
    fake_slack.delays["chat.update"] = 2
    first, second = new_ts(), new_ts()
    assert (await one_slot.dm(team, REQUESTER, "one", ts=first))[0] == 200
    await poll(lambda: len(gemini.generate_requests()) == 1, "the first model call")
    assert (await one_slot.dm(team, REQUESTER, "two", ts=second))[0] == 200
    # The second thread shows progress while its turn waits for the only slot.
    await fake_slack.wait_for("chat.postMessage", predicate=in_channel(DM, second))
    assert len(gemini.generate_requests()) == 1
    await said(fake_slack, "second")
    assert replies(fake_slack) == ["first", "second"]  # in order, one at a time


async def test_a_turn_told_to_wait_by_slack_gives_its_slot_to_the_next(
    one_slot: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    """A 429 is waited out (per Retry-After) without the work slot."""
    gemini.script(text("first"), text("second"))
    fake_slack.fail_next("chat.update", status=429, retry_after=2)
    assert (await one_slot.dm(team, REQUESTER, "one", ts=new_ts()))[0] == 200
    await fake_slack.wait_for("chat.update", include_injected=True)
    assert (await one_slot.dm(team, REQUESTER, "two", ts=new_ts()))[0] == 200
    await said(fake_slack, "first")
    assert replies(fake_slack) == ["second", "first"]  # answered during the first's wait


async def test_healthz(client: SlackClient) -> None:
    assert await client.get("/healthz") == (200, {"ok": True})


async def test_healthz_reports_an_unreachable_database(
    fake_slack: FakeSlack, gemini: FakeGemini, ledger: Path
) -> None:
    nowhere = "postgresql+asyncpg://postgres@127.0.0.1:1/nowhere"
    svc = Service(bot_settings(fake_slack, gemini, DATABASE_URL=nowhere), host="127.0.0.1")
    await svc.start()
    try:
        async with aiohttp.ClientSession() as http:
            status, body = await SlackClient(http, svc, fake_slack).get("/healthz")
    finally:
        await svc.stop()
    assert (status, body) == (503, {"ok": False, "database": "unreachable"})


async def test_url_verification_echoes_the_challenge(client: SlackClient) -> None:
    status, body = await client.send(sp.url_verification("xyzzy"))
    assert (status, json.loads(body)) == (200, {"challenge": "xyzzy"})


def test_http_mode_without_a_signing_secret_refuses_to_start(
    fake_slack: FakeSlack, gemini: FakeGemini
) -> None:
    """Bolt would otherwise take unsigned requests as Slack's (verification off)."""
    with pytest.raises(ConfigError, match="SLACK_SIGNING_SECRET"):
        Service(bot_settings(fake_slack, gemini, SLACK_SIGNING_SECRET=None))


async def test_the_requester_is_looked_up_while_the_model_thinks(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    """A card says whether its requester is a guest: users.info is asked as the turn starts,
    beside the model's call, not after it (once: the card shares that lookup)."""
    gemini.script(function_call("transferMoney", TRANSFER, id="call-1", delay=3.0))
    assert (await client.dm(team, REQUESTER, "send 500 to 12345", ts=new_ts()))[0] == 200
    asked = await fake_slack.wait_for(
        "users.info", timeout=2.0, predicate=lambda c: c.args.get("user") == REQUESTER
    )  # before the model answers, 3 s in
    cards = [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)]
    assert asked and not cards
    await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    by_requester = [c for c in fake_slack.calls_to("users.info") if c.args.get("user") == REQUESTER]
    assert len(by_requester) == 1
