"""The whole flow offline: a scripted model, no Slack, an embedded PostgreSQL in a temporary
directory.

It drives the same workflow the bot uses and prints what each person would see.
"""

from __future__ import annotations

from typing import Any

from genkit import Part, Role
from genkit.exp import Genkit
from genkit.model import Message, ModelRequest, ModelResponse

from agent.assemble import build_workflow
from agent.clock import utc_now
from agent.outcomes import AnsweredInThread, AwaitingApproval, Reply, TurnOutcome
from agent.policy import ApproverFacts, PolicyDefaults
from agent.runtime import AgentConfig
from agent.workflow import Workflow
from bot.card import approval_card, question_card
from bot.terminal import card_as_text
from storage.db import make_engine, make_session_factory
from storage.domain import Thread
from storage.migrate import upgrade

TEAM, EMPLOYEE, APPROVER, CHANNEL = "TDEMO", "UEMPLOYEE", "UAPPROVER", "CAPPROVALS"


def scripted_model(ai: Genkit) -> None:
    """A stand-in for Gemini: asks for the tool the message names (or asks a question when it
    names no account), then reports the result."""

    async def model(request: ModelRequest[Any], ctx: Any) -> ModelResponse:
        last = request.messages[-1]
        if last.role == Role.TOOL:
            result = last.content[0].tool_response
            output = result.output if result else None
            if isinstance(output, dict) and output.get("ok") is False:
                reply = f"I couldn't do that: {output.get('error')}."
            elif isinstance(output, dict) and "approved_with_changes" in output:
                changed = output["approved_with_changes"]
                reply = f"Done, with the approver's changes {changed}: {output['output']}."
            elif isinstance(output, dict) and "answer" in output:
                reply = f'Thanks ("{output["answer"]}"): I\'ll set that up.'
            else:
                reply = f"Done: {output}."
            return ModelResponse(message=Message(role=Role.MODEL, content=[Part.from_text(reply)]))
        said = "".join(p.text or "" for p in last.content)
        if "export" in said.lower():
            call = Part.from_tool_request(
                name="exportData", input={"dataset": "customers", "destination": "me@example.com"}
            )
        elif "landlord" in said.lower():
            question = {"question": "Which account is your landlord's, and how much is the rent?"}
            call = Part.from_tool_request(name="askHuman", input=question)
        else:
            call = Part.from_tool_request(
                name="transferMoney", input={"amount": 500, "toAccount": "12345"}
            )
        return ModelResponse(message=Message(role=Role.MODEL, content=[call]))

    ai.define_model(name="demo", fn=model)


def show(who: str, text: str) -> None:
    print(f"\n── {who} " + "─" * max(0, 60 - len(who)))
    print(text)


async def one_request(
    workflow: Workflow,
    ts: str,
    text: str,
    *,
    approve: bool,
    reason: str | None = None,
    changes: dict[str, Any] | None = None,
) -> None:
    show(f"{EMPLOYEE} (employee, in a DM)", text)
    outcome: TurnOutcome = await workflow.turns.start(Thread(TEAM, "DDEMO", ts), EMPLOYEE, text)
    assert isinstance(outcome, AwaitingApproval), outcome
    approval = outcome.approvals[0]
    description = workflow.runtime.describe(approval.request.tool)
    card = approval_card(approval, description=description, thread_link=None, now=utc_now())
    show(f"Approval card in #{CHANNEL}", card_as_text(card))
    facts = ApproverFacts(in_channel=True)
    if changes is not None:
        show(f"{APPROVER} (approver)", f"clicks Edit & approve, and changes it to {changes}")
        edited = approval.request.input | changes
        decided = await workflow.decisions.approve_with_changes(
            TEAM, approval.id, APPROVER, edited, facts=facts
        )
    else:
        verb = "Approve" if approve else "Deny" + (f' with reason "{reason}"' if reason else "")
        show(f"{APPROVER} (approver)", f"clicks {verb}")
        decided = await workflow.decisions.decide(
            TEAM, approval.id, APPROVER, approve=approve, reason=reason, facts=facts
        )
    show(
        "Card, updated",
        card_as_text(
            approval_card(
                decided.approval, description=description, thread_link=None, now=utc_now()
            )
        ),
    )
    resumed = await workflow.turns.resume(decided.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply), resumed
    show("Greenlight (reply in the employee's thread)", resumed.outcome.text)


async def one_question(workflow: Workflow, ts: str, text: str, answer: str) -> None:
    """The agent asks the employee, in their thread; their reply is the answer."""
    show(f"{EMPLOYEE} (employee, in a DM)", text)
    thread = Thread(TEAM, "DDEMO", ts)
    outcome = await workflow.turns.start(thread, EMPLOYEE, text)
    assert isinstance(outcome, AwaitingApproval), outcome
    question = outcome.approvals[0]
    card = question_card(question, description="", thread_link=None, now=utc_now())
    show("Greenlight (a question in the employee's thread)", card_as_text(card))
    show(f"{EMPLOYEE} (replies in the thread)", answer)
    answered = await workflow.turns.start(thread, EMPLOYEE, answer)
    assert isinstance(answered, AnsweredInThread) and answered.decided.turn_ready, answered
    resumed = await workflow.turns.resume(answered.decided.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply), resumed
    show("Greenlight (reply in the employee's thread)", resumed.outcome.text)


async def run_demo(url: str) -> int:
    """The three stories against the database at `url` (a temporary embedded one)."""
    engine = make_engine(url)
    try:
        await upgrade(engine)
        workflow = build_workflow(
            make_session_factory(engine),
            AgentConfig(model="demo"),
            defaults=PolicyDefaults(channel=CHANNEL),
            setup=scripted_model,
        )
        await one_request(
            workflow,
            "1.0001",
            "Please transfer $500 to account 12345 for rent.",
            approve=True,
            changes={"amount": 300},
        )
        await one_request(
            workflow,
            "1.0002",
            "Export the customers table to me@example.com.",
            approve=False,
            reason="customer data stays in the warehouse",
        )
        await one_question(
            workflow, "1.0003", "Pay my landlord, please.", "Account 12345, $900 a month."
        )
    finally:
        await engine.dispose()
    print("\nThat's the whole loop. Run it for real: see the README's Slack app setup.")
    return 0
