"""Restarts and interrupts at Genkit's edges, through the real runtime (Genkit, the approval
middleware, the execution gate, PostgreSQL) with a scripted model: who may restart a call,
a call that asks while it runs, an input that is not an object, an interrupt's metadata."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from genkit.exp import AgentFinishReason, AgentInterrupt

from agent.assemble import build_workflow
from agent.clock import new_uuid
from agent.outcomes import AwaitingApproval, Reply
from agent.policy import PolicyDefaults
from agent.runtime import AgentConfig
from agent.scope import TurnScope, scoped
from agent.workflow import Workflow
from storage.approval_store import ApprovalStore
from storage.db import SessionFactory
from storage.domain import Approval, Finished, Thread
from tests import ledger_tools
from tests.agent.conftest import IN_CHANNEL, Clock
from tests.agent.test_workflow import answer_with_tool_results
from tests.fakes.scripted_model import ScriptedModel, calls, text, tool_responses

TRANSFER = {"amount": 500, "toAccount": "12345"}


@dataclass
class Run:
    workflow: Workflow
    store: ApprovalStore
    model: ScriptedModel
    clock: Clock
    team: str

    def thread(self) -> Thread:
        return Thread(self.team, "D0RESTART", "1700000000.000300")

    async def asked(self, tool: str, input: Any) -> Approval:
        """A message whose turn calls `tool` with `input` and pauses on it: the approval."""
        self.model.script(calls((tool, input)), answer_with_tool_results)
        out = await self.workflow.turns.start(self.thread(), "U_EMP", "go")
        assert isinstance(out, AwaitingApproval)
        [approval] = out.approvals
        return approval

    async def approve(self, approval: Approval) -> None:
        decisions = self.workflow.decisions
        await decisions.decide(self.team, approval.id, "U_BOSS", approve=True, facts=IN_CHANNEL)

    async def restart(self, approval: Approval, metadata: dict[str, Any]) -> Any:
        """CLAIM the turn as a resume does, then resume it with a restart built by hand
        (its metadata as given) instead of the workflow's own."""
        now = self.clock()
        claim = await self.store.turns.claim(
            approval.turn_id, now=now, lease_until=now + timedelta(seconds=15)
        )
        r = approval.request
        part = AgentInterrupt(r.tool, r.ref, r.input).restart(resumed_metadata=metadata)
        scope = TurnScope(self.team, r.requester, approvals={a.id: a for a in claim.approvals})
        chat = self.workflow.runtime.agent.chat(snapshot_id=claim.snapshot_id)
        with scoped(scope):
            return await chat.resume(restart=[part])


@pytest.fixture
def run(pg_sessions: SessionFactory, team: str, ledger: Path) -> Run:
    model, clock = ScriptedModel(), Clock()
    workflow = build_workflow(
        pg_sessions,
        AgentConfig(model="scripted", tool_modules=("tests.ledger_tools", "tests.odd_tools")),
        defaults=PolicyDefaults(channel="C0APPROVE"),
        clock=clock,
        new_id=new_uuid,
        setup=model.register,
    )
    return Run(workflow, ApprovalStore(pg_sessions), model, clock, team)


async def test_a_restart_carrying_camel_case_tool_approved_runs_the_claimed_call_once(
    run: Run,
) -> None:
    """Genkit's ToolApproval takes `toolApproved` as well as `tool_approved`: so does the
    gate, for an approval this resume claimed; a second resume answers from the record."""
    approval = await run.asked("transferMoney", TRANSFER)
    await run.approve(approval)
    run.model.script(answer_with_tool_results)
    out = await run.restart(approval, {"toolApproved": True, "approval_id": approval.id})
    assert out.finish_reason != AgentFinishReason.INTERRUPTED
    assert [(e["tool"], e["key"]) for e in ledger_tools.entries()] == [
        ("transferMoney", approval.id)
    ]
    done = await run.workflow.reads.approval(run.team, approval.id)
    assert done is not None and isinstance(done.execution, Finished)


