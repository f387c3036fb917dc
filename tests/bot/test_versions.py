"""Issue 21: what is approved is what runs, at every seam. A request is one versioned call;
every decision names the version its view showed. Through the real service (Bolt over
HTTP), fake Slack, fake Gemini and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot import forms
from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import APPROVERS, SlackClient, in_channel, policy_file, settle
from tests.bot.test_e2e import ask, decided_card, text_of
from tests.conftest import poll
from tests.fakes.gemini import FakeGemini, text
from tests.fakes.slack_api import Call, FakeSlack

ALICE, BOB, CAROL = "UBOSS", "UCFO", "UOTHERBOSS"  # members of the approver channel
LEADS = "C0LEADS"
TWO = "tools:\n  transferMoney:\n    approvals: 2\n"
PAYMENT = {"amount": 500, "toAccount": "ACC-1"}


@pytest.fixture
def policy() -> str:
    """POLICY_FILE's text (a test parametrizes this name to give its own)."""
    return TWO


@pytest.fixture
def service_overrides(
    tmp_path: Path, fake_slack: FakeSlack, team: str, policy: str
) -> dict[str, Any]:
    fake_slack.channels[LEADS] = {"is_private": True}
    return policy_file(fake_slack, team, tmp_path / "policy.yml", policy)


def form(**values: str) -> dict[str, Any]:
    """The Edit & approve form as submitted (block_id: the field; action_id: value)."""
    kinds = {"amount": "number_input"}
    return {
        k: {"value": {"type": kinds.get(k, "plain_text_input"), "value": v}}
        for k, v in values.items()
    }


async def open_edit(
    client: SlackClient, fake_slack: FakeSlack, team: str, user: str, card: Call
) -> dict[str, Any]:
    """Click Edit & approve on `card` as `user`; the modal the service opened."""
    before = len(fake_slack.calls_to("views.open"))
    assert (await client.click(team, user, "edit_approve", card))[0] == 200
    opened = await fake_slack.wait_for("views.open", count=before + 1)
    return dict(opened[-1].args["view"])


def shows(marker: str) -> Any:
    return decided_card(marker)


async def pending(service: Service, team: str, approval_id: str) -> Any:
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, approval_id)
    assert approval is not None
    return approval


# -- 1. One approvable call, versioned ----------------------------------------------------------


async def test_an_edit_reverted_by_a_second_approver_never_runs_the_edit(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Two approvals needed. Alice edits toAccount to EXT999; Bob disagrees and sets it back
    with Edit & approve: that is a new version with Bob's vote alone, not a vote for EXT999."""
    asked = await ask(client, fake_slack, gemini, team, args=PAYMENT)
    view = await open_edit(client, fake_slack, team, ALICE, asked.card)
    assert await client.submit(team, ALICE, view, form(amount="500", toAccount="EXT999")) == (
        200,
        "",
    )
    (v2,) = await fake_slack.wait_for("chat.update", predicate=shows("Changed by <@UBOSS>"))
    assert "1 of 2 approvals:* <@UBOSS>" in json.dumps(v2.args["blocks"])
    await settle(service)

    view = await open_edit(client, fake_slack, team, BOB, v2)
    inputs = {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}
    assert inputs["toAccount"]["initial_value"] == "EXT999"  # the version Bob is shown
    assert await client.submit(team, BOB, view, form(amount="500", toAccount="ACC-1")) == (200, "")
    (v3,) = await fake_slack.wait_for("chat.update", predicate=shows("Changed by <@UCFO>"))
    blocks = json.dumps(v3.args["blocks"], ensure_ascii=False)
    assert (
        "1 of 2 approvals:* <@UCFO>" in blocks and "back to the call as the agent asked" in blocks
    )
    await settle(service)
    assert ledger_tools.entries() == []  # the quorum was not met by Bob's revert

    # Alice's Approve of the card as it was (version 2) changes nothing.
    assert (await client.click(team, ALICE, "approve", v2))[0] == 200
    (stale,) = await fake_slack.wait_for("chat.postEphemeral")
    assert text_of(stale).startswith("The request was changed since you saw it")
    await settle(service)
    assert ledger_tools.entries() == []

    gemini.script(text("Sent 500 to ACC-1."))
    assert (await client.click(team, CAROL, "approve", v3))[0] == 200
    await fake_slack.wait_for(
        "chat.update", predicate=shows("Approved by <@UCFO> and <@UOTHERBOSS>")
    )
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)
    assert [(e["amount"], e["to"]) for e in ledger_tools.entries()] == [(500, "ACC-1")]
    assert service.deps is not None
    trail = await service.deps.workflow.reads.audit_trail(team)
    approvals = [
        (e.actor, (e.detail.get("edited") or e.detail["input"])["toAccount"])
        for e in trail
        if e.action in ("approved", "edited")
    ]
    assert ("UCFO", "EXT999") not in approvals  # nobody's record says Bob approved EXT999


