"""The requester's Withdraw through the running service: from the note in their thread, from
their Home tab, and the approvals API's DELETE; refused to anyone else and once it is
settled; a withdrawn request is never approved after, and the turn goes on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from bot.server import Service
from storage.domain import Withdrawn
from tests import ledger_tools
from tests.bot.conftest import (
    APPROVERS,
    DM,
    SlackClient,
    button_value,
    in_channel,
    new_ts,
    settle,
)
from tests.bot.test_e2e import (
    BOSS,
    REQUESTER,
    TRANSFER,
    ask,
    blocks_of,
    decided_card,
    reply_in_thread,
    text_of,
)
from tests.bot.test_gateway_api import Api
from tests.bot.test_gateway_mcp import mcp_client
from tests.bot.test_home import open_home, shown
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, call, calls, text
from tests.fakes.slack_api import Call, FakeSlack

WITHDRAWN = {"ok": False, "error": "withdrawn by the requester"}


@pytest.fixture
async def api(service: Service) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as http:
        yield Api(http, f"http://127.0.0.1:{service.port}")


async def withdraw_in_thread(
    client: SlackClient, team: str, user: str, note: Call, approval_id: str
) -> None:
    """Press the Withdraw of `approval_id` on the note in the requester's thread."""
    message = client.slack.messages[str(note.args["ts"])]
    payload = sp.block_actions(
        team,
        user,
        DM,
        str(note.args["ts"]),
        "withdraw",
        approval_id,
        "trigger-withdraw",
        client.slack.response_url(f"withdraw-{approval_id}-{user}"),
        block_id="withdraw",
        message_text=str(message.get("text", "")),
        message_blocks=message.get("blocks"),
    )
    assert (await client.send(payload))[0] == 200


def home_withdraws(view: dict[str, Any]) -> list[str]:
    """The requests a Home offers to withdraw (each button beside its request)."""
    return [
        str(b["accessory"]["value"])
        for b in view["blocks"]
        if b.get("accessory", {}).get("action_id") == "withdraw"
    ]


async def withdraw_on_home(
    client: SlackClient, team: str, user: str, view: dict[str, Any], approval_id: str
) -> None:
    [block] = [b for b in view["blocks"] if b.get("accessory", {}).get("value") == approval_id]
    payload = sp.view_block_actions(
        team, user, view, "withdraw", approval_id, block_id=str(block.get("block_id", "own"))
    )
    assert (await client.send(payload))[0] == 200


