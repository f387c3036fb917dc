"""The bench's contention phase counts what really ran (bench/contention.py): its card as the
harness reads it (bench/harness.py) names the approval the tool's ledger and the audit trail
name, not the Approve button's value (`<id>~<version>`), which once made it count 0 runs.
Through the real service: the card, several Approve clicks at once, one run."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.contention import _audited, _ledger_runs
from bench.harness import Card, _approve_value
from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import SlackClient, settle
from tests.bot.test_e2e import said
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import FakeSlack

APPROVERS = ("UBOSS", "UCFO", "UOTHERBOSS")


async def test_the_contention_phase_counts_the_one_run_of_a_card_clicked_at_once(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    ledger: Path,
    bot_database: str,
) -> None:
    gemini.script(function_call("transferMoney", {"amount": 5, "toAccount": "ACC-1"}))
    gemini.script(text("Sent."))
    posted = await client.dm_until_card(team, "UEMP", "send 5 to ACC-1")
    blocks = posted.args["blocks"]
    card = Card(0.0, "", _approve_value(blocks), str(posted.args.get("text", "")), blocks)
    assert "~" in card.value and "~" not in card.approval_id  # the button names a version

    clicks = [client.click(team, who, "approve", posted) for who in APPROVERS]
    assert [status for status, _ in await asyncio.gather(*clicks)] == [200] * len(APPROVERS)
    await said(fake_slack, "Sent.")
    await settle(service)

    assert [e["key"] for e in ledger_tools.entries()] == [card.approval_id]
    assert _ledger_runs(ledger, card.approval_id) == 1
    assert await _audited(bot_database, card.approval_id) == 1
