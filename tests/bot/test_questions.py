"""When the agent asks (issue 14, part 1): questions to the requester and to the approvers,
answered once, in the same resume as the turn's approvals. Against the real service, fake
Slack and Gemini, PostgreSQL."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import APPROVERS, DM, SlackClient, button_value, in_channel, new_ts, settle
from tests.bot.test_e2e import BOSS, REQUESTER, said, text_of
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, call, calls, function_call, text
from tests.fakes.slack_api import Call, FakeSlack


async def dm(client: SlackClient, team: str, message: str) -> str:
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, message, ts=ts))[0] == 200
    return ts


def answered_card(call: Call) -> bool:
    return "Answered by" in json.dumps(call.args.get("blocks"))


def typed(answer: str) -> dict[str, Any]:
    return {"answer": {"value": {"type": "plain_text_input", "value": answer}}}


async def test_a_question_to_the_requester_is_answered_by_their_reply_in_the_thread(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(function_call("askHuman", {"question": "Which account <!here>: savings?"}))
    thread = await dm(client, team, "move my money")
    (question,) = await fake_slack.wait_for("chat.postMessage", predicate=asks_in(thread))
    shown = json.dumps(question.args["blocks"])
    assert "Which account &lt;!here&gt;: savings?" in shown and "<!here>" not in shown
    assert [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)] == []

    # The requester's next message in the thread is the answer: no new turn starts.
    gemini.script(text("Moved it to savings."))
    reply = sp.message_im_event(team, REQUESTER, DM, "the savings one", new_ts(), thread_ts=thread)
    assert (await client.send(reply))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=answered_card)
    await said(fake_slack, "Moved it to savings.")
    [response] = gemini.function_responses()
    assert response["name"] == "askHuman"
    assert response["response"]["content"] == {
        "answer": "the savings one",
        "answered_by": REQUESTER,
    }
    assert len(gemini.generate_requests()) == 2  # the question, then the answer's resume
    await settle(service)


def asks_in(thread: str) -> Callable[[Call], bool]:
    """A question posted into the requester's thread (it has an Answer button)."""

    def match(call: Call) -> bool:
        return in_channel(DM, thread)(call) and '"action_id": "answer"' in json.dumps(call.args)

    return match


