"""Issue 21's seams (rules 3, 5 and 6): what is approved is what runs, through the running
service, fake Slack, fake Gemini and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import APPROVERS, SlackClient, in_channel, new_ts, policy_file, settle
from tests.bot.test_e2e import BOSS, REQUESTER, ask, reply_in_thread, said, text_of
from tests.conftest import poll
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import Call, FakeSlack

POLICY = """\
tools:
  transferMoney:
    rules:
      - when: "args.amount >= 100000"
        approvals: 2
  getBalance:
    rules:
      - when: "args.owner == requester"   # getBalance has no owner: it never evaluates
        allow: true
      - when: "args.account.startsWith('EXT')"
        approvals: 2
"""

NOTES = "hello\nworld\n"


@pytest.fixture
def service_overrides(
    request: pytest.FixtureRequest, tmp_path: Path, fake_slack: FakeSlack, team: str
) -> dict[str, Any]:
    """POLICY_FILE for the tests that ask for "policy"; nothing for the others."""
    if getattr(request, "param", None) == "files":
        files = tmp_path / "files"
        files.mkdir()
        (files / "notes.txt").write_text(NOTES)
        (files / "link.txt").symlink_to(files / "notes.txt")
        return {"AGENT_FILES_ROOT": files}
    if getattr(request, "param", None) != "policy":
        return {}
    return policy_file(fake_slack, team, tmp_path / "policy.yml", POLICY)


def card_shows(marker: str) -> Callable[[Call], bool]:
    return lambda c: in_channel(APPROVERS)(c) and marker in json.dumps(c.args.get("blocks"))


# -- 3. Rules that fail, fail safe ---------------------------------------------------------


@pytest.mark.parametrize("service_overrides", ["policy"], indirect=True)
async def test_an_amount_sent_as_a_string_never_runs_on_one_approval(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    """`args.amount >= 100000` cannot compare the string "250000": the strictest outcome of
    the tool's rules applies (two approvals), and the card names the rule."""
    asked = await ask(client, fake_slack, gemini, team, args={"amount": "250000", "toAccount": "9"})
    shown = json.dumps(asked.card.args["blocks"])
    # Either the rule failed on the string (the strictest outcome) or it matched the input as
    # the schema coerced it: two approvals either way, and the card names the rule.
    assert "0 of 2 approvals" in shown and "rule 1" in shown
    assert "`args.amount &gt;= 100000`" in shown
    assert (await client.click(team, "UBOSS", "approve", asked.card))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=card_shows("1 of 2"))
    await settle(service)
    assert ledger_tools.entries() == []  # one approval never runs it
    gemini.script(text("Sent."))
    assert (await client.click(team, "UCFO", "approve", asked.card))[0] == 200
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)
    assert [e["amount"] for e in ledger_tools.entries()] == [250000]
    assert text_of(asked.note)


@pytest.mark.parametrize("service_overrides", ["policy"], indirect=True)
async def test_a_rule_on_a_missing_field_gives_the_strictest_rules_outcome_and_names_it(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    gemini.script(function_call("getBalance", {"account": "ACC-1"}))
    card = await client.dm_until_card(team, REQUESTER, "my balance?")
    shown = json.dumps(card.args["blocks"])
    assert "rule 1 (`args.owner == requester`) could not be evaluated" in shown
    assert "0 of 2 approvals" in shown and "the strictest rule applies (rule 2" in shown
    assert (await client.click(team, "UBOSS", "approve", card))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=card_shows("1 of 2"))
    await settle(service)
    assert ledger_tools.entries() == []
    gemini.script(text("100."))
    assert (await client.click(team, "UCFO", "approve", card))[0] == 200
    await poll(lambda: len(ledger_tools.entries()) == 1, "the balance")
    await settle(service)


# -- 5. File tools show the file that will really be written ----------------------------------


@pytest.mark.parametrize("path", ["notes.txt ", "/notes.txt", "./notes.txt"])
@pytest.mark.parametrize("service_overrides", ["files"], indirect=True)
async def test_a_write_to_a_path_the_middleware_would_normalise_is_refused_before_a_card(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
    path: str,
) -> None:
    """Shown as one file, written as another: refused, and the model is told which path."""
    gemini.script(
        function_call("write_file", {"file_path": path, "content": "overwritten\n"}),
        text("I will use the plain path."),
    )
    assert (await client.dm(team, REQUESTER, "write the notes", ts=new_ts()))[0] == 200
    await said(fake_slack, "I will use the plain path.")
    await settle(service)
    assert [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)] == []
    [response] = gemini.function_responses()
    error = response["response"]["content"]["error"]
    assert "not a plain path" in error and "'notes.txt'" in error and "nobody was asked" in error
    assert (service_overrides["AGENT_FILES_ROOT"] / "notes.txt").read_text() == NOTES


