"""Approvers decide with context (issue 17): the request, the agent's words, the conversation,
and where each value came from. Against the real service, fake Slack and Gemini, PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import (
    ADMIN,
    APPROVERS,
    DM,
    SlackClient,
    in_channel,
    new_ts,
    policy_file,
    settle,
)
from tests.bot.test_e2e import BOSS, REQUESTER, decided_card, reply_in_thread, said, text_of
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, call, calls, function_call, text
from tests.fakes.slack_api import Call, FakeSlack


def field(card: Call, name: str) -> str:
    """The text of the card's input field `name`."""
    for block in card.args["blocks"]:
        for f in block.get("fields", []):
            if f["text"].startswith(f"*{name}*"):
                return str(f["text"])
    raise AssertionError(f"no field {name} on the card")


def shown(card: Call) -> str:
    return json.dumps(card.args["blocks"], ensure_ascii=False)


async def test_the_card_quotes_the_request_and_the_agents_words_escaped(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(
        calls(
            [
                {"text": "Sending the rent <!here> now."},
                call("transferMoney", {"amount": 500, "toAccount": "12345"}, id="c1"),
            ]
        )
    )
    card = await client.dm_until_card(
        team, REQUESTER, "Please send 500 to account 12345 for rent <!channel>"
    )
    blocks = shown(card)
    assert f"*<@{REQUESTER}> asked:*\\n&gt; Please send 500 to account 12345 for rent" in blocks
    assert "&lt;!channel&gt;" in blocks and "<!channel>" not in blocks
    assert "*The agent said before the call:*\\n&gt; Sending the rent &lt;!here&gt; now." in blocks
    # Both values were typed by the employee: nothing flagged.
    assert "🔎" not in field(card, "amount") + field(card, "toAccount")
    assert f"<@{REQUESTER}>: no requests in the last 30 days" in blocks


async def test_a_value_nobody_typed_is_flagged_and_one_from_a_tool_names_it(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    assert (await client.command(team, ADMIN, "allow getBalance"))[1].startswith("Done.")
    gemini.script(
        function_call("getBalance", {"account": "savings"}, id="c0"),
        function_call("transferMoney", {"amount": 100, "toAccount": "66666"}, id="c1"),
    )
    card = await client.dm_until_card(team, REQUESTER, "move my savings balance to my landlord")
    assert "🔎 _from getBalance's result_" in field(card, "amount")  # getBalance said 100.0
    assert "🔎 _not in the conversation_" in field(card, "toAccount")  # the model's own
    assert service.deps is not None
    [pending] = await service.deps.workflow.reads.pending(team)
    sources = pending.request.context.sources
    assert (sources["amount"].origin, sources["amount"].tool) == ("tool", "getBalance")
    assert sources["toAccount"].origin == "model"


async def test_show_conversation_is_for_approvers_only_and_audited(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    assert (await client.command(team, ADMIN, f"approvers transferMoney <@{BOSS}>"))[0] == 200
    gemini.script(
        calls(
            [
                {"text": "On it."},
                call("transferMoney", {"amount": 500, "toAccount": "12345"}, id="c1"),
            ]
        )
    )
    card = await client.dm_until_card(team, REQUESTER, "send 500 to 12345 <@UCEO>")
    assert service.deps is not None

    # A colleague of the requester who is not an approver: refused, privately, not audited.
    assert (await client.click(team, "UCOLLEAGUE", "show_conversation", card))[0] == 200
    (refused,) = await fake_slack.wait_for("chat.postEphemeral")
    assert refused.args["user"] == "UCOLLEAGUE"
    assert "Only the people who may decide `transferMoney`" in text_of(refused)
    # The requester may not decide either.
    assert (await client.click(team, REQUESTER, "show_conversation", card))[0] == 200
    await fake_slack.wait_for("chat.postEphemeral", count=2)
    await settle(service)
    assert fake_slack.calls_to("views.open") == []

    assert (await client.click(team, BOSS, "show_conversation", card))[0] == 200
    (opened,) = await fake_slack.wait_for("views.open")
    modal = json.dumps(opened.args["view"], ensure_ascii=False)
    assert "send 500 to 12345 &lt;@UCEO&gt;" in modal and "<@UCEO>" not in modal
    assert f"*<@{REQUESTER}>*" in modal  # who wrote it
    assert "On it.\\n→ calls transferMoney" in modal
    await settle(service)
    trail = [(e.action, e.actor) for e in await service.deps.workflow.reads.audit_trail(team)]
    assert ("conversation_viewed", BOSS) in trail
    assert [a for a in trail if a[0] == "conversation_viewed"] == [("conversation_viewed", BOSS)]

    # After the decision the approver (or an auditor among the approvers) may still look.
    gemini.script(text("Sent."))
    await client.click(team, BOSS, "approve", card)
    await fake_slack.wait_for("chat.update", predicate=decided_card("Approved by"))
    await client.click(team, BOSS, "show_conversation", card)
    await fake_slack.wait_for("views.open", count=2)
    await settle(service)


async def test_a_long_conversation_pages_and_each_page_is_checked_again(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Seven messages of 7,000 characters do not fit one view: the modal pages, and every
    word is on some page."""
    thread = new_ts()
    words = [f"w{i}-" + "a" * 7000 for i in range(7)]
    for i, message in enumerate(words):
        gemini.script(text(f"Noted {i}."))
        ts, parent = (thread, None) if i == 0 else (new_ts(), thread)
        event = sp.message_im_event(team, REQUESTER, DM, message, ts, thread_ts=parent)
        assert (await client.send(event))[0] == 200
        await said(fake_slack, f"Noted {i}.")
        await settle(service)  # the reply shows while the turn is saved: then the thread is free
    gemini.script(function_call("transferMoney", {"amount": 1, "toAccount": "2"}))
    event = sp.message_im_event(team, REQUESTER, DM, "now pay 1 to 2", new_ts(), thread_ts=thread)
    assert (await client.send(event))[0] == 200
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    await client.click(team, BOSS, "show_conversation", card)
    (opened,) = await fake_slack.wait_for("views.open")
    view = opened.args["view"]
    assert len(view["blocks"]) <= 100
    assert all(len(b.get("text", {}).get("text", "")) <= 3000 for b in view["blocks"])
    assert "Page 1 of" in json.dumps(view)
    (later,) = [
        e["value"]
        for b in view["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == "conversation_page"
    ]

    # Someone who may not decide (here the requester) cannot page their way in.
    view_id = f"V{len(fake_slack.calls_to('views.open')):08d}"
    press = sp.view_block_actions(
        team, REQUESTER, {**view, "id": view_id}, "conversation_page", later
    )
    assert (await client.send(press))[0] == 200
    await settle(service)
    assert fake_slack.calls_to("views.update") == []

    press = sp.view_block_actions(team, BOSS, {**view, "id": view_id}, "conversation_page", later)
    assert (await client.send(press))[0] == 200
    (updated,) = await fake_slack.wait_for("views.update")
    assert updated.args["view_id"] == view_id and "Page 2 of" in json.dumps(updated.args)
    everything = json.dumps(view) + json.dumps(updated.args["view"])
    assert all(w[:40] in everything for w in words)
    await settle(service)


async def test_the_requesters_history_is_on_the_next_card(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(function_call("transferMoney", {"amount": 5, "toAccount": "1"}))
    card = await client.dm_until_card(team, REQUESTER, "pay 5 to 1")
    gemini.script(text("Paid."))
    await client.click(team, BOSS, "approve", card)
    await said(fake_slack, "Paid.")
    await settle(service)
    fake_slack.calls.clear()

    gemini.script(function_call("transferMoney", {"amount": 7, "toAccount": "1"}))
    again = await client.dm_until_card(team, REQUESTER, "pay 7 to 1")
    assert f"<@{REQUESTER}>: 1 approved in the last 30 days" in shown(again)
    assert field(again, "amount")  # the card is otherwise the same
    await settle(service)


POLICY = """\
tools:
  transferMoney:
    rules:
      - when: 'provenance.toAccount != "human"'
        approvals: 1
      - when: "true"
        allow: true
"""


@pytest.fixture
def service_overrides(
    request: pytest.FixtureRequest, tmp_path: Path, fake_slack: FakeSlack, team: str
) -> dict[str, Any]:
    """POLICY_FILE for the tests that ask for "policy"; nothing for the others."""
    if getattr(request, "param", None) != "policy":
        return {}
    return policy_file(fake_slack, team, tmp_path / "policy.yml", POLICY)


@pytest.mark.parametrize("service_overrides", ["policy"], indirect=True)
async def test_a_provenance_rule_holds_an_otherwise_allowed_call(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    # Typed by the employee: the second rule allows it, no card.
    gemini.script(function_call("transferMoney", {"amount": 5, "toAccount": "12345"}), text("Ok."))
    thread = new_ts()
    assert (await client.dm(team, REQUESTER, "send 5 to 12345", ts=thread))[0] == 200
    await said(fake_slack, "Ok.")
    assert [e["to"] for e in ledger_tools.entries()] == ["12345"]
    assert [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)] == []

    # An account the model came up with: the first rule matches, a human must approve.
    gemini.script(function_call("transferMoney", {"amount": 5, "toAccount": "99999"}))
    card = await client.dm_until_card(team, REQUESTER, "send 5 to my usual account")
    assert 'rule 1 matched: `provenance.toAccount != \\"human\\"`' in shown(card)
    assert "🔎 _not in the conversation_" in field(card, "toAccount")
    assert len(ledger_tools.entries()) == 1
    gemini.script(text("Sent."))
    await client.click(team, BOSS, "approve", card)
    reply = await reply_in_thread(fake_slack, (await last_thread(fake_slack)))
    assert text_of(reply) == "Sent." and len(ledger_tools.entries()) == 2


async def last_thread(fake_slack: FakeSlack) -> str:
    posts = [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(DM)(c)]
    return str(posts[-1].args["thread_ts"])
