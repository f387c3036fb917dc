"""The approval workflow end to end on PostgreSQL, with a scripted model and real Genkit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from genkit.model import ModelRequest, ModelResponse

from agent import approval
from agent.outcomes import AwaitingApproval, Busy, DecisionRefused, Reply
from agent.policy import ApproverFacts
from storage.domain import ApprovalState, Approved, Card, CardState, Expired, Finished
from tests.agent.conftest import IN_CHANNEL, Harness
from tests.conftest import poll
from tests.fakes.scripted_model import calls, text, tool_responses

TRANSFER = {"amount": 500, "toAccount": "12345"}


def answer_with_tool_results(request: ModelRequest[Any]) -> ModelResponse:
    return text("results: " + repr(tool_responses(request)))


async def test_approve_runs_the_tool_once_with_the_requested_input(h: Harness) -> None:
    h.model.script(calls(("transferMoney", TRANSFER)), answer_with_tool_results)
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send 500 to 12345")
    assert isinstance(out, AwaitingApproval)
    [approval] = out.approvals
    assert (approval.request.tool, approval.request.input, approval.request.requester) == (
        "transferMoney",
        TRANSFER,
        "U_EMP",
    )
    assert approval.card is not None and approval.card.channel == "C0APPROVE"
    assert "allow-list" in approval.request.why
    assert h.ledger() == []

    decided = await h.workflow.decisions.decide(
        h.team, approval.id, "U_BOSS", approve=True, facts=IN_CHANNEL
    )
    assert decided.turn_ready and isinstance(decided.approval.decision, Approved)
    resumed = await h.workflow.turns.resume(decided.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply)
    assert "'success': True" in resumed.outcome.text
    [entry] = h.ledger()
    assert (entry["amount"], entry["to"], entry["key"]) == (500, "12345", approval.id)
    assert isinstance(resumed.settled[0].execution, Finished)
    assert await h.workflow.turns.resume(decided.turn_id) is None  # nothing left to resume


async def test_every_step_of_an_approval_is_audited_once(h: Harness) -> None:
    h.model.script(calls(("transferMoney", TRANSFER)), answer_with_tool_results)
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send 500 to 12345")
    assert isinstance(out, AwaitingApproval)
    [approval] = out.approvals
    decided = await h.workflow.decisions.decide(
        h.team, approval.id, "U_BOSS", approve=True, reason="ok", facts=IN_CHANNEL
    )
    with pytest.raises(DecisionRefused):  # a second decision writes no second row
        await h.workflow.decisions.decide(
            h.team, approval.id, "U_TWO", approve=True, facts=IN_CHANNEL
        )
    assert await h.workflow.turns.resume(decided.turn_id) is not None
    trail = list(reversed(await h.workflow.reads.audit_trail(h.team)))  # oldest first
    assert [(e.action, e.actor, e.tool, e.approval_id) for e in trail] == [
        ("requested", "U_EMP", "transferMoney", approval.id),
        ("approved", "U_BOSS", "transferMoney", approval.id),
        ("execution_started", "U_BOSS", "transferMoney", approval.id),
        ("executed", "greenlight", "transferMoney", approval.id),
    ]
    assert [e.detail.get("input") for e in trail[:3]] == [TRANSFER] * 3
    assert trail[1].detail["note"] == "ok"  # an Approve's words are its note
    assert trail[3].detail["output"]["success"] is True


async def test_deny_never_runs_the_tool_and_the_model_gets_the_reason(h: Harness) -> None:
    h.model.script(calls(("transferMoney", TRANSFER)), answer_with_tool_results)
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send 500")
    assert isinstance(out, AwaitingApproval)
    decided = await h.workflow.decisions.decide(
        h.team,
        out.approvals[0].id,
        "U_BOSS",
        approve=False,
        reason="not this month",
        facts=IN_CHANNEL,
    )
    resumed = await h.workflow.turns.resume(decided.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply)
    [response] = tool_responses(h.model.requests[-1])
    assert response["output"] == {"ok": False, "error": "denied by U_BOSS: not this month"}
    assert h.ledger() == []


async def test_two_interrupts_resume_together_once_both_are_decided(h: Harness) -> None:
    h.model.script(
        calls(("transferMoney", TRANSFER), ("transferMoney", {"amount": 7, "toAccount": "99"})),
        answer_with_tool_results,
    )
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "two transfers")
    assert isinstance(out, AwaitingApproval) and len(out.approvals) == 2
    first, second = out.approvals
    assert first.id != second.id and len({a.id for a in out.approvals}) == 2

    d1 = await h.workflow.decisions.decide(
        h.team, first.id, "U_BOSS", approve=True, facts=IN_CHANNEL
    )
    assert not d1.turn_ready
    assert await h.workflow.turns.resume(d1.turn_id) is None  # never before every decision
    assert h.ledger() == []
    d2 = await h.workflow.decisions.decide(
        h.team, second.id, "U_BOSS", approve=False, facts=IN_CHANNEL
    )
    assert d2.turn_ready
    resumed = await h.workflow.turns.resume(d2.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply)
    assert [e["to"] for e in h.ledger()] == ["12345"]
    outputs = {r["ref"]: r["output"] for r in tool_responses(h.model.requests[-1])}
    assert len(outputs) == 2
    assert {"ok": False, "error": "denied by U_BOSS"} in outputs.values()


async def test_same_tool_twice_without_refs_gets_unique_refs(h: Harness) -> None:
    h.model.script(
        calls(("transferMoney", TRANSFER), ("transferMoney", TRANSFER)), answer_with_tool_results
    )
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "twice")
    assert isinstance(out, AwaitingApproval) and len(out.approvals) == 2
    for a in out.approvals:
        d = await h.workflow.decisions.decide(
            h.team, a.id, "U_BOSS", approve=True, facts=IN_CHANNEL
        )
    resumed = await h.workflow.turns.resume(d.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, Reply)
    assert sorted(str(e["key"]) for e in h.ledger()) == sorted(a.id for a in out.approvals)


async def test_allowed_tool_runs_without_approval_and_policy_changes_apply_live(h: Harness) -> None:
    await h.workflow.policies.change(h.team, "getBalance", by="U_ADMIN", allowed=True)
    h.model.script(calls(("getBalance", {"account": "1"})), answer_with_tool_results)
    out = await h.workflow.turns.start(h.thread("1.1"), "U_EMP", "balance?")
    assert isinstance(out, Reply) and "balance" in out.text
    assert [e["tool"] for e in h.ledger()] == ["getBalance"]

    await h.workflow.policies.change(h.team, "getBalance", by="U_ADMIN", allowed=False)
    h.model.script(calls(("getBalance", {"account": "2"})))
    out = await h.workflow.turns.start(h.thread("1.1"), "U_EMP", "again")
    assert isinstance(out, AwaitingApproval)
    assert len(h.ledger()) == 1


async def test_chained_interrupts_in_one_turn(h: Harness) -> None:
    h.model.script(
        calls(("transferMoney", TRANSFER)),
        calls(("transferMoney", {"amount": 1, "toAccount": "fee"})),
        answer_with_tool_results,
    )
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "transfer and pay the fee")
    assert isinstance(out, AwaitingApproval)
    d = await h.workflow.decisions.decide(
        h.team, out.approvals[0].id, "U_BOSS", approve=True, facts=IN_CHANNEL
    )
    resumed = await h.workflow.turns.resume(d.turn_id)
    assert resumed is not None and isinstance(resumed.outcome, AwaitingApproval)
    [second] = resumed.outcome.approvals
    assert second.request.input == {"amount": 1, "toAccount": "fee"}
    d2 = await h.workflow.decisions.decide(
        h.team, second.id, "U_BOSS", approve=True, facts=IN_CHANNEL
    )
    final = await h.workflow.turns.resume(d2.turn_id)
    assert final is not None and isinstance(final.outcome, Reply)
    assert [e["to"] for e in h.ledger()] == ["12345", "fee"]


async def test_self_approval_and_non_approvers_are_refused(h: Harness) -> None:
    await h.workflow.policies.change(
        h.team, "transferMoney", by="U_ADMIN", approvers=["U_CFO", "S_FIN"]
    )
    h.model.script(calls(("transferMoney", TRANSFER)))
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send")
    assert isinstance(out, AwaitingApproval)
    aid = out.approvals[0].id
    with pytest.raises(DecisionRefused) as self_approval:
        await h.workflow.decisions.decide(h.team, aid, "U_EMP", approve=True, facts=IN_CHANNEL)
    assert self_approval.value.reason == "self_approval"
    with pytest.raises(DecisionRefused) as outsider:
        await h.workflow.decisions.decide(h.team, aid, "U_RANDOM", approve=True, facts=IN_CHANNEL)
    assert outsider.value.reason == "not_an_approver"
    info = await h.workflow.reads.approval(h.team, aid)
    assert info is not None and info.state == ApprovalState.PENDING
    member = ApproverFacts(groups=frozenset({"S_FIN"}))
    assert (
        await h.workflow.decisions.decide(h.team, aid, "U_FIN", approve=False, facts=member)
    ).turn_ready


async def test_fifty_concurrent_approvals_execute_once(h: Harness) -> None:
    h.model.script(calls(("transferMoney", TRANSFER)), answer_with_tool_results)
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send")
    assert isinstance(out, AwaitingApproval)
    aid = out.approvals[0].id

    async def click(i: int) -> str:
        try:
            d = await h.workflow.decisions.decide(
                h.team, aid, f"U_APP{i}", approve=True, facts=IN_CHANNEL
            )
        except DecisionRefused as exc:
            assert exc.reason == "already_decided" and exc.approval is not None
            assert isinstance(exc.approval.decision, Approved)
            return f"told:{exc.approval.decision.by}"
        resumed = await h.workflow.turns.resume(d.turn_id)
        assert resumed is not None
        return f"won:U_APP{i}"

    results = await asyncio.gather(*(click(i) for i in range(50)))
    winners = [r for r in results if r.startswith("won:")]
    assert len(winners) == 1
    assert all(r == "told:" + winners[0][4:] for r in results if r.startswith("told:"))
    assert len(h.ledger()) == 1


async def test_a_resume_that_lost_its_lease_changes_nothing(h: Harness) -> None:
    """A slow resume whose lease ran out is taken over; its late result is dropped."""
    slow_reply_may_go = asyncio.Event()

    async def slow(request: ModelRequest[Any]) -> ModelResponse:
        await slow_reply_may_go.wait()
        return text("late")

    h.model.script(calls(("transferMoney", TRANSFER)), slow, text("taken over"))
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send")
    assert isinstance(out, AwaitingApproval)
    [approval] = out.approvals
    await h.workflow.decisions.decide(h.team, approval.id, "U_BOSS", approve=True, facts=IN_CHANNEL)
    slow_resume = asyncio.create_task(h.workflow.turns.resume(approval.turn_id))
    await poll(lambda: len(h.model.requests) == 2, "the slow resume's model call")
    h.clock.advance(hours=1)  # past its lease
    report = await h.make().follow_ups.sweep(
        h.team
    )  # another replica's recovery takes the turn over
    [taken] = report.resumed
    assert isinstance(taken.outcome, Reply) and taken.outcome.text == "taken over"
    slow_reply_may_go.set()
    assert await slow_resume is None
    assert len(h.ledger()) == 1  # the tool ran once, in the first resume
    follow_up = text("and the thread continues")
    h.model.script(follow_up)
    reply = await h.workflow.turns.start(h.thread(), "U_EMP", "thanks")
    assert isinstance(reply, Reply) and reply.text == "and the thread continues"
    # It continued from the takeover's answer, not from the dropped one.
    said = [p.text for m in h.model.requests[-1].messages for p in m.content if p.text]
    assert "taken over" in said and "late" not in said


async def test_expiry_denies_and_resumes(h: Harness) -> None:
    h.model.script(calls(("transferMoney", TRANSFER)), answer_with_tool_results)
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send")
    assert isinstance(out, AwaitingApproval)
    report = await h.workflow.follow_ups.sweep(h.team)
    assert out.approvals[0].id not in {a.id for a in report.expired}
    h.clock.advance(hours=25)
    report = await h.workflow.follow_ups.sweep(h.team)
    assert [a.id for a in report.expired] == [out.approvals[0].id]
    [resumed] = report.resumed
    assert isinstance(resumed.outcome, Reply)
    [response] = tool_responses(h.model.requests[-1])
    assert response["output"] == {"ok": False, "error": "approval expired"}
    assert h.ledger() == []
    with pytest.raises(DecisionRefused):
        await h.workflow.decisions.decide(
            h.team, out.approvals[0].id, "U_BOSS", approve=True, facts=IN_CHANNEL
        )


async def test_a_waiting_thread_reports_busy_and_runs_nothing(h: Harness) -> None:
    h.model.script(calls(("transferMoney", TRANSFER)))
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send")
    assert isinstance(out, AwaitingApproval)
    again = await h.workflow.turns.start(h.thread(), "U_EMP", "hello?")
    assert isinstance(again, Busy) and [a.id for a in again.waiting_on] == [out.approvals[0].id]
    assert len(h.model.requests) == 1


async def test_racing_first_messages_in_a_new_thread_run_one_turn(h: Harness) -> None:
    """Messages (or replicas) racing to open a new thread: one turn runs, the rest are Busy."""
    h.model.script(text("only once"))
    thread = h.thread()
    outcomes = await asyncio.gather(
        *(h.workflow.turns.start(thread, "U_EMP", "hi") for _ in range(8))
    )
    assert sorted(type(o).__name__ for o in outcomes) == ["Busy"] * 7 + ["Reply"]
    assert len(h.model.requests) == 1
    assert await h.workflow.turns.knows(thread)


async def test_a_click_after_the_deadline_expires_the_request_instead(h: Harness) -> None:
    h.model.script(calls(("transferMoney", TRANSFER)), answer_with_tool_results)
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send")
    assert isinstance(out, AwaitingApproval)
    h.clock.advance(hours=24, seconds=1)
    with pytest.raises(DecisionRefused) as refused:
        await h.workflow.decisions.decide(
            h.team, out.approvals[0].id, "U_BOSS", approve=True, facts=IN_CHANNEL
        )
    assert refused.value.approval is not None
    assert isinstance(refused.value.approval.decision, Expired)
    [resumed] = (await h.workflow.follow_ups.sweep(h.team)).resumed
    assert isinstance(resumed.outcome, Reply)
    assert h.ledger() == []


async def test_the_sweep_reports_approvals_whose_card_was_never_posted(h: Harness) -> None:
    h.model.script(calls(("transferMoney", TRANSFER)))
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send")
    assert isinstance(out, AwaitingApproval)
    assert (
        await h.workflow.follow_ups.sweep(h.team)
    ).uncarded == ()  # a live process is posting it
    h.clock.advance(minutes=2)
    [taken] = (await h.workflow.follow_ups.sweep(h.team)).uncarded
    assert taken.id == out.approvals[0].id
    assert (
        await h.workflow.follow_ups.sweep(h.team)
    ).uncarded == ()  # this sweep has it for a while
    posted = await h.workflow.follow_ups.card_posted(taken, ts="1.1")
    assert posted is not None and posted.card == Card("C0APPROVE", "1.1", CardState.POSTED)
    h.clock.advance(minutes=5)
    assert (await h.workflow.follow_ups.sweep(h.team)).uncarded == ()  # posted: never again


async def test_a_slow_preview_does_not_hold_the_card_back(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(approval, "PREVIEW_TIMEOUT", 0.2)
    slow = {"amount": 5, "toAccount": "slow-preview"}
    h.model.script(calls(("transferMoney", slow), ("transferMoney", TRANSFER)))
    out = await asyncio.wait_for(h.workflow.turns.start(h.thread(), "U_EMP", "two"), 10)
    assert isinstance(out, AwaitingApproval)
    previews = sorted(a.request.preview or "" for a in out.approvals)
    assert previews == ["", "Balance after transfer: 500.00"]  # "": unavailable
    stored = await h.workflow.reads.approval(h.team, out.approvals[0].id)
    assert stored is not None and stored.request.preview == out.approvals[0].request.preview
