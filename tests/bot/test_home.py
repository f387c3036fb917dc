"""The App Home tab through the running service: published on `app_home_opened`, its buttons
the approval card's, decided through the same listeners and the same single write."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from bot import home
from bot.listeners.commands import policy_summary
from bot.server import Service
from storage.domain import Approved, Vote
from tests import ledger_tools
from tests.bot.conftest import ADMIN, APPROVERS, DM, SlackClient, in_channel, new_ts, settle
from tests.bot.test_e2e import BOSS, REQUESTER, ask, reply_in_thread
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import FakeSlack

OUTSIDER = "UOUTSIDE"


async def open_home(client: SlackClient, team: str, user: str) -> dict[str, Any]:
    """Open `user`'s Home; returns the view the service published for it."""
    before = len(client.slack.homes.get(user, []))
    status, _ = await client.send(sp.app_home_opened_event(team, user))
    assert status == 200
    await poll(lambda: len(client.slack.homes.get(user, [])) > before, f"{user}'s Home")
    return client.slack.homes[user][-1]


def shown(view: dict[str, Any]) -> str:
    return json.dumps(view["blocks"], ensure_ascii=False)


def buttons(view: dict[str, Any], action: str) -> list[tuple[str, str]]:
    """(block id, value) of each `action` button on the Home."""
    return [
        (str(block["block_id"]), str(e["value"]))
        for block in view["blocks"]
        if block["type"] == "actions"
        for e in block["elements"]
        if e["action_id"] == action
    ]


async def press(
    client: SlackClient, team: str, user: str, view: dict[str, Any], action: str, approval: str
) -> None:
    [(block_id, value)] = [b for b in buttons(view, action) if b[1].split("~")[0] == approval]
    payload = sp.view_block_actions(team, user, view, action, value, block_id=block_id)
    assert (await client.send(payload))[0] == 200


