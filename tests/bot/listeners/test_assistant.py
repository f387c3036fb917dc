"""Assistant threads (Slack's AI app panel): prompts when one opens, the status line while the
agent works or waits, a title from the first message, and the channel the employee has open."""

from __future__ import annotations

import json

import pytest

from bot.server import Service
from tests.bot.conftest import APPROVERS, SlackClient, in_channel, new_ts, settle
from tests.bot.test_e2e import BOSS, REQUESTER, TRANSFER, said
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import FakeSlack

PANEL = "D0PANEL"  # the app's DM, where assistant threads live


def statuses(fake_slack: FakeSlack, thread_ts: str) -> list[str]:
    return [
        str(c.args["status"])
        for c in fake_slack.calls_to("assistant.threads.setStatus")
        if c.args.get("thread_ts") == thread_ts
    ]


async def message(client: SlackClient, team: str, thread_ts: str, words: str) -> None:
    event = sp.message_im_event(team, REQUESTER, PANEL, words, new_ts(), thread_ts=thread_ts)
    assert (await client.send(event))[0] == 200


@pytest.mark.parametrize(
    "service_overrides",
    [{"ASSISTANT_PROMPTS": ["Check my balance", {"title": "Pay", "message": "Pay 5 to 1"}]}],
)
async def test_a_new_thread_offers_the_configured_prompts(
    client: SlackClient, fake_slack: FakeSlack, team: str, service: Service
) -> None:
    thread = new_ts()
    started = sp.assistant_thread_event("assistant_thread_started", team, REQUESTER, PANEL, thread)
    assert (await client.send(started))[0] == 200
    (offered,) = await fake_slack.wait_for("assistant.threads.setSuggestedPrompts")
    assert offered.args["channel_id"] == PANEL and offered.args["thread_ts"] == thread
    assert offered.args["prompts"] == [
        {"title": "Check my balance", "message": "Check my balance"},
        {"title": "Pay", "message": "Pay 5 to 1"},
    ]


async def test_a_thread_shows_thinking_is_titled_once_and_replies_without_a_placeholder(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    thread = new_ts()
    gemini.script(text("Hello!"), text("Still here."))
    first = "  What can\n you   do for me today, in a few words please?  "
    await message(client, team, thread, first)
    await said(fake_slack, "Hello!", PANEL)
    await settle(service)
    await message(client, team, thread, "and now?")
    await said(fake_slack, "Still here.", PANEL)
    await settle(service)

    assert statuses(fake_slack, thread) == ["is thinking…", "is thinking…"]
    (titled,) = fake_slack.calls_to("assistant.threads.setTitle")  # the first message only
    assert titled.args["title"] == "What can you do for me today, in a few words please?"
    # The status line, not a placeholder: the replies are the only posts.
    assert [c.args["text"] for c in fake_slack.calls_to("chat.postMessage")] == [
        "Hello!",
        "Still here.",
    ]


async def test_a_paused_thread_says_where_it_waits_for_approval(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.channels[APPROVERS] = {"is_private": True, "name": "finance"}
    thread = new_ts()
    gemini.script(function_call("transferMoney", TRANSFER, id="call-1"))
    await message(client, team, thread, "send 500 to 12345")
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    await settle(service)
    assert statuses(fake_slack, thread) == ["is thinking…", "is waiting for approval in #finance"]

    gemini.script(text("Sent."))
    assert (await client.click(team, BOSS, "approve", card))[0] == 200
    await said(fake_slack, "Sent.", PANEL)
    await settle(service)
    assert statuses(fake_slack, thread)[-1] == "is thinking…"  # the resume, until it replies


async def test_the_channel_the_employee_has_open_is_told_to_the_agent(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    thread = new_ts()
    for kind, channel in (
        ("assistant_thread_started", "C0GENERAL"),
        ("assistant_thread_context_changed", "C0INCIDENT"),
    ):
        event = sp.assistant_thread_event(kind, team, REQUESTER, PANEL, thread, channel)
        assert (await client.send(event))[0] == 200
    await settle(service)
    gemini.script(text("Looking."))
    await message(client, team, thread, "what is going on here?")
    await said(fake_slack, "Looking.", PANEL)
    request = json.dumps(gemini.generate_requests()[0].json)
    assert "looking at channel <#C0INCIDENT>" in request and "C0GENERAL" not in request
    assert "what is going on here?" in request


async def test_malformed_assistant_events_change_nothing(
    client: SlackClient, fake_slack: FakeSlack, team: str, service: Service
) -> None:
    bad = sp.assistant_thread_event(
        "assistant_thread_started", team, REQUESTER, "not a channel", "x"
    )
    assert (await client.send(bad))[0] == 200
    await settle(service)
    assert not fake_slack.calls_to("assistant.threads.setSuggestedPrompts")
