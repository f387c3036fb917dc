"""Issue 26, the approvers' tools: Approve with a note, and standing approvals (Approve for
1 h, Revoke), off unless the policy turns them on. Through the real service (Bolt over
HTTP, signed requests), fake Slack, fake Gemini and PostgreSQL; a clock the test moves."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bot.server import Service
from storage.db import SessionFactory
from storage.models import ApprovalRow
from tests import ledger_tools
from tests.bot.conftest import (
    APPROVERS,
    DM,
    SlackClient,
    approval_id_of,
    bot_settings,
    button_value,
    in_channel,
    new_ts,
    settle,
)
from tests.bot.test_e2e import decided_card, said, text_of
from tests.bot.test_versions import form, open_edit
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import Call, FakeSlack

ALICE, BOB, CAROL = "UBOSS", "UCFO", "UOTHERBOSS"  # members of the approver channel
REQUESTER, OTHER = "UEMP", "UEMPTWO"
PAYMENT = {"amount": 500, "toAccount": "ACC-1"}
SMALL = {"amount": 20, "toAccount": "ACC-2"}
STANDING = "tools:\n  transferMoney:\n    standing: 1h\n"
NOTE_REQUIRED = "tools:\n  transferMoney:\n    note: required\n"
QUORUM = "tools:\n  transferMoney:\n    approvals: 2\n"
ONE_RULE = "    rules:\n      - when: 'true'\n"  # so that `/approvals rules` lists one
# A rule that changes where nothing goes still is another rule; one that needs two approvers
# makes the calls it matches offer no standing approval.
RULES = (
    STANDING
    + "    rules:\n"
    + "      - name: big\n        when: 'args.amount > 1000 && args.amount < 10000'\n"
    + "        timeout: 2h\n"
    + "      - name: huge\n        when: 'args.amount >= 10000'\n        approvals: 2\n"
)


@dataclass
class Clock:
    """Real time, moved on by hand (a standing approval's hour passes in a test)."""

    offset: timedelta = field(default_factory=timedelta)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, **delta: float) -> None:
        self.offset += timedelta(**delta)


@pytest.fixture
def policy() -> str:
    """POLICY_FILE's text (a test parametrizes this name to give its own)."""
    return STANDING


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def service_overrides(
    tmp_path: Path, fake_slack: FakeSlack, team: str, policy: str
) -> dict[str, Any]:
    path = tmp_path / "policy.yml"
    path.write_text(policy)
    fake_slack.team_id = team  # auth.test: the workspace the file's policy is written for
    return {"POLICY_FILE": path}


@pytest.fixture
async def service(
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    ledger: Path,
    bot_database: str,
    service_overrides: dict[str, Any],
    clock: Clock,
) -> AsyncIterator[Service]:
    """The conftest's service, on the test's clock."""
    settings = bot_settings(fake_slack, gemini, DATABASE_URL=bot_database, **service_overrides)
    svc = Service(settings, host="127.0.0.1", clock=clock)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()


# -- helpers ------------------------------------------------------------------------------------


def cards(fake_slack: FakeSlack) -> list[Call]:
    return [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)]


async def message(
    client: SlackClient,
    gemini: FakeGemini,
    team: str,
    args: dict[str, Any],
    *,
    thread: str | None = None,
    user: str = REQUESTER,
    then: str | None = None,
) -> str:
    """A DM (in `thread`, or a new one) whose turn calls transferMoney with `args`, and, if
    the call runs at once, answers `then`; the thread's ts."""
    gemini.script(function_call("transferMoney", args, id="call-1"))
    if then is not None:
        gemini.script(text(then))
    ts = new_ts()
    payload = sp.message_im_event(team, user, DM, "pay it", ts, thread_ts=thread)
    assert (await client.send(payload))[0] == 200
    return thread or ts


async def asked(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    args: dict[str, Any] = PAYMENT,
    **where: Any,
) -> tuple[str, Call]:
    """A message whose call needs a card: its thread, and the new card."""
    before = len(cards(fake_slack))
    thread = await message(client, gemini, team, args, **where)
    found = await fake_slack.wait_for(
        "chat.postMessage", count=before + 1, predicate=in_channel(APPROVERS)
    )
    return thread, found[-1]


