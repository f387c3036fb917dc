"""Issue 13: reminders and escalation, once each, whichever replica gets there first."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.server import Service
from storage.db import SessionFactory
from storage.domain import CardState
from storage.models import ApprovalRow
from tests.bot.conftest import APPROVERS, SlackClient, bot_settings, in_channel, policy_file, settle
from tests.bot.test_e2e import ask, text_of
from tests.bot.test_trust import sweep
from tests.conftest import poll
from tests.fakes.gemini import FakeGemini, text
from tests.fakes.slack_api import FakeSlack

LEADS = "C0LEADS"
POLICY = f"""\
tools:
  transferMoney:
    approvers: [UCFO, S0TREASURY]
    remind_after: 1s
    escalate_after: 2s
    escalate_to: {LEADS}
"""


@pytest.fixture
def service_overrides(tmp_path: Path, fake_slack: FakeSlack, team: str) -> dict[str, Any]:
    fake_slack.channels[LEADS] = {"is_private": True}  # its members decide once escalated
    return policy_file(fake_slack, team, tmp_path / "policy.yml", POLICY)


@pytest.fixture
async def replica(
    fake_slack: FakeSlack, gemini: FakeGemini, bot_database: str, service_overrides: dict[str, Any]
) -> AsyncIterator[Service]:
    """A second process on the same database and Slack."""
    settings = bot_settings(fake_slack, gemini, DATABASE_URL=bot_database, **service_overrides)
    svc = Service(settings, host="127.0.0.1")
    await svc.start()
    yield svc
    await svc.stop()


async def follow_ups(*services: Service) -> None:
    """What each replica's loop does, all at once."""

    async def one(svc: Service) -> None:
        assert svc.deps is not None and svc.app is not None
        due = await svc.deps.workflow.follow_ups.due()
        await svc.deps.delivery.follow_ups(svc.app.client, due)

    await asyncio.gather(*(one(s) for s in services))


def reminders(fake_slack: FakeSlack) -> list[str]:
    return [
        text_of(c) for c in fake_slack.calls_to("chat.postMessage") if "still waits" in text_of(c)
    ]