async def test_an_approver_sees_what_they_may_decide_and_the_requester_their_request(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.members[APPROVERS] = [BOSS, ADMIN]
    asked = await ask(client, fake_slack, gemini, team)

    boss = await open_home(client, team, BOSS)
    assert [v for _, v in buttons(boss, "approve")] == [f"{asked.approval_id}~1"]
    assert [v for _, v in buttons(boss, "deny")] == [f"{asked.approval_id}~1"]
    assert buttons(boss, "edit_approve")  # transferMoney has a schema to edit by
    assert "`transferMoney` for <@UEMP>" in shown(boss) and "amount: 500" in shown(boss)
    assert "{ago}" in shown(boss)  # its age, in the reader's Slack
    assert "Policy (admins)" not in shown(boss)

    mine = await open_home(client, team, REQUESTER)
    assert buttons(mine, "approve") == []  # not theirs to decide
    assert "Nothing waits for your decision" in shown(mine)
    assert "*waiting for approval*" in shown(mine)
    assert f"archives/{DM}/p{asked.thread_ts.replace('.', '')}|the thread" in shown(mine)

    # Not a member of the approver channel (whose members decide): nothing to decide.
    outsider = await open_home(client, team, OUTSIDER)
    assert buttons(outsider, "approve") == [] and "transferMoney" not in shown(outsider)

    # An admin also sees the policy, as `/approvals list` shows it.
    admin = await open_home(client, team, ADMIN)
    assert "Policy (admins)" in shown(admin)
    assert "`transferMoney` — needs approval · <#C0APPROVE>" in shown(admin)
    assert [v for _, v in buttons(admin, "approve")] == [f"{asked.approval_id}~1"]

    # Opening the Messages tab publishes nothing.
    await client.send(sp.app_home_opened_event(team, BOSS, tab="messages"))
    await settle(service)
    assert len(fake_slack.homes[BOSS]) == 1


async def test_approve_from_the_home_runs_the_call_once_and_refreshes_the_homes(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.members[APPROVERS] = [BOSS]
    asked = await ask(client, fake_slack, gemini, team)
    boss = await open_home(client, team, BOSS)
    await open_home(client, team, REQUESTER)
    gemini.script(text("Sent 500 to 12345."))

    # The same approval, approved from the Home and from the card at once.
    await asyncio.gather(
        press(client, team, BOSS, boss, "approve", asked.approval_id),
        client.click(team, BOSS, "approve", asked.card),
    )
    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    assert reply.args["text"] == "Sent 500 to 12345."
    await settle(service)
    assert len(ledger_tools.entries()) == 1
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None and isinstance(approval.decision, Approved)
    trail = await service.deps.workflow.reads.audit_trail(team)
    assert [e.actor for e in trail if e.action == "approved"] == [BOSS]
    # The losing click was told, where it was made: an ephemeral, or the Home's notice.
    told = [c.args["text"] for c in fake_slack.calls_to("chat.postEphemeral")]
    told += [shown(v) for v in fake_slack.homes[BOSS] if "⚠️" in shown(v)]
    assert len(told) == 1 and "Already approved by <@UBOSS>" in told[0]

    # Both Homes are published again, without it (debounced: not once per change).
    def fresh(user: str) -> bool:
        views = fake_slack.homes[user]
        return len(views) > 1 and "transferMoney" not in shown(views[-1])

    await poll(lambda: fresh(BOSS) and fresh(REQUESTER), "the Homes refreshed")
    await settle(service)
    # Opened, perhaps the notice, then once or twice: not once per change (three or four).
    assert len(fake_slack.homes[BOSS]) <= 4


async def test_a_refused_click_on_the_home_changes_nothing_and_says_why_there(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.members[APPROVERS] = [BOSS, OUTSIDER]
    asked = await ask(client, fake_slack, gemini, team)
    outsider = await open_home(client, team, OUTSIDER)
    assert [v for _, v in buttons(outsider, "approve")] == [f"{asked.approval_id}~1"]
    # Meanwhile an admin names BOSS alone: the click checks again, under the policy now.
    _, answer = await client.command(team, ADMIN, "approvers transferMoney <@UBOSS>")
    assert answer.startswith("Done.")

    await press(client, team, OUTSIDER, outsider, "approve", asked.approval_id)
    await poll(lambda: len(fake_slack.homes[OUTSIDER]) > 1, "the Home with a notice")
    told = fake_slack.homes[OUTSIDER][-1]
    assert "You're not one of the approvers for `transferMoney`" in shown(told)
    assert buttons(told, "approve") == []  # no longer theirs to decide
    await settle(service)
    assert fake_slack.calls_to("chat.postEphemeral") == []  # no channel to say it in
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None and approval.decision is None
    assert ledger_tools.entries() == []

    # Deny from the Home opens the card's modal, marked as the Home's; still refused.
    await press(client, team, OUTSIDER, outsider, "deny", asked.approval_id)
    await poll(lambda: len(fake_slack.homes[OUTSIDER]) > 2, "a second notice")
    assert fake_slack.calls_to("views.open") == []
    # Opening the Home again clears the notice.
    assert "⚠️" not in shown(await open_home(client, team, OUTSIDER))


async def test_deny_from_the_home_through_its_modal(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.members[APPROVERS] = [BOSS]
    asked = await ask(client, fake_slack, gemini, team)
    boss = await open_home(client, team, BOSS)
    await press(client, team, BOSS, boss, "deny", asked.approval_id)
    (opened,) = await fake_slack.wait_for("views.open")
    modal = opened.args["view"]
    assert json.loads(modal["private_metadata"])["home"] is True
    gemini.script(text("Not sent."))
    values = {"reason": {"reason": {"type": "plain_text_input", "value": "no"}}}
    assert (await client.submit(team, BOSS, modal, values))[0] == 200
    assert (await reply_in_thread(fake_slack, asked.thread_ts)).args["text"] == "Not sent."
    await settle(service)
    assert ledger_tools.entries() == []


async def test_questions_are_answered_from_the_home_with_their_modal(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.members[APPROVERS] = [BOSS]
    ask = {"question": "May I refund order 77 <!here>?", "who": "approvers"}
    gemini.script(function_call("askHuman", ask, id="q1"))
    thread = new_ts()
    assert (await client.dm(team, REQUESTER, "refund order 77", ts=thread))[0] == 200
    await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))

    mine = await open_home(client, team, REQUESTER)
    assert "*question waiting for an answer*" in shown(mine) and buttons(mine, "answer") == []
    boss = await open_home(client, team, BOSS)
    assert "May I refund order 77 &lt;!here&gt;?" in shown(boss) and "<!here>" not in shown(boss)
    assert buttons(boss, "approve") == []  # a question is answered, not approved
    [(_, question)] = buttons(boss, "answer")

    await press(client, team, BOSS, boss, "answer", question)
    (opened,) = await fake_slack.wait_for("views.open")
    modal = opened.args["view"]
    assert modal["callback_id"] == "answer" and json.loads(modal["private_metadata"])["home"]
    gemini.script(text("Refunded."))
    typed = {"answer": {"value": {"type": "plain_text_input", "value": "Yes."}}}
    assert await client.submit(team, BOSS, modal, typed) == (200, "")
    assert (await reply_in_thread(fake_slack, thread)).args["text"] == "Refunded."
    await poll(lambda: len(fake_slack.homes[REQUESTER]) > 1, "the requester's Home refreshed")
    await settle(service)


async def test_untrusted_text_on_the_home_is_escaped(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.members[APPROVERS] = [BOSS]
    nasty = {"amount": 5, "toAccount": "<!channel> <@U123> <https://evil.example|bank>"}
    await ask(client, fake_slack, gemini, team, args=nasty)
    for user in (BOSS, REQUESTER):
        view = shown(await open_home(client, team, user))
        assert "toAccount: &lt;!channel&gt; &lt;@U123&gt; &lt;https://evil" in view
        assert "<!channel>" not in view and "<@U123>" not in view and "<https://evil" not in view


async def test_changes_close_together_publish_a_home_once(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    fake_slack.members[APPROVERS] = [BOSS]
    asked = await ask(client, fake_slack, gemini, team)
    await open_home(client, team, BOSS)
    assert service.deps is not None and service.app is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None
    for _ in range(3):
        service.deps.home.changed(service.app.client, approval)
    await poll(lambda: len(fake_slack.homes[BOSS]) > 1, "the Home refreshed")
    await settle(service)
    assert len(fake_slack.homes[BOSS]) == 2


async def test_own_requests_say_where_they_are(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None
    two = replace(approval, request=replace(approval.request, approvals_needed=2))
    voted = replace(two, votes=(Vote(BOSS, approval.request.requested_at),))
    assert home.status(voted, turn_waits=False) == "1 of 2 approvals"
    decided = replace(approval, decision=Approved(BOSS, approval.request.requested_at))
    assert home.status(decided, turn_waits=False) == "running"
    assert home.status(approval, turn_waits=False) == "waiting for approval"
    # The inbox says what more there is beyond what it shows, and where to see it.
    view = home.home_view(
        inbox=[approval] * (home.ITEMS + 3),
        own=[],
        card_links={},
        thread_links={},
        editable=lambda tool: False,
        policy=None,
        notice=None,
    )
    assert "…and 3 more — see `/approvals pending`" in shown(view)
    assert len(view["blocks"]) <= home.MAX_BLOCKS


async def test_refreshes_go_to_homes_opened_recently_and_at_most_so_many_a_minute(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """A change refreshes only the Homes opened in the last `recent` seconds, and no more
    than `per_minute` of them a minute (the rest wait; views.publish is rate limited)."""
    fake_slack.members[APPROVERS] = [BOSS, ADMIN]
    asked = await ask(client, fake_slack, gemini, team)
    assert service.deps is not None and service.app is not None
    deps = service.deps
    slack = service.app.client
    for user in (BOSS, ADMIN):  # members of this workspace (the client names none)
        fake_slack.users[user] = {"team_id": team}
    clock = [1000.0]
    tabs = home.HomeTabs(
        workflow=deps.workflow,
        people=deps.people,
        background=deps.background,
        links=deps.delivery.link,
        summary=policy_summary,
        delay=0.01,
        recent=60.0,
        per_minute=1,
        now=lambda: clock[0],
    )
    for user in (BOSS, ADMIN):
        await tabs.publish(slack, team, user, opened=True)
    published = {u: len(fake_slack.homes[u]) for u in (BOSS, ADMIN)}
    approval = await deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None
    tabs.changed(slack, approval)

    def more() -> int:
        return sum(len(fake_slack.homes[u]) - published[u] for u in (BOSS, ADMIN))

    await poll(lambda: more() == 1, "one Home refreshed")
    await settle(service)
    assert more() == 1  # the other waits for the next minute
    tabs.close()

    clock[0] += 61.0  # both were opened over a minute ago: no longer refreshed
    published = {u: len(fake_slack.homes[u]) for u in (BOSS, ADMIN)}
    tabs.changed(slack, approval)
    await settle(service)
    assert more() == 0


@pytest.mark.parametrize("service_overrides", [{"MAX_CONCURRENT_TURNS": 1}])
async def test_homes_published_one_after_another_share_one_slot_while_slack_is_slow(
    fake_slack: FakeSlack, team: str, service: Service
) -> None:
    """A publish waits for the person's previous one without a work slot: the previous one
    gave its slot up while Slack answered, and needs one back to finish."""
    assert service.deps is not None and service.app is not None
    fake_slack.delays["views.publish"] = 0.5  # 10 times bot.background.KEEP_SLOT_FOR
    for i in range(2):
        publish = service.deps.home.publish(service.app.client, team, BOSS)
        service.deps.background.spawn(publish, name=f"home {i}")
    await poll(lambda: len(fake_slack.homes.get(BOSS, [])) == 2, "both Homes published")
    await settle(service)