async def test_a_modal_opened_before_an_edit_and_submitted_unchanged_counts_for_nothing(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args=PAYMENT)
    bobs = await open_edit(client, fake_slack, team, BOB, asked.card)  # shows version 1
    alices = await open_edit(client, fake_slack, team, ALICE, asked.card)
    assert await client.submit(team, ALICE, alices, form(amount="500", toAccount="EXT999")) == (
        200,
        "",
    )
    await fake_slack.wait_for("chat.update", predicate=shows("Changed by <@UBOSS>"))
    await settle(service)

    status, body = await client.submit(team, BOB, bobs, form(amount="500", toAccount="ACC-1"))
    answer = json.loads(body)
    assert status == 200 and answer["response_action"] == "update"  # Bob sees version 2 now
    shown = json.dumps(answer["view"])
    assert "The request was changed since you saw it" in shown and "EXT999" in shown
    await settle(service)
    now = await pending(service, team, asked.approval_id)
    assert now.decision is None and now.version == 2 and [v.by for v in now.votes] == [ALICE]
    assert ledger_tools.entries() == []


# -- 2. An edit cannot move the decision ---------------------------------------------------------

ROUTED = f"""\
tools:
  transferMoney:
    rules:
      - when: 'args.toAccount.startsWith("EXT")'
        channel: {LEADS}
"""


@pytest.mark.parametrize("policy", [ROUTED])
async def test_an_edit_that_would_route_the_request_elsewhere_is_refused_by_its_field(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args=PAYMENT)  # to the default channel
    assert in_channel(APPROVERS)(asked.card)
    view = await open_edit(client, fake_slack, team, ALICE, asked.card)
    status, body = await client.submit(team, ALICE, view, form(amount="500", toAccount="EXT-999"))
    errors = json.loads(body)["errors"]
    assert status == 200 and list(errors) == ["toAccount"]
    assert "another approver channel" in errors["toAccount"]
    await settle(service)
    now = await pending(service, team, asked.approval_id)
    assert now.decision is None and now.edit is None and now.version == 1
    assert ledger_tools.entries() == []


# -- 4. After an edit, approvers see the edit in full -------------------------------------------


async def test_after_an_edit_the_next_approver_sees_the_whole_new_version_and_its_preview(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args=PAYMENT)
    assert "Balance after transfer: 500.00" in json.dumps(asked.card.args["blocks"])
    long = "ACC-" + "7" * 1475 + "\u200b" + "THE-END-OF-IT-42-END"  # 1,500 characters
    assert len(long) == 1500
    view = await open_edit(client, fake_slack, team, ALICE, asked.card)
    assert await client.submit(team, ALICE, view, form(amount="300", toAccount=long)) == (200, "")
    (v2,) = await fake_slack.wait_for("chat.update", predicate=shows("Changed by <@UBOSS>"))
    blocks = json.dumps(v2.args["blocks"], ensure_ascii=False)
    assert "1,500 characters in all" in blocks and "hidden characters" in blocks
    assert "Balance after transfer: 700.00" in blocks and "750.00" not in blocks
    assert "500.00" not in blocks
    await settle(service)

    assert (await client.click(team, BOB, "show_request", v2))[0] == 200
    await fake_slack.wait_for("views.open", count=2)
    full = json.dumps(fake_slack.calls_to("views.open")[-1].args["view"], ensure_ascii=False)
    assert "THE-END-OF-IT-42-END" in full and "Version 2" in full and "700.00" not in full
    await settle(service)
    gemini.script(text("Sent."))
    assert (await client.click(team, BOB, "approve", v2))[0] == 200
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)
    [entry] = ledger_tools.entries()
    assert (entry["amount"], entry["to"]) == (300, long)


# -- 8. Modals check again; the form keeps what nobody touched ----------------------------------


async def test_a_deny_submitted_after_leaving_the_approver_channel_is_refused(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args=PAYMENT)
    assert (await client.click(team, ALICE, "deny", asked.card))[0] == 200
    (opened,) = await fake_slack.wait_for("views.open")
    fake_slack.members[APPROVERS] = [BOB, CAROL]  # Alice left (or was removed) meanwhile
    values = {"reason": {"reason": {"type": "plain_text_input", "value": "no"}}}
    status, body = await client.submit(team, ALICE, opened.args["view"], values)
    assert status == 200 and "not one of the approvers" in json.loads(body)["errors"]["reason"]
    await settle(service)
    now = await pending(service, team, asked.approval_id)
    assert now.decision is None


