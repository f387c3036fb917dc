"""`/approvals` called as the function it is, with the running service's own deps, and over
HTTP where what matters is when Slack gets its acknowledgement."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest
import sqlalchemy as sa
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond

from bot.listeners.commands import SUBCOMMANDS, on_command
from bot.server import Service
from storage.db import SessionFactory
from storage.models import AuditRow
from tests.bot.conftest import ACK_DEADLINE, ADMIN, SlackClient
from tests.fakes import slack_payloads as sp
from tests.fakes.slack_api import FakeSlack


async def run(service: Service, slack: FakeSlack, team: str, user: str, text: str) -> str:
    """The reply: the acknowledgement's own text, else what came to the response_url."""
    assert service.deps is not None and service.app is not None
    name = f"direct-{uuid.uuid4().hex}"
    ack = AsyncAck()  # type: ignore[no-untyped-call]
    respond = AsyncRespond(response_url=slack.response_url(name))
    body = {"team_id": team, "user_id": user, "text": text}
    await on_command(
        ack=ack, body=body, client=service.app.client, respond=respond, deps=service.deps
    )
    assert ack.response is not None and ack.response.status == 200
    if ack.response.body:
        return str(ack.response.body)  # a text-only ack is the text itself
    [answer] = await slack.wait_for(f"response_url:{name}")
    assert answer.args["response_type"] == "ephemeral"
    return str(answer.args["text"])


async def test_each_subcommand_answers_through_the_table(
    service: Service, fake_slack: FakeSlack, team: str
) -> None:
    assert set(SUBCOMMANDS) == {
        "list", "pending", "audit", "rules", "explain", "help", "allow", "require", "route",
        "approvers",
        "timeout", "keys",
    }  # fmt: skip

    async def say(user: str, text: str) -> str:
        return await run(service, fake_slack, team, user, text)

    assert "`transferMoney` — needs approval" in await say("UASK", "list")
    assert await say("UASK", "pending") == "Nothing is waiting for approval."
    assert (await say(ADMIN, "allow getBalance")).startswith("Done.")
    assert "`getBalance` — runs freely" in await say("UASK", "list")
    assert "policy_changed `getBalance` by <@UADMIN>" in await say("UASK", "audit")
    assert (await say("UASK", "frobnicate")).startswith("I don't know `frobnicate`")
    assert (await say("UASK", "")).startswith("*`/approvals`*")  # help
    assert await say("bad id", "list") == "I couldn't read that command."


@pytest.mark.parametrize("slack_is", ["slow", "rate-limited"])
async def test_the_command_is_acknowledged_at_once_when_slack_is_slow(
    client: SlackClient, fake_slack: FakeSlack, team: str, slack_is: str
) -> None:
    """The admin look-up takes over Slack's 3 seconds; the ack must not wait for it, and the
    answer comes by the response_url (before, the admin saw operation_timeout although the
    change was made)."""
    fake_slack.users["UOWNER"] = {"is_owner": True}  # an admin only Slack knows of
    if slack_is == "slow":
        fake_slack.delays["users.info"] = 3.5
    else:
        fake_slack.fail_next("users.info", status=429, retry_after=2, times=2)
    name = f"owner-{uuid.uuid4().hex}"
    payload = sp.slash_command(
        team, "UOWNER", "/approvals", "allow getBalance", "C0GENERAL",
        fake_slack.response_url(name), "trigger-owner",
    )  # fmt: skip
    started = time.monotonic()
    status, body = await client.send(payload)
    acked = time.monotonic() - started
    assert status == 200 and body == "" and acked < ACK_DEADLINE, (status, body, acked)

    [answer] = await fake_slack.wait_for(f"response_url:{name}")
    assert time.monotonic() - started > 3.0  # it did wait on Slack, after the ack
    assert str(answer.args["text"]).startswith("Done.") and "runs freely" in answer.args["text"]
    assert "`getBalance` — runs freely" in (await client.command(team, "UASK", "list"))[1]


async def test_pending_and_audit_come_a_page_at_a_time(
    client: SlackClient, team: str, bot_sessions: SessionFactory
) -> None:
    at = datetime.now(UTC)
    rows: list[dict[str, object]] = [
        {
            "team_id": team,
            "at": at - timedelta(minutes=i),
            "actor": "UADMIN",
            "action": f"event{i:02d}",
            "tool": "getBalance",
            "approval_id": None,
            "detail": {},
        }
        for i in range(45)
    ]
    async with bot_sessions() as db, db.begin():
        await db.execute(sa.insert(cast(sa.Table, AuditRow.__table__)), rows)

    _, first = await client.command(team, "UASK", "audit")
    lines = first.splitlines()
    assert len(lines) == 21 and "event00" in lines[0] and "event19" in lines[19]
    assert lines[20] == "_Page 1. Next: `/approvals audit 2`_"
    _, second = await client.command(team, "UASK", "audit getBalance 2")
    assert "event20" in second.splitlines()[0]
    assert second.splitlines()[-1] == "_Page 2. Next: `/approvals audit getBalance 3`_"
    _, last = await client.command(team, "UASK", "audit 3")
    assert len(last.splitlines()) == 6 and last.endswith("_Page 3, the last._")
    assert (await client.command(team, "UASK", "audit 4"))[1] == "Page 4 is empty."
    assert (await client.command(team, "UASK", "audit exportData"))[1] == (
        "The audit trail is empty."
    )
    assert (await client.command(team, "UASK", "audit 0"))[1].startswith("Pages run from 1")
    assert (await client.command(team, "UASK", "audit a b"))[1].startswith("Usage:")

    assert (await client.command(team, "UASK", "pending 2"))[1] == "Page 2 is empty."
    assert (await client.command(team, "UASK", "pending soon"))[1].startswith("Usage:")