async def test_reminder_and_escalation_happen_once_across_replicas_and_a_restart(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    replica: Service,
    service_overrides: dict[str, Any],
    bot_database: str,
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None and approval.escalation is not None
    due = approval.escalation.at.timestamp()
    await poll(lambda: time.time() > due, "the escalation's time")
    await follow_ups(service, replica, service, replica)
    await settle(service)

    # The reminder: once, in the card's thread, naming the approvers; a DM to each user.
    [reminder] = reminders(fake_slack)
    assert "<@UCFO> <!subteam^S0TREASURY>:" in reminder
    [in_thread] = [
        c for c in fake_slack.calls_to("chat.postMessage") if "still waits" in text_of(c)
    ]
    assert in_thread.args["channel"] == APPROVERS and in_thread.args["thread_ts"]
    dms = [c for c in fake_slack.calls_to("chat.postMessage") if c.args.get("channel") == "UCFO"]
    assert len(dms) == 1 and "waiting for your decision" in text_of(dms[0])
    # The escalation: once, the card in the leads' channel too.
    escalated = [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(LEADS)(c)]
    assert len(escalated) == 1

    # A restart: a new process owes nothing that was done.
    settings = bot_settings(fake_slack, gemini, DATABASE_URL=bot_database, **service_overrides)
    restarted = Service(settings, host="127.0.0.1")
    await restarted.start()
    try:
        posts = len(fake_slack.calls_to("chat.postMessage"))
        await follow_ups(restarted, service)
        assert len(fake_slack.calls_to("chat.postMessage")) == posts
    finally:
        await restarted.stop()

    # Escalated: a member of the leads' channel may decide, and both cards show it.
    leads_card = escalated[0]
    # The escalated card carries the same context, and the leads may see the conversation.
    assert "asked:*\\n&gt; send 500 to 12345" in json.dumps(leads_card.args["blocks"])
    await client.click(team, "ULEAD", "show_conversation", leads_card, channel=LEADS)
    await fake_slack.wait_for("views.open")
    gemini.script(text("Sent."))
    assert (await client.click(team, "ULEAD", "approve", leads_card, channel=LEADS))[0] == 200
    updates = await fake_slack.wait_for(
        "chat.update",
        count=2,
        predicate=lambda c: "Approved by <@ULEAD>" in json.dumps(c.args.get("blocks")),
    )
    assert {u.args["channel"] for u in updates} == {APPROVERS, LEADS}
    await settle(service)


async def test_the_loop_reminds_within_seconds_of_the_time(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    await ask(client, fake_slack, gemini, team)
    started = time.monotonic()
    await poll(lambda: len(reminders(fake_slack)) == 1, "the reminder", timeout=15)
    assert time.monotonic() - started < 1 + 10  # due after 1 s, done within 10 s of that


# -- Issue 21 §8: a failed escalation post is retried through the card's outbox ----------------


def leads_cards(fake_slack: FakeSlack) -> list[str]:
    """The live messages in the leads' channel (cards: nothing else is posted there)."""
    return [ts for ts, m in fake_slack.messages.items() if m.get("channel") == LEADS]


async def escalation_left_behind(sessions: SessionFactory, approval_id: str) -> None:
    """As if the escalated card's post was tried a while ago (past the outbox's grace)."""
    async with sessions.begin() as db:
        row = await db.get_one(ApprovalRow, approval_id)
        assert row.escalation_card == CardState.POSTING and row.escalation_ts is None
        row.escalation_attempted_at = datetime.now(UTC) - timedelta(minutes=5)


@pytest.mark.parametrize("reached_slack", [False, True])
async def test_a_failed_escalation_post_is_retried_once_leaving_one_live_card(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
    reached_slack: bool,
) -> None:
    """The escalated card's post fails once (Slack's internal error; with `reached_slack`,
    after Slack had posted it): nothing is lost, and one sweep finishes it, once."""
    original = fake_slack.handlers["chat.postMessage"]
    failed: list[dict[str, Any]] = []

    def fail_once_in_leads(args: dict[str, Any]) -> dict[str, Any]:
        if args.get("channel") == LEADS and not failed:
            failed.append(args)
            if reached_slack:
                original(args)  # posted; its answer is what fails
            return {"ok": False, "error": "internal_error"}
        return original(args)

    fake_slack.handlers["chat.postMessage"] = fail_once_in_leads
    asked = await ask(client, fake_slack, gemini, team)
    await poll(lambda: bool(failed), "the escalation's post")  # the service's own loop
    await settle(service)
    assert service.deps is not None
    now = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert now is not None and now.escalated and now.escalation is not None
    assert now.escalation.card == CardState.POSTING and now.escalation.ts is None
    assert len(leads_cards(fake_slack)) == (1 if reached_slack else 0)

    await escalation_left_behind(bot_sessions, asked.approval_id)
    await sweep(service, team)
    await sweep(service, team)  # and again: nothing more
    await settle(service)
    now = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert now is not None and now.escalation is not None
    assert now.escalation.card == CardState.POSTED
    assert leads_cards(fake_slack) == [now.escalation.ts]  # one live card, the one recorded
    posts = [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(LEADS)(c)]
    assert len(posts) == (1 if reached_slack else 2)  # found in the channel, or posted again
    # The first card says it was escalated; the leads' card decides like the first.
    gemini.script(text("Sent."))
    leads_card = posts[-1] if not reached_slack else posts[0]
    assert (await client.click(team, "ULEAD", "approve", leads_card, channel=LEADS))[0] == 200
    await fake_slack.wait_for(
        "chat.update",
        count=2,
        predicate=lambda c: "Approved by <@ULEAD>" in json.dumps(c.args.get("blocks")),
    )
    await settle(service)


async def test_a_second_post_of_a_card_already_recorded_is_deleted(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Two attempts at one escalated card that both reached Slack (a slow post and a
    sweep's retry): the one recorded second is deleted at once."""
    asked = await ask(client, fake_slack, gemini, team)
    await poll(lambda: len(leads_cards(fake_slack)) == 1, "the escalated card")
    await settle(service)
    assert service.deps is not None and service.app is not None
    reads = service.deps.workflow.reads

    async def recorded() -> bool:  # the post is in Slack before its ts is in the database
        now = await reads.approval(team, asked.approval_id)
        return now is not None and now.escalation is not None and now.escalation.ts is not None

    await poll(recorded, "the escalated card recorded")
    now = await reads.approval(team, asked.approval_id)
    assert now is not None and now.escalation is not None and now.escalation.ts is not None
    delivery = service.deps.delivery
    kept = await delivery._post(service.app.client, now, LEADS, None, escalated=True)
    assert kept == now.escalation.ts  # the recorded card's
    assert leads_cards(fake_slack) == [now.escalation.ts]
    assert len(fake_slack.calls_to("chat.delete")) == 1
