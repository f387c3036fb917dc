"""Approvals an auditor would sign off (issue 12): who may decide, and exactly what they
approve. Each rule against the real service, fake Slack, fake Gemini and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.outcomes import Reply
from bot.clicks import CLICKS
from bot.server import Service
from bot.settings import ConfigError
from storage.db import SessionFactory
from storage.domain import CardState, Denied, Expired
from storage.models import ApprovalRow
from tests import ledger_tools
from tests.bot.conftest import (
    ADMIN,
    APPROVERS,
    SlackClient,
    bot_settings,
    in_channel,
    new_ts,
    settle,
)
from tests.bot.test_e2e import BOSS, TRANSFER, ask, decided_card, reply_in_thread, said, text_of
from tests.conftest import pg_test_url, poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import BOT_USER_ID, FakeSlack

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("service_overrides", [{"APPROVAL_TIMEOUT_SECONDS": 1}])
async def test_a_decision_after_the_deadline_changes_nothing(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None
    deadline = approval.request.expires_at.timestamp()
    await poll(lambda: time.time() > deadline, "the approval's deadline")
    assert (await client.click(team, BOSS, "approve", asked.card))[0] == 200
    (ephemeral,) = await fake_slack.wait_for("chat.postEphemeral")
    assert ephemeral.args["user"] == BOSS and ephemeral.args["channel"] == APPROVERS
    assert text_of(ephemeral).startswith("Already expired")
    await settle(service)
    after = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert after is not None and isinstance(after.decision, Expired)
    assert ledger_tools.entries() == []
    trail = [(e.action, e.actor) for e in await service.deps.workflow.reads.audit_trail(team)]
    assert ("expired", "greenlight") in trail and ("approved", BOSS) not in trail
    await finish_expired(service, gemini, team)


async def finish_expired(service: Service, gemini: FakeGemini, team: str) -> None:
    """The sweep resumes the expired turn: the model is told, and no turn is left idle for
    the next test's service to find."""
    assert service.deps is not None
    gemini.script(text("That request expired."))
    [resumed] = (await service.deps.workflow.follow_ups.sweep(team)).resumed
    assert isinstance(resumed.outcome, Reply) and resumed.outcome.text == "That request expired."
    assert gemini.function_responses()[-1]["response"]["content"]["error"] == "approval expired"


