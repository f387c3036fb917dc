"""Approving with changes (issue 14, part 2): the call runs once, with the approver's input,
and the model is told what changed. Against the real service, fake Slack and Gemini, PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import SlackClient, settle
from tests.bot.test_e2e import BOSS, ask, decided_card, reply_in_thread, text_of
from tests.fakes.gemini import FakeGemini, text
from tests.fakes.slack_api import Call, FakeSlack


def values(amount: str, to: str) -> dict[str, Any]:
    """The Edit & approve form as submitted (block_id: the field; action_id: value)."""
    return {
        "amount": {"value": {"type": "number_input", "value": amount}},
        "toAccount": {"value": {"type": "plain_text_input", "value": to}},
    }


async def open_edit(client: SlackClient, fake_slack: FakeSlack, team: str, card: Call) -> Call:
    assert (await client.click(team, BOSS, "edit_approve", card))[0] == 200
    (opened,) = await fake_slack.wait_for("views.open")
    return opened


async def test_edit_and_approve_runs_the_call_once_with_the_changes_and_tells_the_model(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)  # transferMoney 500 to 12345
    opened = await open_edit(client, fake_slack, team, asked.card)
    view = opened.args["view"]
    inputs = {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}
    assert inputs["amount"]["type"] == "number_input" and inputs["amount"]["initial_value"] == "500"
    assert inputs["toAccount"]["initial_value"] == "12345"

    gemini.script(text("Sent 300 instead of 500, as your approver changed it."))
    assert await client.submit(team, BOSS, view, values("300", "12345")) == (200, "")
    again = await client.submit(team, BOSS, view, values("1", "12345"))
    assert again[0] == 200 and "Already approved by <@UBOSS>" in again[1]
    (card,) = await fake_slack.wait_for("chat.update", predicate=decided_card("Approved by"))
    assert "*amount*: ~500~ → 300" in json.dumps(card.args["blocks"], ensure_ascii=False)
    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    assert text_of(reply).startswith("Sent 300")
    await settle(service)
    [entry] = ledger_tools.entries()
    assert (entry["amount"], entry["to"], entry["key"]) == (300, "12345", asked.approval_id)
    [response] = gemini.function_responses()
    assert response["response"]["content"] == {
        "output": {"success": True, "transactionId": f"txn-{asked.approval_id}"},
        "approved_with_changes": {"amount": {"from": 500, "to": 300}},
    }
    assert service.deps is not None
    trail = await service.deps.workflow.reads.audit_trail(team)
    [approved] = [e for e in trail if e.action == "approved"]
    assert approved.detail["input"]["amount"] == 500 and approved.detail["edited"]["amount"] == 300


async def test_an_edit_that_does_not_fit_the_tools_schema_is_shown_and_changes_nothing(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    view = (await open_edit(client, fake_slack, team, asked.card)).args["view"]
    status, body = await client.submit(team, BOSS, view, values("lots", "12345"))
    assert status == 200 and json.loads(body)["errors"] == {"amount": "a number is needed"}
    status, body = await client.submit(team, BOSS, view, values("5", ""))
    assert status == 200 and set(json.loads(body)["errors"]) == {"toAccount"}  # required
    await settle(service)
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None and approval.decision is None and approval.edit is None
    assert ledger_tools.entries() == [] and len(gemini.generate_requests()) == 1
