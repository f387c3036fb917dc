"""Issue 13: reminders and escalation, once each, whichever replica gets there first."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.server import Service
from tests.bot.conftest import APPROVERS, SlackClient, bot_settings, in_channel, policy_file, settle
from tests.bot.test_e2e import ask, text_of
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
