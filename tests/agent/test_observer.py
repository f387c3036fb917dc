"""What the workflow tells its observer (agent/observer.py): each decision, tool execution and
turn once, when it happens, on a real workflow with a scripted model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.assemble import build_workflow
from agent.clock import new_uuid
from agent.outcomes import AwaitingApproval, Busy, Reply
from agent.policy import PolicyDefaults
from agent.runtime import AgentConfig
from agent.workflow import Workflow
from storage.db import SessionFactory
from storage.domain import Thread
from tests.agent.conftest import IN_CHANNEL, Clock, Recorder
from tests.agent.test_workflow import TRANSFER, answer_with_tool_results
from tests.fakes.scripted_model import ScriptedModel, calls


@dataclass
class Observed:
    workflow: Workflow
    model: ScriptedModel
    clock: Clock
    seen: Recorder
    team: str

    def thread(self) -> Thread:
        return Thread(self.team, "D0TEST", "1700000000.000100")


@pytest.fixture
def o(pg_sessions: SessionFactory, team: str, ledger: Path) -> Observed:
    model, clock, seen = ScriptedModel(), Clock(), Recorder()
    workflow = build_workflow(
        pg_sessions,
        AgentConfig(model="scripted", tool_modules=("tests.ledger_tools",)),
        defaults=PolicyDefaults(channel="C0APPROVE"),
        clock=clock,
        new_id=new_uuid,
        setup=model.register,
        observer=seen,
    )
    return Observed(workflow, model, clock, seen, team)


async def test_an_approval_is_observed_from_request_to_reply(o: Observed) -> None:
    o.model.script(calls(("transferMoney", TRANSFER)), answer_with_tool_results)
    out = await o.workflow.turns.start(o.thread(), "U_EMP", "send 500 to 12345")
    assert isinstance(out, AwaitingApproval)
    busy = await o.workflow.turns.start(o.thread(), "U_EMP", "hello?")
    assert isinstance(busy, Busy)
    assert [t for t, _ in o.seen.turns] == ["awaiting_approval", "busy"]
    assert o.seen.turns[1][1] is None  # a busy thread ran nothing

    o.clock.advance(minutes=5)
    decided = await o.workflow.decisions.decide(
        o.team, out.approvals[0].id, "U_BOSS", approve=True, facts=IN_CHANNEL
    )
    assert o.seen.decisions == [("transferMoney", "approved", 300.0)]
    resumed = await o.workflow.turns.resume(decided.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply)
    assert o.seen.executions == [("transferMoney", "ok")]
    assert [t for t, _ in o.seen.turns] == ["awaiting_approval", "busy", "reply"]
    assert await o.workflow.turns.resume(decided.turn_id) is None  # nothing ran: not a turn
    assert len(o.seen.turns) == 3 and len(o.seen.decisions) == 1


async def test_expiry_by_the_sweep_is_observed_once(o: Observed) -> None:
    o.model.script(calls(("transferMoney", TRANSFER)), answer_with_tool_results)
    out = await o.workflow.turns.start(o.thread(), "U_EMP", "send")
    assert isinstance(out, AwaitingApproval)
    o.clock.advance(hours=25)
    report = await o.workflow.follow_ups.sweep(o.team)
    assert len(report.expired) == 1
    await o.workflow.follow_ups.sweep(o.team)
    assert o.seen.decisions == [("transferMoney", "expired", 25 * 3600.0)]
    assert o.seen.executions == []  # an expired call never runs
    assert [t for t, _ in o.seen.turns] == ["awaiting_approval", "reply"]


async def test_a_denial_is_observed_and_runs_nothing(o: Observed) -> None:
    o.model.script(calls(("transferMoney", TRANSFER)), answer_with_tool_results)
    out = await o.workflow.turns.start(o.thread(), "U_EMP", "send")
    assert isinstance(out, AwaitingApproval)
    await o.workflow.decisions.decide(
        o.team, out.approvals[0].id, "U_BOSS", approve=False, facts=IN_CHANNEL
    )
    assert o.seen.decisions == [("transferMoney", "denied", 0.0)]
