"""Standing approvals in storage: GRANT rides on an APPROVE, USE approves a call of its own
(counted, audited), REVOKE ends it; a use that races a revoke is approved before it or not
at all, and time runs out by the clock given."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from storage.approval_store import ApprovalStore
from storage.db import make_session_factory
from storage.domain import Approval, ApprovalState, Approved, Request, StandingState
from storage.lifecycle import IllegalTransition, Requirement
from storage.models import ApprovalRow, AuditRow
from storage.standing import Call
from tests.storage.test_approval_store import Db

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def db(pg_engine: AsyncEngine, team: str) -> Db:
    sessions = make_session_factory(pg_engine)
    return Db(ApprovalStore(sessions), sessions, team)


async def offered(db: Db, seconds: int | None = 3600) -> tuple[Approval, str]:
    """A pending request whose policy offered a standing approval; its conversation."""
    approval, conversation = await db.seed()
    async with db.sessions.begin() as s:
        await s.execute(
            sa.update(ApprovalRow)
            .where(ApprovalRow.id == approval.id)
            .values(standing_offer_seconds=seconds)
        )
    found = await db.store.reads.get(db.team, approval.id)
    assert found is not None
    return found, conversation


def call(db: Db, grant: Approval, conversation: str, **over: object) -> Call:
    values: dict[str, object] = {
        "tool": grant.request.tool,
        "requester": grant.request.requester,
        "rule": "",
        "conversation_id": conversation,
        "thread": grant.thread,
        "participants": (grant.request.requester,),
    }
    return Call(**(values | over))  # type: ignore[arg-type]


def covered(grant: Approval, at: datetime = NOW) -> Approval:
    r = grant.request
    request = Request(r.tool, str(uuid.uuid4()), {"amount": 1}, r.requester, "covered", at, at)
    return Approval(str(uuid.uuid4()), str(uuid.uuid4()), grant.thread, request)


async def granted(db: Db) -> tuple[Approval, str]:
    approval, conversation = await offered(db)
    grant, others = await db.store.standing.grant(
        approval, Approved("UBOSS", NOW), seen=1, until=NOW + HOUR, rule=""
    )
    assert grant.state == ApprovalState.APPROVED and others == 0
    assert grant.standing is not None and grant.standing.state == StandingState.GRANTED
    return grant, conversation


async def test_a_grant_covers_matching_calls_each_its_own_approved_request(db: Db) -> None:
    grant, conversation = await granted(db)
    the_call = call(db, grant, conversation)
    assert (await db.store.standing.matching(the_call, now=NOW)) is not None
    for other in (
        call(db, grant, conversation, tool="getBalance"),
        call(db, grant, conversation, requester="USOMEONE"),
        call(db, grant, conversation, rule="another"),
        call(db, grant, str(uuid.uuid4())),
        call(db, grant, conversation, participants=("UASK", "UBOSS")),  # its approver joined
    ):
        assert await db.store.standing.matching(other, now=NOW) is None
    assert await db.store.standing.matching(the_call, now=NOW + HOUR) is None  # run out

    one = covered(grant)
    used = await db.store.standing.use(grant, one, the_call, now=NOW)
    assert used is not None and used.standing is not None and used.standing.uses == 1
    assert used.request == grant.request  # the grant's row changed in its count alone
    row = await db.store.reads.get(db.team, one.id)
    assert row is not None and row.under == grant.id
    assert isinstance(row.decision, Approved) and row.decision.by == "UBOSS"
    await db.store.executions.start_execution(row, now=NOW)  # the gate takes it like any
    assert await db.store.standing.use(grant, covered(grant), the_call, now=NOW + HOUR) is None


async def test_a_grant_needs_the_offer_and_one_approver(db: Db) -> None:
    approval, _ = await offered(db, seconds=None)
    with pytest.raises(IllegalTransition) as refused:
        await db.store.standing.grant(
            approval, Approved("UBOSS", NOW), seen=1, until=NOW + HOUR, rule=""
        )
    assert refused.value.unmet == (Requirement.STANDING_OFFERED,)
    now = await db.store.reads.get(db.team, approval.id)
    assert now is not None and now.decision is None and now.standing is None  # nothing written


async def test_a_use_racing_a_revoke_is_approved_before_it_or_not_at_all(db: Db) -> None:
    grant, conversation = await granted(db)
    the_call = call(db, grant, conversation)
    before_revoke = 0

    async def use() -> Approval | None:
        return await db.store.standing.use(grant, covered(grant), the_call, now=NOW)

    async def revoke() -> Approval:
        nonlocal before_revoke
        revoked = await db.store.standing.revoke(grant, by="UCFO", now=NOW)
        assert revoked.standing is not None
        before_revoke = revoked.standing.uses
        return revoked

    results = await asyncio.gather(
        *(use() for _ in range(10)), revoke(), *(use() for _ in range(10))
    )
    uses = [r for r in results[:10] + results[11:] if r is not None]
    async with db.sessions() as s:
        under = await s.scalar(sa.select(sa.func.count()).where(ApprovalRow.under == grant.id))
        revoked = await s.scalar(
            sa.select(sa.func.count()).where(
                AuditRow.approval_id == grant.id, AuditRow.action == "standing_revoked"
            )
        )
    # Every use counted is a call approved, and all of them before the revoke took.
    assert under == len(uses) == before_revoke and revoked == 1
    assert await use() is None  # after it, none
    with pytest.raises(IllegalTransition):  # revoked once
        await db.store.standing.revoke(replace(grant), by="UCFO", now=NOW)
