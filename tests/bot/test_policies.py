"""Issue 13: POLICY_FILE and its CEL rules, through the running service."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import (
    ADMIN,
    APPROVERS,
    SlackClient,
    in_channel,
    new_ts,
    policy_file,
    settle,
)
from tests.bot.test_e2e import ask, said, text_of
from tests.conftest import poll
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import Call, FakeSlack

POLICY = """\
# A payments team's policy
allow: [getBalance]
tools:
  transferMoney:
    timeout: 4h
    rules:
      - when: "args.amount <= 100"
        allow: true
      - when: "args.amount > 10000"
        approvals: 2
      - when: "args.amount * 2 > 1000"   # a type error in CEL for a fractional amount
        timeout: 1h
"""


@pytest.fixture
def service_overrides(tmp_path: Path, fake_slack: FakeSlack, team: str) -> dict[str, Any]:
    return policy_file(fake_slack, team, tmp_path / "policy.yml", POLICY)


async def test_a_rule_lets_small_calls_run_without_a_card(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(function_call("transferMoney", {"amount": 50, "toAccount": "9"}), text("Sent."))
    ts = new_ts()
    assert (await client.dm(team, "UEMP", "send 50 to 9", ts=ts))[0] == 200
    await said(fake_slack, "Sent.")
    await settle(service)
    assert [e["amount"] for e in ledger_tools.entries()] == [50]
    assert [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)] == []
    assert service.deps is not None
    trail = [
        (e.action, e.actor, e.tool) for e in await service.deps.workflow.reads.audit_trail(team)
    ]
    assert ("policy_changed", "policy-file", "transferMoney") in trail
    assert ("policy_changed", "policy-file", "getBalance") in trail


async def test_a_call_no_rule_allows_needs_approval_and_a_failing_rule_says_so(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args={"amount": 2000.5, "toAccount": "9"})
    shown = json.dumps(asked.card.args["blocks"])
    assert "rule 3 (`args.amount * 2 &gt; 1000`) could not be evaluated" in shown
    assert ledger_tools.entries() == []
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert approval is not None  # the file's 4h, not the rule's 1h: the rule never matched
    request = approval.request
    assert (request.expires_at - request.requested_at).total_seconds() == 4 * 3600


async def test_list_and_rules_show_the_policy_and_allow_require_switch_the_rules(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    _, listing = await client.command(team, ADMIN, "list")
    assert "`getBalance` — runs freely" in listing
    assert "`transferMoney` — needs approval" in listing and "3 rules" in listing
    _, rules = await client.command(team, ADMIN, "rules transferMoney")
    assert "1. when `args.amount &lt;= 100` → runs freely" in rules
    assert "2. when `args.amount &gt; 10000` → 2 approvals" in rules
    assert "3. when `args.amount * 2 &gt; 1000` → timeout 1h" in rules
    _, done = await client.command(team, ADMIN, "allow transferMoney")
    assert done.startswith("Done.") and "rules" not in done  # allowed outright: no rule applies
    _, rules = await client.command(team, ADMIN, "rules transferMoney")
    assert "allowed outright" in rules
    _, back = await client.command(team, ADMIN, "require transferMoney")
    assert "3 rules" in back
    _, none = await client.command(team, ADMIN, "rules getBalance")
    assert none.startswith("`getBalance` has no rules")


# -- N-of-M -------------------------------------------------------------------------------------

BIG = {"amount": 20000, "toAccount": "9"}


async def test_a_rule_raises_the_quorum_and_each_approver_counts_once(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args=BIG)
    assert "0 of 2 approvals:* none yet" in json.dumps(asked.card.args["blocks"])
    assert (await client.click(team, "UBOSS", "approve", asked.card))[0] == 200
    (progress,) = await fake_slack.wait_for("chat.update", predicate=decided("1 of 2"))
    assert "<@UBOSS>" in json.dumps(progress.args["blocks"]) and '"approve"' in json.dumps(
        progress.args["blocks"]
    )  # still has its buttons
    await settle(service)
    assert (await client.click(team, "UBOSS", "approve", asked.card))[0] == 200
    (again,) = await fake_slack.wait_for("chat.postEphemeral")
    assert text_of(again).startswith("You've already approved this; it needs 2 approvals")
    await settle(service)
    assert ledger_tools.entries() == []
    gemini.script(text("Sent 20000."))
    assert (await client.click(team, "UCFO", "approve", asked.card))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=decided("Approved by <@UBOSS> and <@UCFO>"))
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)
    assert service.deps is not None
    trail = [(e.action, e.actor) for e in await service.deps.workflow.reads.audit_trail(team)]
    assert ("approved", "UBOSS") in trail and ("approved", "UCFO") in trail


async def test_one_deny_vetoes_a_quorum(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args=BIG)
    assert (await client.click(team, "UBOSS", "approve", asked.card))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=decided("1 of 2"))
    await settle(service)
    assert (await client.click(team, "UCFO", "deny", asked.card))[0] == 200
    (opened,) = await fake_slack.wait_for("views.open")
    gemini.script(text("Not sent."))
    values = {"reason": {"reason": {"type": "plain_text_input", "value": "too much"}}}
    assert await client.submit(team, "UCFO", opened.args["view"], values) == (200, "")
    await fake_slack.wait_for("chat.update", predicate=decided("Denied by <@UCFO>"))
    await settle(service)
    assert ledger_tools.entries() == []
    assert gemini.function_responses()[-1]["response"]["content"]["error"] == (
        "denied by UCFO: too much"
    )


async def test_twenty_approvers_at_once_on_a_two_approval_card_run_the_tool_once(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args=BIG)
    gemini.script(text("Sent 20000."))
    clicks = [client.click(team, f"UAPPROVER{i:02d}", "approve", asked.card) for i in range(20)]
    assert {status for status, _ in await asyncio.gather(*clicks)} == {200}
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)
    assert len(ledger_tools.entries()) == 1
    assert service.deps is not None
    final = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert final is not None and len(final.votes) == 2 and final.decision is not None


def decided(marker: str) -> Callable[[Call], bool]:
    """A chat.update of the card whose blocks show `marker`."""
    return lambda c: in_channel(APPROVERS)(c) and marker in json.dumps(c.args.get("blocks"))


async def test_an_edit_resets_a_quorum_and_an_approve_of_the_card_as_it_was_is_refused(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args=BIG)
    assert (await client.click(team, "UBOSS", "approve", asked.card))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=decided("1 of 2"))
    await settle(service)

    assert (await client.click(team, "UCFO", "edit_approve", asked.card))[0] == 200
    (opened,) = await fake_slack.wait_for("views.open")
    edited = {
        "amount": {"value": {"type": "number_input", "value": "15000"}},
        "toAccount": {"value": {"type": "plain_text_input", "value": "9"}},
    }
    assert await client.submit(team, "UCFO", opened.args["view"], edited) == (200, "")
    (redrawn,) = await fake_slack.wait_for("chat.update", predicate=decided("Changed by <@UCFO>"))
    shown = json.dumps(redrawn.args["blocks"], ensure_ascii=False)
    assert "1 of 2 approvals:* <@UCFO>" in shown and "~20000~ → 15000" in shown
    await settle(service)

    # UBOSS approved 20000, not 15000: a click on the card as it was changes nothing.
    assert (await client.click(team, "UBOSS", "approve", asked.card))[0] == 200
    (stale,) = await fake_slack.wait_for("chat.postEphemeral")
    assert text_of(stale).startswith("The request was changed since you saw it")
    await settle(service)
    assert ledger_tools.entries() == []

    gemini.script(text("Sent 15000."))
    assert (await client.click(team, "UBOSS", "approve", redrawn))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=decided("Approved by <@UCFO> and <@UBOSS>"))
    await poll(lambda: len(ledger_tools.entries()) == 1, "the transfer")
    await settle(service)
    assert [(e["amount"], e["to"]) for e in ledger_tools.entries()] == [(15000, "9")]
    assert service.deps is not None
    trail = [(e.action, e.actor) for e in await service.deps.workflow.reads.audit_trail(team)]
    assert ("edited", "UCFO") in trail and trail.count(("approved", "UBOSS")) == 2