async def test_a_question_to_the_approvers_is_answered_in_a_modal_once(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    ask = {"question": "May I refund order 77 in full?", "who": "approvers"}
    gemini.script(calls([{"text": "Checking with finance."}, call("askHuman", ask, id="q1")]))
    thread = await dm(client, team, "refund order 77")
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    shown = json.dumps(card.args["blocks"])
    assert "May I refund order 77 in full?" in shown
    assert "asked:*\\n&gt; refund order 77" in shown  # the same context as an approval card
    assert "approve" not in [
        e.get("action_id")
        for b in card.args["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
    ]

    # The requester may not answer what the approvers are asked; Approve is no answer.
    await client.click(team, REQUESTER, "answer", card)
    (refused,) = await fake_slack.wait_for("chat.postEphemeral")
    assert refused.args["user"] == REQUESTER
    forged = sp.block_actions(
        team, BOSS, APPROVERS, "1.1", "approve", button_value(card, "answer"), "t", "https://x"
    )
    await client.send(forged)
    await fake_slack.wait_for("chat.postEphemeral", count=2)
    await settle(service)
    assert "a question, not an approval" in text_of(fake_slack.calls_to("chat.postEphemeral")[1])

    await client.click(team, BOSS, "answer", card)
    (opened,) = await fake_slack.wait_for("views.open")
    view = opened.args["view"]
    assert view["callback_id"] == "answer"
    gemini.script(text("Finance says yes; refunded."))
    assert await client.submit(team, BOSS, view, typed("Yes, in full.")) == (200, "")
    again = await client.submit(team, "UOTHERBOSS", view, typed("No!"))
    assert again[0] == 200 and "Already answered by <@UBOSS>" in again[1]
    await fake_slack.wait_for("chat.update", predicate=answered_card)
    reply = await said(fake_slack, "Finance says yes; refunded.")
    assert reply["thread_ts"] == thread
    [response] = gemini.function_responses()
    assert response["response"]["content"] == {"answer": "Yes, in full.", "answered_by": BOSS}
    await settle(service)
    trail = [(e.action, e.actor) for e in await service.deps.workflow.reads.audit_trail(team)]  # type: ignore[union-attr]
    assert trail.count(("answered", BOSS)) == 1


async def test_a_turn_with_an_approval_and_a_question_resumes_once_when_both_are_settled(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(
        calls(
            [
                call("transferMoney", {"amount": 5, "toAccount": "12345"}, id="c1"),
                call("askHuman", {"question": "Any memo for it?"}, id="c2"),
            ]
        )
    )
    thread = await dm(client, team, "send 5 to 12345")
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    (note,) = await fake_slack.wait_for(
        "chat.update", predicate=lambda c: in_channel(DM)(c) and "question" in text_of(c)
    )
    assert "I also need approval for `transferMoney`" in text_of(note)

    await client.click(team, BOSS, "approve", card)
    await settle(service)
    assert len(gemini.generate_requests()) == 1  # still waiting for the answer
    assert ledger_tools.entries() == []

    gemini.script(text("Sent, with the memo."))
    reply = sp.message_im_event(team, REQUESTER, DM, "rent for May", new_ts(), thread_ts=thread)
    await client.send(reply)
    await said(fake_slack, "Sent, with the memo.")
    await settle(service)
    responses = {r["name"]: r["response"]["content"] for r in gemini.function_responses()}
    assert responses["askHuman"] == {"answer": "rent for May", "answered_by": REQUESTER}
    assert responses["transferMoney"]["success"] is True
    assert len(ledger_tools.entries()) == 1 and len(gemini.generate_requests()) == 2


@pytest.mark.parametrize("service_overrides", [{"APPROVAL_TIMEOUT_SECONDS": 1}])
async def test_an_unanswered_question_expires_and_the_model_is_told(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    gemini.script(function_call("askHuman", {"question": "Which one?"}))
    await dm(client, team, "do the thing")
    await fake_slack.wait_for("chat.postMessage", count=2, predicate=in_channel(DM))
    started = time.time()
    await poll(lambda: time.time() > started + 1.1, "the question's deadline")
    gemini.script(text("Nobody answered, so I stopped."))
    assert service.deps is not None
    [resumed] = (await service.deps.workflow.follow_ups.sweep(team)).resumed
    assert resumed.outcome.text == "Nobody answered, so I stopped."  # type: ignore[union-attr]
    [response] = gemini.function_responses()
    assert response["response"]["content"] == {"answer": None, "error": "no answer"}
    await settle(service)


TOOLS = ["tests.ledger_tools", "tests.question_tools"]


@pytest.mark.parametrize("service_overrides", [{"AGENT_TOOLS": TOOLS}])
async def test_an_interrupt_a_module_defines_is_a_question_never_an_approval(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    gemini.script(function_call("confirmShipping", {"order": "77", "carrier": "DHL"}))
    thread = await dm(client, team, "ship order 77")
    (question,) = await fake_slack.wait_for("chat.postMessage", predicate=asks_in(thread))
    assert text_of(question).startswith("Question: confirmShipping")
    assert "*carrier*\\nDHL" in json.dumps(question.args["blocks"])  # its input, as fields
    await client.click(team, REQUESTER, "answer", question, channel=DM)
    (opened,) = await fake_slack.wait_for("views.open")
    gemini.script(text("Shipping with UPS then."))
    assert await client.submit(team, REQUESTER, opened.args["view"], typed("use UPS")) == (200, "")
    await said(fake_slack, "Shipping with UPS then.")
    [response] = gemini.function_responses()
    assert response["response"]["content"] == {"answer": "use UPS", "answered_by": REQUESTER}
    await settle(service)


@pytest.mark.parametrize("service_overrides", [{"AGENT_TOOLS": TOOLS}])
async def test_a_tool_that_asks_with_a_typed_answer_gets_a_form(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    from tests.bot.conftest import ADMIN

    assert (await client.command(team, ADMIN, "allow pickWarehouse"))[1].startswith("Done.")
    gemini.script(function_call("pickWarehouse", {"order": "77"}))
    await dm(client, team, "pick a warehouse for 77")
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    assert "Which warehouse for 77?" in json.dumps(card.args["blocks"])
    await client.click(team, BOSS, "answer", card)
    (opened,) = await fake_slack.wait_for("views.open")
    view = opened.args["view"]
    inputs = {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}
    assert inputs["warehouse"]["type"] == "static_select"
    assert inputs["quantity"] == {
        "type": "number_input",
        "action_id": "value",
        "is_decimal_allowed": False,
        "min_value": "1",
    }

    bad = {
        "warehouse": {"value": {"type": "static_select", "selected_option": {"value": '"north"'}}},
        "quantity": {"value": {"type": "number_input", "value": "0"}},
    }
    status, body = await client.submit(team, BOSS, view, bad)
    assert status == 200 and json.loads(body)["errors"].keys() == {"quantity"}

    good = bad | {"quantity": {"value": {"type": "number_input", "value": "3"}}}
    gemini.script(text("Shipping 3 from north."))
    assert await client.submit(team, BOSS, view, good) == (200, "")
    await said(fake_slack, "Shipping 3 from north.")
    [response] = gemini.function_responses()
    assert response["response"]["content"] == {"warehouse": "north", "quantity": 3}
    await settle(service)


async def test_policy_listing_says_which_tools_ask_a_person(
    client: SlackClient, team: str, service: Service
) -> None:
    from tests.bot.conftest import ADMIN

    _, listing = await client.command(team, ADMIN, "list")
    assert "• `askHuman` — asks a person" in listing
    assert "• `transferMoney` — needs approval" in listing
