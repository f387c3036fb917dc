"""A decision that settles its turn's only request claims the turn in the same write, for
the caller that resumes it at once (`resume_here`); every other case is claimed as before,
by the resume."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from genkit.model import ModelRequest, ModelResponse
from sqlalchemy import select

from agent.outcomes import AwaitingApproval, Decided, Reply
from storage.db import SessionFactory
from storage.domain import Approval
from storage.models import MessageRow, SnapshotRow, TurnRow
from tests.agent.conftest import IN_CHANNEL, Harness
from tests.agent.test_workflow import TRANSFER, answer_with_tool_results
from tests.fakes.scripted_model import calls

OTHER = {"amount": 7, "toAccount": "999"}


async def paused(h: Harness, *requests: dict[str, object]) -> tuple[Approval, ...]:
    h.model.script(calls(*(("transferMoney", r, f"ref-{i}") for i, r in enumerate(requests))))
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send money")
    assert isinstance(out, AwaitingApproval)
    return out.approvals


async def approved_here(h: Harness, approval: Approval) -> Decided:
    return await h.workflow.decisions.decide(
        h.team, approval.id, "U_BOSS", approve=True, facts=IN_CHANNEL, resume_here=True
    )


@pytest.mark.parametrize("approve", [True, False])
async def test_the_decision_claims_the_turn_and_its_resume_runs_the_call_once(
    h: Harness, approve: bool
) -> None:
    [approval] = await paused(h, TRANSFER)
    decided = await h.workflow.decisions.decide(
        h.team, approval.id, "U_BOSS", approve=approve, facts=IN_CHANNEL, resume_here=True
    )
    assert decided.turn_ready and decided.claim is not None
    assert decided.claim.turn_id == approval.turn_id and decided.claim.attempt == 1
    # Claimed: a resume (a sweep, another replica) that claims for itself finds it taken.
    assert await h.workflow.turns.resume(decided.turn_id) is None
    h.model.script(answer_with_tool_results)
    resumed = await h.workflow.turns.resume(decided.turn_id, claim=decided.claim)
    assert resumed is not None and isinstance(resumed.outcome, Reply)
    assert len(h.ledger()) == (1 if approve else 0)
    assert await h.workflow.turns.resume(decided.turn_id, claim=decided.claim) is None


async def test_without_resume_here_nothing_is_claimed(h: Harness) -> None:
    [approval] = await paused(h, TRANSFER)
    decided = await h.workflow.decisions.decide(
        h.team, approval.id, "U_BOSS", approve=True, facts=IN_CHANNEL
    )
    assert decided.turn_ready and decided.claim is None
    h.model.script(answer_with_tool_results)
    assert await h.workflow.turns.resume(decided.turn_id) is not None


async def test_a_turn_of_several_requests_is_claimed_by_its_resume(h: Harness) -> None:
    first, second = await paused(h, TRANSFER, OTHER)
    one = await approved_here(h, first)
    assert not one.turn_ready and one.claim is None
    two = await approved_here(h, second)
    assert two.turn_ready and two.claim is None  # its siblings: the resume reads them
    h.model.script(answer_with_tool_results)
    resumed = await h.workflow.turns.resume(two.turn_id, claim=two.claim)
    assert resumed is not None and len(h.ledger()) == 2


async def test_a_claim_that_waited_is_renewed_before_the_resume_runs(
    h: Harness, pg_sessions: SessionFactory
) -> None:
    [approval] = await paused(h, TRANSFER)
    decided = await approved_here(h, approval)
    h.clock.advance(seconds=14)  # a resume that waited for a slot: 1 s of its lease left
    leases: list[datetime | None] = []

    async def answer(request: ModelRequest[Any]) -> ModelResponse:
        async with pg_sessions() as db:  # the lease as the resume runs
            leases.append(
                await db.scalar(select(TurnRow.lease_until).filter_by(id=approval.turn_id))
            )
        return answer_with_tool_results(request)

    h.model.script(answer)
    resumed = await h.workflow.turns.resume(decided.turn_id, claim=decided.claim)
    assert resumed is not None and len(h.ledger()) == 1
    [lease] = leases
    assert lease is not None and lease - h.clock() > timedelta(seconds=10)  # renewed


async def test_a_claim_taken_over_while_it_waited_resumes_nothing(h: Harness) -> None:
    [approval] = await paused(h, TRANSFER)
    decided = await approved_here(h, approval)
    h.clock.advance(seconds=16)  # its lease ran out: another process's sweep took it over
    h.model.script(answer_with_tool_results)
    assert await h.workflow.turns.resume(decided.turn_id) is not None
    asked = len(h.model.requests)
    assert await h.workflow.turns.resume(decided.turn_id, claim=decided.claim) is None
    assert len(h.ledger()) == 1  # run by the one that took it over, once
    assert len(h.model.requests) == asked  # the stale claim's resume never began


@pytest.mark.parametrize("changed_elsewhere", [True, False])
async def test_the_resume_uses_the_paused_snapshot_kept_here_only_at_its_version(
    h: Harness, pg_sessions: SessionFactory, changed_elsewhere: bool
) -> None:
    """The process that paused the turn keeps its snapshot for the resume (no load), unless
    the row changed since: every writer raises its version, which the claim reads."""
    [approval] = await paused(h, TRANSFER)
    async with pg_sessions() as s, s.begin():
        [snapshot_id] = (
            await s.execute(select(TurnRow.snapshot_id).where(TurnRow.id == approval.turn_id))
        ).scalars()
        first = await s.get_one(MessageRow, (h.team, snapshot_id, 0))
        first.data = {**first.data, "content": [{"text": "send money, changed elsewhere"}]}
        if changed_elsewhere:  # as a writer of the row does (storage/session_store.py)
            row = await s.get_one(SnapshotRow, (h.team, snapshot_id))
            row.version += 1
    decided = await approved_here(h, approval)
    assert decided.claim is not None
    assert decided.claim.snapshot_version == (2 if changed_elsewhere else 1)
    h.model.script(answer_with_tool_results)
    assert await h.workflow.turns.resume(decided.turn_id, claim=decided.claim) is not None
    said = next(m.text for m in h.model.requests[-1].messages if m.role == "user")
    # Unchanged in version, the kept copy stands in for the row (so what the test wrote
    # without raising it is not read): the control that the load was spared at all.
    assert ("changed elsewhere" in said) is changed_elsewhere
    assert len(h.ledger()) == 1
