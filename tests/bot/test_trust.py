"""Approvals an auditor would sign off (issue 12): who may decide, and exactly what they
approve. Each rule against the real service, fake Slack, fake Gemini and PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent.workflow import Expired, Reply
from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import ADMIN, APPROVERS, SlackClient, settle
from tests.bot.test_e2e import BOSS, ask, text_of
from tests.conftest import poll
from tests.fakes.gemini import FakeGemini, text
from tests.fakes.slack_api import FakeSlack


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
    approval = await service.deps.workflow.approval(team, asked.approval_id)
    assert approval is not None
    deadline = approval.request.expires_at.timestamp()
    await poll(lambda: time.time() > deadline, "the approval's deadline")
    assert (await client.click(team, BOSS, "approve", asked.card))[0] == 200
    (ephemeral,) = await fake_slack.wait_for("chat.postEphemeral")
    assert ephemeral.args["user"] == BOSS and ephemeral.args["channel"] == APPROVERS
    assert text_of(ephemeral).startswith("Already expired")
    await settle(service)
    after = await service.deps.workflow.approval(team, asked.approval_id)
    assert after is not None and isinstance(after.decision, Expired)
    assert ledger_tools.entries() == []
    trail = [(e.action, e.actor) for e in await service.deps.workflow.audit_trail(team)]
    assert ("expired", "greenlight") in trail and ("approved", BOSS) not in trail
    await finish_expired(service, gemini, team)


async def finish_expired(service: Service, gemini: FakeGemini, team: str) -> None:
    """The sweep resumes the expired turn: the model is told, and no turn is left idle for
    the next test's service to find."""
    assert service.deps is not None
    gemini.script(text("That request expired."))
    [resumed] = (await service.deps.workflow.sweep(team)).resumed
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
    (ephemeral,) = await fake_slack.wait_for("chat.postEphemeral", timeout=10)
    assert text_of(ephemeral).startswith("Already expired"), text_of(ephemeral)
    await settle(service)
    assert service.deps is not None
    after = await service.deps.workflow.approval(team, asked.approval_id)
    assert after is not None and isinstance(after.decision, Expired)
    assert ledger_tools.entries() == []
    await finish_expired(service, gemini, team)