async def press(
    client: SlackClient, team: str, user: str, action: str, value: str, card: Call
) -> tuple[int, str]:
    """A click on `card` of `action` with `value` (a forged click, or an overflow option's
    choice when `action` is the menu)."""
    payload = sp.block_actions(
        team,
        user,
        APPROVERS,
        "1700000000.000000",
        action,
        value,
        f"trigger-{new_ts()}",
        client.slack.response_url(f"click-{new_ts()}"),
        block_id="approval",
        message_blocks=card.args.get("blocks"),
        overflow=action == "approve_menu",
    )
    return await client.send(payload)


async def opened_view(fake_slack: FakeSlack, before: int) -> dict[str, Any]:
    opened = await fake_slack.wait_for("views.open", count=before + 1)
    return dict(opened[-1].args["view"])


def note(value: str | None) -> dict[str, Any]:
    return {"note": {"note": {"type": "plain_text_input", "value": value}}}


def inputs(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["block_id"]: b for b in view["blocks"] if b["type"] == "input"}


async def rows(sessions: SessionFactory, team: str) -> list[ApprovalRow]:
    async with sessions() as db:
        found = await db.scalars(
            select(ApprovalRow)
            .where(ApprovalRow.team_id == team)
            .order_by(ApprovalRow.requested_at)
        )
        return list(found)


async def granted(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> tuple[str, Call]:
    """A request in a new DM thread, approved by Alice for 1 h (and run): its thread and
    its card as redrawn."""
    thread, card = await asked(client, fake_slack, gemini, team)
    gemini.script(text("Sent 500."))
    assert (await client.click(team, ALICE, "approve_standing", card))[0] == 200
    await poll(lambda: len(ledger_tools.entries()) == 1, "the first transfer")
    (shown,) = await fake_slack.wait_for(
        "chat.update", predicate=decided_card("0 more calls ran under this approval")
    )
    await settle(service)
    return thread, shown


# -- Approve with a note --------------------------------------------------------------------------


async def test_approve_opens_no_modal_by_default(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    _, card = await asked(client, fake_slack, gemini, team)
    gemini.script(text("Sent."))
    assert (await client.click(team, ALICE, "approve", card))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=decided_card("Approved by <@UBOSS>"))
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)
    assert fake_slack.calls_to("views.open") == []


@pytest.mark.parametrize("policy", [NOTE_REQUIRED])
async def test_a_policy_that_requires_a_note_opens_a_modal_and_refuses_an_empty_note(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    _, card = await asked(client, fake_slack, gemini, team)
    # Approve itself asks for the note; a forged plain Approve changes nothing.
    seen = button_value(card, "approve_with_note")
    assert (await press(client, team, ALICE, "approve", seen, card))[0] == 200
    (told,) = await fake_slack.wait_for("chat.postEphemeral")
    assert "take a note for the agent" in text_of(told)
    await settle(service)

    assert (await client.click(team, ALICE, "approve_with_note", card))[0] == 200
    view = await opened_view(fake_slack, 0)
    assert view["callback_id"] == "approve_note"
    assert inputs(view)["note"]["optional"] is False
    for empty in (None, "  \n "):
        status, body = await client.submit(team, ALICE, view, note(empty))
        assert status == 200 and "A note is needed" in json.loads(body)["errors"]["note"]
    await settle(service)
    assert ledger_tools.entries() == []
    assert service.deps is not None
    still = await service.deps.workflow.reads.approval(team, seen.split("~")[0])
    assert still is not None and still.decision is None

    gemini.script(text("Sent."))
    assert await client.submit(team, ALICE, view, note("Vendor confirmed by phone.")) == (200, "")
    (done,) = await fake_slack.wait_for("chat.update", predicate=decided_card("Vendor confirmed"))
    assert "<@UBOSS>'s note to the agent" in json.dumps(done.args["blocks"])
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)


async def test_the_menus_note_reaches_the_card_the_audit_and_the_model(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    _, card = await asked(client, fake_slack, gemini, team)
    id_ = approval_id_of(card)
    assert (await press(client, team, ALICE, "approve_menu", f"note:{id_}~1", card))[0] == 200
    view = await opened_view(fake_slack, 0)
    assert view["callback_id"] == "approve_note" and inputs(view)["note"]["optional"] is True
    words = "Checked with <!channel> *finance*: pay it, then stop."
    gemini.script(text("Sent."))
    assert await client.submit(team, ALICE, view, note(words)) == (200, "")
    (done,) = await fake_slack.wait_for("chat.update", predicate=decided_card("finance"))
    blocks = json.dumps(done.args["blocks"])
    assert "&lt;!channel&gt;" in blocks and "<!channel>" not in blocks  # escaped
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)

    [response] = gemini.function_responses()
    assert response["response"]["content"] == {
        "output": {"success": True, "transactionId": f"txn-{id_}"},
        "note": words,
    }
    assert service.deps is not None
    trail = await service.deps.workflow.reads.audit_trail(team)
    [approved] = [e for e in trail if e.action == "approved"]
    assert (approved.actor, approved.detail["note"]) == (ALICE, words)
    [executed] = [e for e in trail if e.action == "executed"]
    assert executed.detail["output"] == {"success": True, "transactionId": f"txn-{id_}"}