@pytest.mark.parametrize("service_overrides", [{"APPROVAL_TIMEOUT_SECONDS": 1}])
async def test_a_click_whose_lookups_outlast_the_deadline_changes_nothing(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    """Clicked in time, but Slack took long to say BOSS is in the approver group: the
    decision's own write checks the deadline, so the request expires, nothing runs."""
    _, answer = await client.command(team, ADMIN, "approvers transferMoney <!subteam^SFIN>")
    assert answer.startswith("Done.")
    fake_slack.usergroups["SFIN"] = [BOSS]
    fake_slack.delays["usergroups.users.list"] = 1.5
    asked = await ask(client, fake_slack, gemini, team)
    assert (await client.click(team, BOSS, "approve", asked.card))[0] == 200
    (ephemeral,) = await fake_slack.wait_for("chat.postEphemeral")
    assert text_of(ephemeral).startswith("Already expired"), text_of(ephemeral)
    await settle(service)
    assert service.deps is not None
    after = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert after is not None and isinstance(after.decision, Expired)
    assert ledger_tools.entries() == []
    await finish_expired(service, gemini, team)


# -- 1. A public channel is not an approver group ---------------------------------------------


async def test_a_public_approver_channel_stops_the_service_at_start(
    fake_slack: FakeSlack, gemini: FakeGemini, bot_database: str
) -> None:
    fake_slack.channels[APPROVERS] = {"is_private": False}
    svc = Service(bot_settings(fake_slack, gemini, DATABASE_URL=bot_database), host="127.0.0.1")
    with pytest.raises(ConfigError) as refused:
        await svc.start()
    await svc.stop()
    assert "APPROVER_CHANNEL C0APPROVE is a public channel" in refused.value.render()
    assert svc.port is None  # it never listened


async def test_the_cli_exits_2_naming_a_public_approver_channel(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    fake_slack.channels["C0PUBLIC"] = {"is_private": False}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GEMINI_"))}
    env |= {
        "SLACK_BOT_TOKEN": "xoxb-test",
        "SLACK_SIGNING_SECRET": "s",
        "SLACK_API_URL": fake_slack.base_url,
        "GEMINI_API_KEY": "k",
        "APPROVER_CHANNEL": "C0PUBLIC",
        "DATABASE_URL": pg_test_url(),
        "PORT": "0",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", env=env, cwd=ROOT, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 2, stderr.decode()
    assert "APPROVER_CHANNEL C0PUBLIC is a public channel" in stderr.decode()
    assert "Traceback" not in stderr.decode()


async def test_a_route_to_a_public_channel_is_refused_until_approvers_are_named(
    client: SlackClient, fake_slack: FakeSlack, team: str, service: Service
) -> None:
    fake_slack.channels["C0PRIVATE"] = {"is_private": True}  # "C0PUBLIC": public by default
    _, refused = await client.command(team, ADMIN, "route transferMoney <#C0PUBLIC|general>")
    assert "<#C0PUBLIC> is a public channel" in refused and "Nothing was changed" in refused
    assert "`/approvals approvers transferMoney @user @group`" in refused
    _, listing = await client.command(team, ADMIN, "list")
    assert "`transferMoney` — needs approval · <#C0APPROVE>" in listing
    _, done = await client.command(team, ADMIN, "route transferMoney <#C0PRIVATE|finance>")
    assert done.startswith("Done.") and "<#C0PRIVATE>" in done
    # Resetting the approvers to "the channel's members" checks the channel too.
    _, named = await client.command(team, ADMIN, "approvers transferMoney <@UCFO>")
    assert named.startswith("Done.")
    _, public = await client.command(team, ADMIN, "route transferMoney C0PUBLIC")
    assert public.startswith("Done.")  # named approvers decide; the channel only shows cards
    _, reset = await client.command(team, ADMIN, "approvers transferMoney channel")
    assert "<#C0PUBLIC> is a public channel" in reset
    _, listing = await client.command(team, ADMIN, "list")
    assert "approvers: <@UCFO>" in listing


async def test_a_card_in_a_public_channel_quotes_nothing_of_the_conversation(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """A route to a public channel is allowed once approvers are named; anyone can read
    that channel, so its card carries no quotes of the conversation."""
    assert (await client.command(team, ADMIN, "approvers transferMoney <@UCFO>"))[1].startswith(
        "Done."
    )
    assert (await client.command(team, ADMIN, "route transferMoney C0PUBLIC"))[1].startswith(
        "Done."
    )
    gemini.script(function_call("transferMoney", TRANSFER, id="call-1"))
    status, _ = await client.dm(team, "UEMP", "secret plan: send 500 to 12345", ts=new_ts())
    assert status == 200
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel("C0PUBLIC"))
    shown = json.dumps(card.args["blocks"], ensure_ascii=False)
    assert "secret plan" not in shown and "asked:" not in shown
    assert "not quoted here: this channel is public" in shown
    assert "12345" in shown  # the call itself is shown in full
    await settle(service)


async def test_a_click_in_an_approver_channel_made_public_is_refused(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    fake_slack.channels[APPROVERS] = {"is_private": False}  # someone made it public since
    assert (await client.click(team, BOSS, "approve", asked.card))[0] == 200
    (ephemeral,) = await fake_slack.wait_for("chat.postEphemeral")
    assert ephemeral.args["user"] == BOSS
    assert "go to a channel anyone can join" in text_of(ephemeral)
    await settle(service)
    assert service.deps is not None
    still = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert still is not None and still.decision is None and ledger_tools.entries() == []


# -- 2. Four eyes over the whole conversation -------------------------------------------------


async def test_nobody_whose_message_led_to_the_call_may_approve_it(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """In a channel, A asks the bot something, B asks for the transfer in the same thread:
    A planted the instruction as much as B asked for it, so A's Approve is refused."""
    channel, a, b, third = "C0TEAM", "UALICE", "UBOB", "UCAROL"
    top = new_ts()
    gemini.script(text("Noted: pay the vendor when someone asks."))
    mention = sp.app_mention_event(team, a, channel, f"<@{BOT_USER_ID}> remember the vendor", top)
    assert (await client.send(mention))[0] == 200
    await said(fake_slack, "Noted: pay the vendor when someone asks.", channel)
    await settle(service)
    gemini.script(function_call("transferMoney", TRANSFER, id="call-1"))
    reply = sp.message_channel_event(team, b, channel, "thanks, go ahead", new_ts(), top)
    assert (await client.send(reply))[0] == 200
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    shown = json.dumps(card.args["blocks"])
    assert f"*Requested by* <@{b}>" in shown and f"also in the conversation: <@{a}>" in shown

    assert (await client.click(team, a, "approve", card))[0] == 200
    (refused,) = await fake_slack.wait_for("chat.postEphemeral")
    assert refused.args["user"] == a
    assert "took part in the conversation that led to this request" in text_of(refused)
    await settle(service)
    assert ledger_tools.entries() == []

    gemini.script(text("Sent."))
    assert (await client.click(team, third, "approve", card))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=decided_card(f"Approved by <@{third}>"))
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)


# -- 8. Nothing auto-linked or unfurled ---------------------------------------------------------


async def test_no_message_is_unfurled_and_no_text_is_auto_linked(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args={"amount": 5, "toAccount": "#general"})
    gemini.script(text("Sent. Receipt: https://evil.example/track?u=1 — ask @channel"))
    assert (await client.click(team, BOSS, "approve", asked.card))[0] == 200
    reply = await reply_in_thread(fake_slack, asked.thread_ts)
    await settle(service)
    posts = fake_slack.calls_to("chat.postMessage")
    # the placeholder (later the note), the card, the reply: a quick reply is one message
    assert len(posts) == 3
    for post in posts:
        assert post.args.get("unfurl_links") in (False, "0", "false"), post.args
        assert post.args.get("unfurl_media") in (False, "0", "false"), post.args
    for message in (reply, asked.card, asked.note):
        objects = [b["text"] for b in message.args.get("blocks", []) if "text" in b]
        mrkdwn = [o for o in objects if o.get("type") == "mrkdwn"]
        assert mrkdwn and all(o.get("verbatim") is True for o in mrkdwn)
    assert "https://evil.example/track?u=1" in text_of(reply)
    # (A reply long enough to stream sends its URLs as code: tests/bot/test_streaming.py.)


# -- 7. No truncation without the whole ---------------------------------------------------------


async def test_show_full_request_opens_the_whole_input(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    padded = {"amount": 5, "toAccount": "12345" + " " * 4000 + "99999"}
    asked = await ask(client, fake_slack, gemini, team, args=padded)
    assert "99999" not in json.dumps(asked.card.args["blocks"])
    assert (await client.click(team, BOSS, "show_request", asked.card))[0] == 200
    (opened,) = await fake_slack.wait_for("views.open")
    view = opened.args["view"]
    assert view["title"]["text"] == "Full request"
    assert "99999" in json.dumps(view) and json.dumps(view).count(" ") > 4000
    await settle(service)
    assert service.deps is not None  # looking changed nothing: still pending, nothing ran
    still = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert still is not None and still.decision is None and ledger_tools.entries() == []


# -- 5. Invalid arguments never reach an approver -----------------------------------------------


async def test_a_call_with_invalid_input_gets_no_card_and_the_model_hears_why(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(
        function_call("transferMoney", {"amount": "lots", "toAccount": "12345"}, id="call-1"),
        text("Sorry, how much exactly?"),
    )
    ts = new_ts()
    assert (await client.dm(team, "UEMP", "send lots to 12345", ts=ts))[0] == 200
    await said(fake_slack, "Sorry, how much exactly?")
    await settle(service)
    assert [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)] == []
    [answer] = gemini.function_responses()
    error = answer["response"]["content"]["error"]
    assert "invalid input for transferMoney" in error and "amount" in error
    assert ledger_tools.entries() == []
    assert service.deps is not None and await service.deps.workflow.reads.pending(team) == ()


# -- 10. Abuse of the buttons -------------------------------------------------------------------


async def test_refused_clicks_leave_the_card_alone_and_are_throttled(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    updates = len(fake_slack.calls_to("chat.update"))
    for _ in range(CLICKS + 2):
        assert (await client.click(team, "UEMP", "approve", asked.card))[0] == 200
    notes = await fake_slack.wait_for("chat.postEphemeral", count=CLICKS + 1)
    await settle(service)
    said = [text_of(c) for c in fake_slack.calls_to("chat.postEphemeral")]
    assert said.count("You asked for this, so someone else has to approve it.") == CLICKS
    assert sum("clicking quickly" in t for t in said) == 1 and len(said) == len(notes)
    assert len(fake_slack.calls_to("chat.update")) == updates  # no redraw: nothing changed
    assert service.deps is not None
    still = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert still is not None and still.decision is None


# -- 9. A tool's preview on its card ------------------------------------------------------------


async def test_the_card_shows_the_tools_preview(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args={"amount": 250, "toAccount": "1"})
    assert "*Preview:* Balance after transfer: 750.00" in json.dumps(asked.card.args["blocks"])


async def test_a_failed_preview_is_shown_as_unavailable_and_the_card_still_goes_out(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    broken = {"amount": 250, "toAccount": "broken-preview"}
    asked = await ask(client, fake_slack, gemini, team, args=broken)
    shown = json.dumps(asked.card.args["blocks"])
    assert "Preview unavailable" in shown and "preview API is down" not in shown


# -- 11. No duplicate cards; a card Slack refuses is reported ---------------------------------


async def cut_off(sessions: SessionFactory, approval_id: str) -> None:
    """As if the process died posting the card, a while ago (before or after Slack had it)."""
    async with sessions.begin() as db:
        row = await db.get_one(ApprovalRow, approval_id)
        row.card_state, row.card_ts = CardState.POSTING, None
        row.card_attempted_at = datetime.now(UTC) - timedelta(minutes=5)


async def sweep(service: Service, team: str) -> None:
    assert service.deps is not None and service.app is not None
    report = await service.deps.workflow.follow_ups.sweep(team)
    await service.deps.delivery.sweep(service.app.client, report)


@pytest.mark.parametrize("reached_slack", [True, False])
async def test_a_card_post_cut_off_is_finished_once(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
    reached_slack: bool,
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    await settle(service)
    posted_ts = next(ts for ts, m in fake_slack.messages.items() if m.get("channel") == APPROVERS)
    if not reached_slack:
        del fake_slack.messages[posted_ts]
    await cut_off(bot_sessions, asked.approval_id)
    cards_before = len(
        [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)]
    )
    await sweep(service, team)
    await sweep(service, team)  # and again: nothing more
    cards = [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)]
    assert len(cards) == cards_before + (0 if reached_slack else 1)
    assert service.deps is not None
    now = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert now is not None and now.card is not None and now.card.state == CardState.POSTED
    live = [ts for ts, m in fake_slack.messages.items() if m.get("channel") == APPROVERS]
    assert live == [now.card.ts]  # one live card
    assert (now.card.ts == posted_ts) == reached_slack  # found in the channel, not posted again


async def test_a_card_slack_refuses_is_reported_to_the_requester_and_not_retried(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(function_call("transferMoney", TRANSFER, id="call-1"))
    ts = new_ts()
    original = fake_slack.handlers["chat.postMessage"]

    def refuse_cards(args: dict[str, Any]) -> dict[str, Any]:
        if args.get("channel") == APPROVERS:
            return {"ok": False, "error": "not_in_channel"}
        return original(args)

    fake_slack.handlers["chat.postMessage"] = refuse_cards
    assert (await client.dm(team, "UEMP", "send 500 to 12345", ts=ts))[0] == 200
    (told,) = await fake_slack.wait_for(
        "chat.postMessage", predicate=lambda c: "couldn't post the approval request" in text_of(c)
    )
    assert told.args["thread_ts"] == ts and "`/approvals pending`" in text_of(told)
    await settle(service)
    _, pending = await client.command(team, ADMIN, "pending")
    assert "its card could not be posted" in pending
    fake_slack.handlers["chat.postMessage"] = original
    tries = len(fake_slack.calls_to("chat.postMessage"))
    await sweep(service, team)
    assert len(fake_slack.calls_to("chat.postMessage")) == tries  # failed for good: no retry
    assert service.deps is not None
    trail = [e.action for e in await service.deps.workflow.reads.audit_trail(team)]
    assert "card_failed" in trail


# -- 6. Nothing hidden --------------------------------------------------------------------------


async def test_a_hidden_character_in_an_argument_is_shown_and_flagged_on_the_card(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    sneaky = {"amount": 5, "toAccount": "1234\u202e98765"}  # Slack would show 123456789
    asked = await ask(client, fake_slack, gemini, team, args=sneaky)
    sent = json.dumps(asked.card.args, ensure_ascii=False)
    assert "\u202e" not in sent
    assert "1234\\\\u202e98765" in sent and "contains hidden characters" in sent


async def test_nul_characters_are_stripped_and_call_refs_are_greenlights_own(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """PostgreSQL cannot store NUL in text: a call's input and a deny reason holding one are
    stored (and shown, and run) without it. The model's own call id is replaced by ours."""
    asked = await ask(
        client, fake_slack, gemini, team, args={"amount": 5, "toAccount": "12\x00345"}
    )
    assert service.deps is not None
    stored = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert stored is not None and stored.request.input == {"amount": 5, "toAccount": "12345"}
    assert stored.request.ref and stored.request.ref != "call-1"
    assert "\\u0000" not in json.dumps(asked.card.args["blocks"])  # nothing hidden to flag

    status, _ = await client.click(team, BOSS, "deny", asked.card)
    assert status == 200
    (opened,) = await fake_slack.wait_for("views.open")
    gemini.script(text("Denied."))
    reason = {"reason": {"reason": {"type": "plain_text_input", "value": "no\x00pe"}}}
    status, _ = await client.submit(team, BOSS, opened.args["view"], reason)
    assert status == 200
    await fake_slack.wait_for("chat.update", predicate=decided_card("Denied by"))
    await settle(service)
    denied = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert denied is not None and isinstance(denied.decision, Denied)
    assert denied.decision.reason == "nope"
    assert ledger_tools.entries() == []


@pytest.mark.parametrize(
    "who",
    [{"is_restricted": True}, {"is_ultra_restricted": True}, {"team_id": "T0OTHERORG"}],
    ids=["guest", "single-channel guest", "another organisation"],
)
async def test_guests_and_people_of_other_organisations_cannot_approve_or_administer(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    who: dict[str, Any],
) -> None:
    """Even in the approver channel, and even as a workspace admin by Slack's flags."""
    fake_slack.users["UGUEST"] = {"is_admin": True, **who}
    asked = await ask(client, fake_slack, gemini, team)
    assert (await client.click(team, "UGUEST", "approve", asked.card))[0] == 200
    (ephemeral,) = await fake_slack.wait_for("chat.postEphemeral")
    assert "Guests and people of other organisations" in text_of(ephemeral)
    _, answer = await client.command(team, "UGUEST", "allow transferMoney")
    assert answer.startswith("Only workspace admins")
    await settle(service)
    assert service.deps is not None
    still = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert still is not None and still.decision is None and ledger_tools.entries() == []


@pytest.mark.parametrize(
    ("who", "said"),
    [
        ({"is_restricted": True}, "a guest of this workspace"),
        ({"is_ultra_restricted": True}, "a guest of this workspace"),
        ({"team_id": "T0OTHERORG"}, "of another organisation (Slack Connect)"),
        ({}, None),
    ],
    ids=["guest", "single-channel guest", "another organisation", "a member"],
)
async def test_a_request_from_a_guest_or_another_organisation_says_so_on_the_card(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    who: dict[str, Any],
    said: str | None,
) -> None:
    """Issue 21 §8: the approvers see who is asking; a member's card says nothing of it."""
    fake_slack.users["UVISITOR"] = who
    asked = await ask(client, fake_slack, gemini, team, requester="UVISITOR")
    (requested_by,) = [
        b["text"]["text"]
        for b in asked.card.args["blocks"]
        if "Requested by" in b.get("text", {}).get("text", "")
    ]
    for marker in ("a guest of this workspace", "of another organisation"):
        assert (marker in requested_by) == (said is not None and marker in said), requested_by