async def test_the_requester_withdraws_from_the_note_in_their_thread(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    # The note says where it waits, links the card, and offers Withdraw.
    assert text_of(asked.note).startswith("⏳ Waiting for approval in <#C0APPROVE> (<https://")
    assert button_value(asked.note, "withdraw") == asked.approval_id

    gemini.script(text("OK, I won't send it."))
    await withdraw_in_thread(client, team, REQUESTER, asked.note, asked.approval_id)

    # The card says so and loses its buttons; the model is told; the turn's reply arrives.
    (update,) = await fake_slack.wait_for("chat.update", predicate=decided_card("Withdrawn by"))
    assert "Withdrawn by <@UEMP>, who asked for it" in json.dumps(blocks_of(update))
    assert all(b.get("type") != "actions" for b in blocks_of(update)[-1:])
    assert all(b.get("block_id") != "approval" for b in blocks_of(update))
    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    assert text_of(reply) == "OK, I won't send it."
    [response] = gemini.function_responses()
    assert response["name"] == "transferMoney"
    assert response["response"]["content"] == WITHDRAWN
    await settle(service)
    assert ledger_tools.entries() == []
    # The note lost its button and says it was withdrawn.
    note = fake_slack.messages[str(asked.note.args["ts"])]
    assert "You withdrew this request" in json.dumps(note["blocks"])
    assert '"withdraw"' not in json.dumps(note["blocks"])
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None and isinstance(approval.decision, Withdrawn)
    trail = await service.deps.workflow.reads.audit_trail(team)
    [entry] = [e for e in trail if e.action == "withdrawn"]
    assert (entry.actor, entry.approval_id) == (REQUESTER, asked.approval_id)
    assert entry.detail["input"] == TRANSFER and entry.detail["door"] == "slack"

    # A stale Approve on the card changes nothing: the approver is told, nothing runs.
    before = len(gemini.generate_requests())
    await client.click(team, BOSS, "approve", asked.card)
    (told,) = await fake_slack.wait_for("chat.postEphemeral")
    assert told.args["user"] == BOSS
    assert text_of(told).startswith("Already withdrawn by <@UEMP>, who asked for it, at")
    # So does a second Withdraw from the old note.
    await withdraw_in_thread(client, team, REQUESTER, asked.note, asked.approval_id)
    await fake_slack.wait_for("chat.postEphemeral", count=2)
    await settle(service)
    assert ledger_tools.entries() == []
    assert len(gemini.generate_requests()) == before
    now = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert now is not None and now.decision == approval.decision


async def test_only_the_requester_may_withdraw(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    for someone in ("UOTHER", BOSS):
        await withdraw_in_thread(client, team, someone, asked.note, asked.approval_id)
    told = await fake_slack.wait_for("chat.postEphemeral", count=2)
    assert {c.args["user"] for c in told} == {"UOTHER", BOSS}
    assert all(
        text_of(c) == "Only <@UEMP>, who asked for this, can withdraw it. That changed nothing."
        for c in told
    )
    await settle(service)
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None and approval.decision is None
    assert not any(
        e.action == "withdrawn" for e in await service.deps.workflow.reads.audit_trail(team)
    )
    # It still waits for its approver, who still decides it.
    gemini.script(text("Sent."))
    await client.click(team, BOSS, "approve", asked.card)
    assert text_of(await reply_in_thread(fake_slack, asked.thread_ts)) == "Sent."
    assert len(ledger_tools.entries()) == 1


async def test_the_requester_withdraws_from_their_home(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    mine = await open_home(client, team, REQUESTER)
    assert "*waiting for approval*" in shown(mine)
    assert home_withdraws(mine) == [asked.approval_id]
    # Nobody else's Home offers it.
    assert home_withdraws(await open_home(client, team, BOSS)) == []

    gemini.script(text("Withdrawn, nothing sent."))
    await withdraw_on_home(client, team, REQUESTER, mine, asked.approval_id)
    await fake_slack.wait_for("chat.update", predicate=decided_card("Withdrawn by <@UEMP>"))
    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    assert text_of(reply) == "Withdrawn, nothing sent."
    assert gemini.function_responses()[0]["response"]["content"] == WITHDRAWN

    # The Home is published again without it; a click on the old one is refused there.
    def gone() -> bool:
        views = fake_slack.homes[REQUESTER]
        return len(views) > 1 and "transferMoney" not in shown(views[-1])

    await poll(gone, "the requester's Home refreshed")
    await withdraw_on_home(client, team, REQUESTER, mine, asked.approval_id)
    await poll(lambda: "Already withdrawn" in shown(fake_slack.homes[REQUESTER][-1]), "notice")
    await settle(service)
    assert ledger_tools.entries() == []


async def test_a_turn_goes_on_once_its_other_request_is_decided(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Withdrawing one of a turn's two requests resumes nothing yet; the other's decision
    resumes it once, answering both: the withdrawn call with the error, the other run."""
    small, large = {"amount": 5, "toAccount": "A1"}, {"amount": 9000, "toAccount": "B2"}
    gemini.script(
        calls([call("transferMoney", small, id="c1"), call("transferMoney", large, id="c2")])
    )
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "two transfers", ts=ts))[0] == 200
    cards = await fake_slack.wait_for("chat.postMessage", count=2, predicate=in_channel(APPROVERS))
    (note,) = await fake_slack.wait_for(
        "chat.update", predicate=lambda c: in_channel(DM)(c) and "Waiting" in text_of(c)
    )
    rows = [b for b in note.args["blocks"] if "accessory" in b]
    assert [b["accessory"]["text"]["text"] for b in rows] == ["Withdraw", "Withdraw"]
    by_amount = {
        json.dumps(c.args["blocks"]).count("9000") > 0: button_value(c, "approve").split("~")[0]
        for c in cards
    }
    large_id, small_id = by_amount[True], by_amount[False]
    large_card = next(c for c in cards if button_value(c, "approve").startswith(large_id))

    await withdraw_in_thread(client, team, REQUESTER, note, large_id)
    await fake_slack.wait_for("chat.update", predicate=decided_card("Withdrawn by"))
    await settle(service)
    assert len(gemini.generate_requests()) == 1  # nothing resumed yet

    gemini.script(text("Sent 5; the large one was withdrawn."))
    small_card = next(c for c in cards if c is not large_card)
    await client.click(team, BOSS, "approve", small_card)
    reply = await reply_in_thread(fake_slack, ts)
    assert text_of(reply) == "Sent 5; the large one was withdrawn."
    responses = gemini.function_responses()
    assert len(responses) == 2
    contents = [r["response"]["content"] for r in responses]
    assert WITHDRAWN in contents
    [entry] = ledger_tools.entries()
    assert (entry["amount"], entry["key"]) == (5, small_id)


async def test_delete_over_the_api_withdraws(
    client: SlackClient, fake_slack: FakeSlack, team: str, service: Service, api: Api
) -> None:
    assert service.deps is not None
    token = (await service.deps.keys.create(team, REQUESTER, "deployer")).token
    body = {"tool": "deployRelease", "input": {"version": "2"}}
    _, made = await api.call("POST", "/approvals", token, body)
    [card] = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    assert (await api.call("DELETE", f"/approvals/{made['id']}", token)) == (
        200,
        {"id": made["id"], "status": "cancelled"},
    )
    status, now = await api.call("GET", f"/approvals/{made['id']}", token)
    assert (status, now) == (
        200,
        {
            "id": made["id"],
            "status": "cancelled",
            "decided_by": REQUESTER,
            "reason": "withdrawn by the requester",
            "input": {"version": "2"},
            "note": None,
        },
    )
    assert (await api.call("POST", f"/approvals/{made['id']}/start", token))[0] == 409
    assert (await api.call("DELETE", f"/approvals/{made['id']}", token))[0] == 409
    (update,) = await fake_slack.wait_for("chat.update", predicate=decided_card("Withdrawn by"))
    assert f"Withdrawn by <@{REQUESTER}>" in json.dumps(blocks_of(update))
    assert all(b.get("block_id") != "approval" for b in blocks_of(update))
    approval = await service.deps.workflow.reads.approval(team, made["id"])
    assert approval is not None and isinstance(approval.decision, Withdrawn)
    trail = await service.deps.workflow.reads.audit_trail(team)
    [entry] = [e for e in trail if e.action == "withdrawn"]
    assert (entry.actor, entry.detail["door"], entry.detail["key"]) == (
        REQUESTER,
        "api",
        "deployer",
    )
    # An approver's stale click is refused.
    await client.click(team, BOSS, "approve", card)
    (told,) = await fake_slack.wait_for("chat.postEphemeral")
    assert text_of(told).startswith("Already withdrawn")
    await settle(service)


async def test_gateway_requests_are_on_the_requesters_home_to_withdraw(
    client: SlackClient, fake_slack: FakeSlack, team: str, service: Service, api: Api
) -> None:
    assert service.deps is not None
    token = (await service.deps.keys.create(team, REQUESTER, "deployer")).token
    _, made = await api.call("POST", "/approvals", token, {"tool": "deployRelease", "input": {}})
    await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    mcp_token = (await service.deps.keys.create(team, REQUESTER, "ci")).token
    async with mcp_client(service, mcp_token) as mcp:
        waiting = asyncio.create_task(mcp.call_tool("transferMoney", TRANSFER))
        await fake_slack.wait_for("chat.postMessage", count=2, predicate=in_channel(APPROVERS))
        pending = await service.deps.workflow.reads.pending(team)
        [mcp_id] = [a.id for a in pending if a.id != made["id"]]

        mine = await open_home(client, team, REQUESTER)
        assert sorted(home_withdraws(mine)) == sorted([made["id"], mcp_id])
        assert "through key `deployer`" in shown(mine) and "through key `ci`" in shown(mine)
        assert "|the card>" in shown(mine) and "archives/gateway" not in shown(mine)

        await withdraw_on_home(client, team, REQUESTER, mine, made["id"])
        await withdraw_on_home(client, team, REQUESTER, mine, mcp_id)
        result = await asyncio.wait_for(waiting, 30)
    assert result.is_error
    assert "withdrawn by the requester" in result.content[0].text  # type: ignore[union-attr]
    _, now = await api.call("GET", f"/approvals/{made['id']}", token)
    assert now["status"] == "cancelled"
    assert (await api.call("POST", f"/approvals/{made['id']}/start", token))[0] == 409
    await settle(service)
    assert ledger_tools.entries() == []