@pytest.mark.parametrize("service_overrides", ["files"], indirect=True)
async def test_an_approved_write_shows_and_writes_the_file_it_resolves_to_once(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    """`link.txt` is a symlink to notes.txt: the card names notes.txt and diffs against its
    content, and the approved write changes that file, once."""
    root: Path = service_overrides["AGENT_FILES_ROOT"]
    gemini.script(function_call("write_file", {"file_path": "link.txt", "content": "hi\n"}))
    ts = new_ts()
    card = await client.dm_until_card(team, REQUESTER, "rewrite the notes", ts=ts)
    shown = json.dumps(card.args["blocks"])
    assert "--- a/notes.txt\\n+++ b/notes.txt\\n" in shown
    assert "\\n-hello\\n-world\\n+hi\\n" in shown
    assert (root / "notes.txt").read_text() == NOTES  # nothing written yet
    gemini.script(text("Rewritten."))
    assert (await client.click(team, BOSS, "approve", card))[0] == 200
    assert (await client.click(team, BOSS, "approve", card))[0] == 200  # a double click
    assert text_of(await reply_in_thread(fake_slack, ts)) == "Rewritten."
    await settle(service)
    assert (root / "notes.txt").read_text() == "hi\n" and (root / "link.txt").is_symlink()
    [response] = gemini.function_responses()
    assert response["name"] == "write_file" and "written successfully" in json.dumps(response)
    assert service.deps is not None  # and the gate let it run once
    trail = await service.deps.workflow.reads.audit_trail(team, "write_file")
    assert [e.action for e in trail].count("execution_started") == 1


# -- 6. Everyone who shaped the call is a participant -----------------------------------------


async def test_whoever_answered_the_turns_question_may_not_approve_what_it_led_to(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Mallory answers "which account?" with ACC-MAL; the call to pay ACC-MAL lists her as a
    participant, her Approve is refused, a third person's works."""
    mallory, carol = "UMALLORY", "UCAROL"
    fake_slack.members[APPROVERS] = [mallory, carol]
    question = {"question": "Which account?", "who": "approvers"}
    gemini.script(function_call("askHuman", question, id="q1"))
    ts = new_ts()
    asked = await client.dm_until_card(team, REQUESTER, "pay the supplier 500", ts=ts)
    assert (await client.click(team, mallory, "answer", asked))[0] == 200
    (opened,) = await fake_slack.wait_for("views.open")
    pay = {"amount": 500, "toAccount": "ACC-MAL"}
    gemini.script(function_call("transferMoney", pay, id="call-1"))
    answer = {"answer": {"value": {"type": "plain_text_input", "value": "ACC-MAL"}}}
    assert await client.submit(team, mallory, opened.args["view"], answer) == (200, "")
    (card,) = await fake_slack.wait_for(
        "chat.postMessage", predicate=card_shows("transferMoney"), count=1
    )
    assert f"<@{mallory}>" in json.dumps(card.args["blocks"])  # listed as a participant
    await settle(service)

    assert (await client.click(team, mallory, "approve", card))[0] == 200
    (refused,) = await fake_slack.wait_for(
        "chat.postEphemeral", predicate=lambda c: c.args.get("user") == mallory
    )
    await settle(service)
    assert ledger_tools.entries() == [], text_of(refused)

    gemini.script(text("Paid."))
    assert (await client.click(team, carol, "approve", card))[0] == 200
    await poll(lambda: len(ledger_tools.entries()) == 1, "the payment")
    await settle(service)
    assert [e["to"] for e in ledger_tools.entries()] == ["ACC-MAL"]


async def test_whoever_denied_with_a_reason_may_not_approve_the_call_it_led_to(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """Dave denies "pay ACC-DEN instead"; the model is sent that and asks to pay ACC-DEN:
    Dave's Approve of it is refused."""
    dave, carol = "UDAVE", "UCAROL"
    fake_slack.members[APPROVERS] = [dave, carol]
    asked = await ask(client, fake_slack, gemini, team)
    assert (await client.click(team, dave, "deny", asked.card))[0] == 200
    (opened,) = await fake_slack.wait_for("views.open")
    gemini.script(function_call("transferMoney", {"amount": 500, "toAccount": "ACC-DEN"}))
    reason = {"reason": {"reason": {"type": "plain_text_input", "value": "pay ACC-DEN instead"}}}
    assert await client.submit(team, dave, opened.args["view"], reason) == (200, "")
    (_, card) = await fake_slack.wait_for(
        "chat.postMessage", predicate=card_shows("transferMoney"), count=2
    )
    assert f"<@{dave}>" in json.dumps(card.args["blocks"])
    await settle(service)
    assert (await client.click(team, dave, "approve", card))[0] == 200
    await fake_slack.wait_for("chat.postEphemeral", predicate=lambda c: c.args["user"] == dave)
    await settle(service)
    assert ledger_tools.entries() == []
    gemini.script(text("Paid."))
    assert (await client.click(team, carol, "approve", card))[0] == 200
    await poll(lambda: len(ledger_tools.entries()) == 1, "the payment")
    await settle(service)
    assert [e["to"] for e in ledger_tools.entries()] == ["ACC-DEN"]