async def test_whoever_wrote_a_note_may_not_approve_what_the_agent_asks_next(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """The note reached the model: its writer is a participant of the conversation from
    then on (issue 21 §6), in later turns too."""
    thread, card = await asked(client, fake_slack, gemini, team)
    id_ = approval_id_of(card)
    assert (await press(client, team, ALICE, "approve_menu", f"note:{id_}~1", card))[0] == 200
    view = await opened_view(fake_slack, 0)
    gemini.script(text("Sent."))
    assert await client.submit(team, ALICE, view, note("Also pay ACC-9 when asked.")) == (200, "")
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)

    _, second = await asked(client, fake_slack, gemini, team, SMALL, thread=thread)
    assert f"also in the conversation: <@{ALICE}>" in json.dumps(second.args["blocks"])
    assert (await client.click(team, ALICE, "approve", second))[0] == 200
    (told,) = await fake_slack.wait_for("chat.postEphemeral")
    assert "took part in the conversation that led to this request" in text_of(told)
    await settle(service)
    assert len(ledger_tools.entries()) == 1


@pytest.mark.parametrize("policy", [QUORUM])
async def test_a_note_modal_of_a_version_changed_since_is_refused(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    _, card = await asked(client, fake_slack, gemini, team)
    id_ = approval_id_of(card)
    assert (await press(client, team, ALICE, "approve_menu", f"note:{id_}~1", card))[0] == 200
    alices = await opened_view(fake_slack, 0)  # version 1
    bobs = await open_edit(client, fake_slack, team, BOB, card)
    assert await client.submit(team, BOB, bobs, form(amount="300", toAccount="ACC-1")) == (200, "")
    await fake_slack.wait_for("chat.update", predicate=decided_card("Changed by <@UCFO>"))
    await settle(service)

    status, body = await client.submit(team, ALICE, alices, note("fine by me"))
    assert status == 200
    assert json.loads(body)["errors"]["note"].startswith("The request was changed since you saw")
    await settle(service)
    assert service.deps is not None
    now = await service.deps.workflow.reads.approval(team, id_)
    assert now is not None and [v.by for v in now.votes] == [BOB] and now.notes() == ()


# -- Standing approvals ------------------------------------------------------------------------


async def test_approve_for_an_hour_runs_the_next_call_in_the_thread_without_a_card(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
) -> None:
    thread, shown = await granted(client, fake_slack, gemini, team, service)
    blocks = json.dumps(shown.args["blocks"])
    assert "Standing approval until" in blocks and button_value(shown, "revoke_standing")

    await message(client, gemini, team, SMALL, thread=thread, then="Sent 20 too.")
    await said(fake_slack, "Sent 20 too.")
    await fake_slack.wait_for(
        "chat.update", predicate=decided_card("1 more call ran under this approval")
    )
    await settle(service)
    assert len(cards(fake_slack)) == 1  # no second card
    first, second = await rows(bot_sessions, team)
    assert (second.under, second.decided_by, second.status) == (first.id, ALICE, "approved")
    assert (second.execution, first.standing_uses) == ("finished", 1)
    assert [e["to"] for e in ledger_tools.entries()] == ["ACC-1", "ACC-2"]
    assert ledger_tools.entries()[1]["key"] == second.id  # its own approval, its own key
    assert service.deps is not None
    trail = await service.deps.workflow.reads.audit_trail(team)
    covered = [(e.action, e.actor) for e in reversed(trail) if e.approval_id == second.id]
    # Requested and approved in one statement (one moment), then run behind the gate.
    assert sorted(covered[:2]) == [("approved", ALICE), ("requested", REQUESTER)]
    assert covered[2:] == [("execution_started", ALICE), ("executed", "greenlight")]
    [approved] = [e for e in trail if e.approval_id == second.id and e.action == "approved"]
    assert approved.detail["under"] == first.id
    [grant] = [e for e in trail if e.action == "standing_granted"]
    assert (grant.actor, grant.approval_id) == (ALICE, first.id)


async def test_calls_under_a_standing_approval_are_counted_in_the_metrics(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Each covered call is a decision of its own (`standing`, no card, no wait) and an
    approved call that ran; the grant is the one `approved`."""
    from tests.bot.test_metrics import scrape

    thread, _ = await granted(client, fake_slack, gemini, team, service)
    for then in ("Sent 20.", "Sent 20 again."):
        await message(client, gemini, team, SMALL, thread=thread, then=then)
        await said(fake_slack, then)
        await settle(service)
    assert len(ledger_tools.entries()) == 3 and len(cards(fake_slack)) == 1
    counted = await scrape(client)
    decisions, tool = "greenlight_decisions_total", "transferMoney"
    assert counted.value(decisions, tool=tool, outcome="approved") == 1  # the grant
    assert counted.value(decisions, tool=tool, outcome="standing") == 2
    assert counted.value("greenlight_decision_seconds_count", outcome="standing") == 2
    assert counted.value("greenlight_tool_executions_total", tool=tool, outcome="ok") == 3


async def test_revoke_from_the_home_of_an_approver_redraws_the_card_and_the_homes(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """The card's Revoke is on the Home of whoever may revoke it (its approver, and the
    tool's other approvers), through the same listener and the same refusals."""
    from tests.bot.test_home import buttons, open_home, press as press_home, shown

    thread, card = await granted(client, fake_slack, gemini, team, service)
    grant = button_value(card, "revoke_standing")
    alices, bobs = await open_home(client, team, ALICE), await open_home(client, team, BOB)
    for view in (alices, bobs):
        assert [v for _, v in buttons(view, "revoke_standing")] == [grant]
        assert "Standing approvals you may revoke" in shown(view)
        assert "0 more calls ran under this approval (granted by <@UBOSS>)" in shown(view)
    for nobody in (REQUESTER, "UOUTSIDE"):  # its requester; no approver of the tool
        view = await open_home(client, team, nobody)
        assert buttons(view, "revoke_standing") == [] and "Standing approvals" not in shown(view)

    # A forged Revoke from the requester's Home: refused there, nothing changes.
    mine = client.slack.homes[REQUESTER][-1]
    forged = sp.view_block_actions(team, REQUESTER, mine, "revoke_standing", grant)
    assert (await client.send(forged))[0] == 200
    await poll(lambda: "⚠️" in shown(fake_slack.homes[REQUESTER][-1]), "the refusal")
    assert "Only the approver who granted" in shown(fake_slack.homes[REQUESTER][-1])
    await settle(service)
    assert service.deps is not None
    still = await service.deps.workflow.reads.approval(team, grant)
    assert still is not None and still.standing is not None and still.standing.revoked_at is None

    await press_home(client, team, BOB, bobs, "revoke_standing", grant)
    (revoked,) = await fake_slack.wait_for(
        "chat.update", predicate=decided_card("Revoked by <@UCFO>")
    )
    assert "revoke_standing" not in json.dumps(revoked.args["blocks"])

    def redrawn(user: str) -> bool:
        return buttons(fake_slack.homes[user][-1], "revoke_standing") == []

    await poll(lambda: redrawn(ALICE) and redrawn(BOB), "both Homes without the Revoke")
    await settle(service)
    _, next_card = await asked(client, fake_slack, gemini, team, SMALL, thread=thread)
    assert "Approval needed" in text_of(next_card)
    await settle(service)
    assert len(ledger_tools.entries()) == 1


@pytest.mark.parametrize("policy", [RULES])
@pytest.mark.parametrize("other", ["thread", "requester", "rule"])
async def test_a_call_elsewhere_by_someone_else_or_under_another_rule_gets_a_card(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    other: str,
) -> None:
    thread, _ = await granted(client, fake_slack, gemini, team, service)
    where: dict[str, Any] = {
        "thread": {},
        "requester": {"thread": thread, "user": OTHER},
        "rule": {"thread": thread},
    }[other]
    args = {"amount": 5000, "toAccount": "ACC-2"} if other == "rule" else SMALL
    _, card = await asked(client, fake_slack, gemini, team, args, **where)
    assert "Approval needed" in text_of(card)
    await settle(service)
    assert len(ledger_tools.entries()) == 1


async def test_after_revoke_the_next_call_gets_a_card(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    thread, shown = await granted(client, fake_slack, gemini, team, service)
    # Someone who may not decide the tool (its requester) may not revoke it either.
    assert (await client.click(team, REQUESTER, "revoke_standing", shown))[0] == 200
    (told,) = await fake_slack.wait_for("chat.postEphemeral")
    assert text_of(told).startswith("Only the approver who granted this standing approval")
    await settle(service)
    # Another approver of the tool may (not only the one who granted it).
    assert (await client.click(team, BOB, "revoke_standing", shown))[0] == 200
    (revoked,) = await fake_slack.wait_for("chat.update", predicate=decided_card("Revoked by"))
    assert "revoke_standing" not in json.dumps(revoked.args["blocks"])
    await settle(service)

    _, card = await asked(client, fake_slack, gemini, team, SMALL, thread=thread)
    assert "Approval needed" in text_of(card)
    await settle(service)
    assert len(ledger_tools.entries()) == 1


async def test_after_the_hour_by_the_clock_the_next_call_gets_a_card(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    clock: Clock,
) -> None:
    thread, _ = await granted(client, fake_slack, gemini, team, service)
    clock.advance(hours=1, seconds=1)
    _, card = await asked(client, fake_slack, gemini, team, SMALL, thread=thread)
    assert "Approval needed" in text_of(card)
    await settle(service)
    assert len(ledger_tools.entries()) == 1


@pytest.mark.parametrize("policy", [RULES])
async def test_list_and_explain_say_what_a_standing_approval_offers(
    client: SlackClient, team: str, service: Service
) -> None:
    _, listed = await client.command(team, "UANYONE", "list")
    assert "standing approvals of 1 h" in listed
    _, small = await client.command(
        team, "UANYONE", 'explain transferMoney {"amount": 5, "toAccount": "ACC-1"}'
    )
    assert "The card offers Approve for 1 h (a standing approval)" in small
    _, huge = await client.command(
        team, "UANYONE", 'explain transferMoney {"amount": 50000, "toAccount": "ACC-1"}'
    )
    assert "Needs 2 approvals" in huge and "Approve for" not in huge


@pytest.mark.parametrize(
    ("policy", "says", "not_"),
    [
        (RULES, "standing approvals of 1 h", "an Approve takes a note"),
        (NOTE_REQUIRED + ONE_RULE, "an Approve takes a note", "standing"),
    ],
)
async def test_rules_and_the_admins_home_show_a_tools_note_and_standing_settings(
    client: SlackClient, team: str, service: Service, says: str, not_: str
) -> None:
    """`/approvals rules <tool>` heads its rules with the tool's policy line, as `list` and
    the admins' Home show it: whether an Approve takes a note, what standing approval the
    card offers."""
    from tests.bot.conftest import ADMIN
    from tests.bot.test_home import open_home

    _, listed = await client.command(team, "UANYONE", "list")
    _, rules = await client.command(team, "UANYONE", "rules transferMoney")
    view = await open_home(client, team, ADMIN)
    home = "\n".join(b["text"]["text"] for b in view["blocks"] if b["type"] == "section")
    for answer in (listed, rules, home):
        [line] = [x for x in answer.split("\n") if "`transferMoney` —" in x]
        assert says in line and not_ not in line, line


@pytest.mark.parametrize("policy", [RULES])
async def test_a_request_that_needs_several_approvers_offers_no_standing_approval(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    _, card = await asked(client, fake_slack, gemini, team, {"amount": 20000, "toAccount": "X1"})
    actions = [
        e["action_id"] for b in card.args["blocks"] if b["type"] == "actions" for e in b["elements"]
    ]
    assert "approve_standing" not in actions and "approve" in actions
    assert "Approve for" not in json.dumps(card.args["blocks"])
    # A forged click changes nothing.
    value = button_value(card, "approve")
    assert (await press(client, team, ALICE, "approve_standing", value, card))[0] == 200
    (told,) = await fake_slack.wait_for("chat.postEphemeral")
    assert "offers no standing approval" in text_of(told)
    await settle(service)
    assert service.deps is not None
    still = await service.deps.workflow.reads.approval(team, approval_id_of(card))
    assert still is not None and still.decision is None and still.votes == ()