ONE = "tools:\n  transferMoney:\n    approvals: 1\n"


@pytest.mark.parametrize("policy", [ONE])
async def test_an_edit_keeps_a_field_nobody_touched_exactly_even_past_what_an_input_holds(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    account = "ACC-" + "1234567890" * 350  # 3,504 characters: an input holds 3,000
    asked = await ask(client, fake_slack, gemini, team, args={"amount": 500, "toAccount": account})
    view = await open_edit(client, fake_slack, team, ALICE, asked.card)
    inputs = {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}
    cut = inputs["toAccount"]["initial_value"]
    assert len(cut) == 3000
    gemini.script(text("Sent 300."))
    assert await client.submit(team, ALICE, view, form(amount="300", toAccount=cut)) == (200, "")
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)
    [entry] = ledger_tools.entries()
    assert (entry["amount"], entry["to"]) == (300, account)


# -- 1. Policy reads the call as the tool's schema takes it --------------------------------------

BIG_NEEDS_TWO = """\
tools:
  transferMoney:
    rules:
      - when: "args.amount >= 100000"
        approvals: 2
"""


@pytest.mark.parametrize("policy", [BIG_NEEDS_TWO])
async def test_a_number_sent_as_a_string_is_judged_as_the_number_the_tool_gets(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args={"amount": "250000", "toAccount": "9"})
    blocks = json.dumps(asked.card.args["blocks"])
    assert "0 of 2 approvals" in blocks and "*amount*\\n250000.0" in blocks
    assert (await client.click(team, ALICE, "approve", asked.card))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=shows("1 of 2"))
    await settle(service)
    assert ledger_tools.entries() == []  # one approval never runs it
    gemini.script(text("Sent."))
    assert (await client.click(team, BOB, "approve", asked.card))[0] == 200
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)
    [entry] = ledger_tools.entries()
    assert (entry["amount"], entry["to"]) == (250000, "9")


def test_the_edit_form_keeps_untouched_values_exactly_and_reads_large_integers_exactly() -> None:
    schema = {
        "properties": {
            "n": {"type": "integer"},
            "note": {"type": "string"},
            "tags": {"type": "array"},
            "kind": {"enum": ["a", "b"]},
        }
    }
    big, note = 2**53 + 1, "x" * 3500
    before = {"n": big, "note": note, "tags": [1, 2], "kind": "a", "extra": True, "empty": ""}
    inputs = {b["block_id"]: b["element"] for b in forms.form_blocks(schema, before)}
    state = {
        "n": {"value": {"value": inputs["n"]["initial_value"]}},
        "note": {"value": {"value": inputs["note"]["initial_value"]}},
        "tags": {"value": {"value": inputs["tags"]["initial_value"]}},
        "kind": {"value": {"selected_option": inputs["kind"]["initial_option"]}},
    }
    assert forms.form_values(schema, state, before) == (before, {})
    state["n"] = {"value": {"value": str(big + 2)}}  # typed: read exactly, not via a float
    assert forms.form_values(schema, state, before)[0]["n"] == big + 2


SOON = "tools:\n  transferMoney:\n    timeout: 4s\n"


@pytest.mark.parametrize("policy", [SOON])
async def test_an_edit_whose_lookups_outlast_the_deadline_changes_nothing(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Submitted in time, but Slack took long to say Alice is still in the approver channel:
    the edit's decision time is taken after that, so the request expires and nothing runs."""
    asked = await ask(client, fake_slack, gemini, team, args=PAYMENT)
    view = await open_edit(client, fake_slack, team, ALICE, asked.card)
    fake_slack.delays["conversations.members"] = 2.0
    # Submitted a second before the deadline (a clock moment, not work to wait for).
    left = (await pending(service, team, asked.approval_id)).request.expires_at - datetime.now(UTC)
    await asyncio.sleep(max(left.total_seconds() - 1.0, 0))
    status, body = await client.submit(team, ALICE, view, form(amount="300", toAccount="ACC-1"))
    assert status == 200 and "Already expired" in json.dumps(json.loads(body)["errors"])
    await settle(service)
    now = await pending(service, team, asked.approval_id)
    assert now.state.value == "expired" and now.edit is None
    assert ledger_tools.entries() == []