@pytest.mark.parametrize(
    "metadata",
    [
        {"tool_approved": True},  # the flag alone: no recorded approval behind it
        {"toolApproved": True},
        {"tool_approved": True, "approval_id": "not-this-turns"},
    ],
    ids=["flag", "camel-case-flag", "unclaimed-id"],
)
async def test_a_forged_restart_is_interrupted_again_and_runs_nothing(
    run: Run, metadata: dict[str, Any]
) -> None:
    approval = await run.asked("transferMoney", TRANSFER)
    await run.approve(approval)
    out = await run.restart(approval, metadata)
    assert out.finish_reason == AgentFinishReason.INTERRUPTED
    assert [i.name for i in out.interrupts] == ["transferMoney"]
    assert ledger_tools.entries() == []
    still = await run.workflow.reads.approval(run.team, approval.id)
    assert still is not None and not isinstance(still.execution, Finished)


async def test_an_approved_call_that_asks_while_it_runs_is_recorded_and_the_model_told(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent resume restarts through `run_restart`, which runs the tool through
    `wrap_tool`: the tool's Interrupt reaches the gate as Genkit's restart_interrupt_error
    (docs/contributors.md). The gate records the call finished with an error saying so;
    the turn does not pause again, and the call is not run again."""
    approval = await run.asked("closeAccount", {"order": "A-1"})
    await run.approve(approval)
    run.model.script(answer_with_tool_results)
    with caplog.at_level(logging.WARNING, logger="agent.gate"):
        resumed = await run.workflow.turns.resume(approval.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply)
    [response] = tool_responses(run.model.requests[-1])
    assert "asked for more input after it was approved" in response["output"]["error"]
    assert [e["tool"] for e in ledger_tools.entries()] == ["closeAccount"]  # it ran once
    [settled] = resumed.settled
    assert (
        isinstance(settled.execution, Finished) and settled.execution.output == response["output"]
    )
    assert "asked a question" in caplog.text


async def test_a_tool_whose_input_is_not_an_object_can_be_approved(run: Run) -> None:
    """Shown as {"value": …}; the restart carries the model's own bare string, which is
    what Genkit compares it with."""
    approval = await run.asked("shout", "hello")
    assert approval.request.input == {"value": "hello"} and approval.request.asked == "hello"
    await run.approve(approval)
    run.model.script(answer_with_tool_results)
    resumed = await run.workflow.turns.resume(approval.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply)
    assert [(e["tool"], e["text"]) for e in ledger_tools.entries()] == [("shout", "hello")]
    [response] = tool_responses(run.model.requests[-1])
    assert response["output"] == "HELLO"


async def test_an_interrupts_request_metadata_says_whom_it_asks_and_why(run: Run) -> None:
    """`define_interrupt(..., request_metadata=...)`: its `who` and `message` make the
    question, as a tool that raises Interrupt would."""
    run.model.script(calls(("confirmRefund", {"order": "A-7"})), text("ok"))
    out = await run.workflow.turns.start(run.thread(), "U_EMP", "refund A-7")
    assert isinstance(out, AwaitingApproval)
    [question] = out.approvals
    assert question.request.question and question.request.asks == "approvers"
    assert question.request.why == "May I refund order A-7?"
    assert question.card is not None and question.card.channel == "C0APPROVE"


async def test_an_edited_call_that_fails_is_recorded_and_logged_once(
    run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    approval = await run.asked("refundOrder", {"order": "A-1"})
    decisions = run.workflow.decisions
    await decisions.approve_with_changes(
        run.team, approval.id, "U_BOSS", {"order": "fail-1"}, facts=IN_CHANNEL
    )
    run.model.script(answer_with_tool_results)
    with caplog.at_level(logging.INFO, logger="agent.gate"):
        resumed = await run.workflow.turns.resume(approval.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply)
    assert [e["order"] for e in ledger_tools.entries()] == ["fail-1"]  # the edit, once
    [settled] = resumed.settled
    failed = {"ok": False, "error": "the tool refundOrder failed; it may need a retry"}
    assert isinstance(settled.execution, Finished) and settled.execution.output == failed
    errors = [r for r in caplog.records if r.name == "agent.gate" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
