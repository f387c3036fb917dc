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
from tests.bot.conftest import APPROVERS, SlackClient, in_channel, settle
from tests.bot.test_e2e import ask, text_of
from tests.conftest import poll
from tests.fakes.gemini import FakeGemini, text
from tests.fakes.slack_api import Call, FakeSlack

POLICY = """\
tools:
  transferMoney:
    rules:
      - when: "args.amount >= 100000"
        approvals: 2
"""


@pytest.fixture
def service_overrides(
    request: pytest.FixtureRequest, tmp_path: Path, fake_slack: FakeSlack, team: str
) -> dict[str, Any]:
    """POLICY_FILE for the tests that ask for "policy"; nothing for the others."""
    if getattr(request, "param", None) != "policy":
        return {}
    path = tmp_path / "policy.yml"
    path.write_text(POLICY)
    fake_slack.team_id = team  # auth.test: the workspace the file's policy is written for
    return {"POLICY_FILE": path}


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
    assert "0 of 2 approvals" in shown and "rule 1 (`args.amount &gt;= 100000`)" in shown
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
