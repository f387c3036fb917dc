"""Issue 13: POLICY_FILE and its CEL rules, through the running service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import ADMIN, APPROVERS, SlackClient, in_channel, new_ts, settle
from tests.bot.test_e2e import ask, text_of
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import FakeSlack

POLICY = """\
# A payments team's policy
allow: [getBalance]
tools:
  transferMoney:
    timeout: 4h
    rules:
      - when: "args.amount <= 100"
        allow: true
      - when: "args.amount * 2 > 1000"   # a type error in CEL for a fractional amount
        timeout: 1h
"""


@pytest.fixture
def service_overrides(tmp_path: Path, fake_slack: FakeSlack, team: str) -> dict[str, Any]:
    path = tmp_path / "policy.yml"
    path.write_text(POLICY)
    fake_slack.team_id = team  # auth.test: the workspace the file's policy is written for
    return {"POLICY_FILE": path}


async def test_a_rule_lets_small_calls_run_without_a_card(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(function_call("transferMoney", {"amount": 50, "toAccount": "9"}), text("Sent."))
    ts = new_ts()
    assert (await client.dm(team, "UEMP", "send 50 to 9", ts=ts))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=lambda c: text_of(c) == "Sent.")
    await settle(service)
    assert [e["amount"] for e in ledger_tools.entries()] == [50]
    assert [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)] == []
    assert service.deps is not None
    trail = [(e.action, e.actor, e.tool) for e in await service.deps.workflow.audit_trail(team)]
    assert ("policy_changed", "policy-file", "transferMoney") in trail
    assert ("policy_changed", "policy-file", "getBalance") in trail


async def test_a_call_no_rule_allows_needs_approval_and_a_failing_rule_says_so(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    asked = await ask(client, fake_slack, gemini, team, args={"amount": 2000.5, "toAccount": "9"})
    shown = json.dumps(asked.card.args["blocks"])
    assert "rule 2 (`args.amount * 2 &gt; 1000`) could not be evaluated" in shown
    assert ledger_tools.entries() == []
    assert service.deps is not None
    approval = await service.deps.workflow.approval(team, asked.approval_id)
    assert approval is not None  # the file's 4h, not the rule's 1h: the rule never matched
    request = approval.request
    assert (request.expires_at - request.requested_at).total_seconds() == 4 * 3600


async def test_list_and_rules_show_the_policy_and_allow_require_switch_the_rules(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    _, listing = await client.command(team, ADMIN, "list")
    assert "`getBalance` — runs freely" in listing
    assert "`transferMoney` — needs approval" in listing and "2 rules" in listing
    _, rules = await client.command(team, ADMIN, "rules transferMoney")
    assert "1. when `args.amount &lt;= 100` → runs freely" in rules
    assert "2. when `args.amount * 2 &gt; 1000` → timeout 1h" in rules
    _, done = await client.command(team, ADMIN, "allow transferMoney")
    assert done.startswith("Done.") and "rules" not in done  # allowed outright: no rule applies
    _, rules = await client.command(team, ADMIN, "rules transferMoney")
    assert "allowed outright" in rules
    _, back = await client.command(team, ADMIN, "require transferMoney")
    assert "2 rules" in back
    _, none = await client.command(team, ADMIN, "rules getBalance")
    assert none.startswith("`getBalance` has no rules")
