"""Retention: what is old goes in bounded batches, what a live turn or an open approval needs
stays, and the audit trail refuses every other change.

Rows here are from 2001, and each purge's cutoff too, so other tests' rows (all much later)
are never old enough to go.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from storage.db import SessionFactory, make_session_factory
from storage.domain import ApprovalState, ExecutionState, TurnState
from storage.models import (
    ApprovalRow,
    AuditRow,
    ConversationRow,
    MessageRow,
    SeenEventRow,
    SnapshotRow,
    TurnRow,
    VoteRow,
)
from storage.retention import Purged, Retention

T0 = datetime(2001, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=100)  # the cutoff (90 days kept) is T0 + 10 days
OLD, RECENT = T0, T0 + timedelta(days=20)
C, T, A, V, S, M, E, AU = (
    cast(sa.Table, m.__table__)
    for m in (
        ConversationRow,
        TurnRow,
        ApprovalRow,
        VoteRow,
        SnapshotRow,
        MessageRow,
        SeenEventRow,
        AuditRow,
    )
)


class World:
    """Rows of one test's own workspace, written directly."""

    def __init__(self, sessions: SessionFactory, team: str) -> None:
        self.sessions, self.team = sessions, team

    async def insert(self, table: sa.Table, **row: Any) -> None:
        async with self.sessions() as db, db.begin():
            await db.execute(sa.insert(table).values(**row))

    async def session(self, at: datetime, messages: int = 3) -> str:
        """An agent session of two snapshots (the second inheriting the first's messages);
        returns the leaf's snapshot id."""
        session, parent = uuid.uuid4().hex, None
        for n in range(2):
            sid = uuid.uuid4().hex
            await self.insert(
                S,
                team_id=self.team,
                snapshot_id=sid,
                session_id=session,
                parent_id=parent,
                created_at=(at + timedelta(minutes=n)).isoformat(),
                meta={},
                message_count=messages * (n + 1),
                inherited=messages * n,
                digest="d",
            )
            for position in range(messages * n, messages * (n + 1)):
                await self.insert(
                    M, team_id=self.team, snapshot_id=sid, position=position, data={"n": 1}
                )
            parent = sid
        assert parent is not None
        return parent

    async def conversation(
        self,
        at: datetime,
        *,
        turn: TurnState | None = TurnState.DONE,
        approval: ApprovalState = ApprovalState.APPROVED,
        busy_until: datetime | None = None,
    ) -> str:
        """A conversation last active at `at` with a session, and a paused turn (in state
        `turn`) with one approval and its vote."""
        cid = uuid.uuid4().hex
        leaf = await self.session(at)
        await self.insert(
            C,
            id=cid,
            team_id=self.team,
            channel_id="D1",
            thread_ts=cid[:16],
            snapshot_id=leaf,
            busy_until=busy_until,
            created_at=at,
            last_active_at=at,
            participants=["U1"],
        )
        if turn is not None:
            tid, aid = uuid.uuid4().hex, uuid.uuid4().hex
            paused = await self.session(at)
            await self.insert(
                T,
                id=tid,
                team_id=self.team,
                conversation_id=cid,
                session_id=await self.session_of(paused),
                snapshot_id=paused,
                state=turn,
                attempts=1,
                created_at=at,
                updated_at=at,
            )
            await self.insert(
                A,
                id=aid,
                team_id=self.team,
                turn_id=tid,
                tool="transferMoney",
                ref="r",
                input={},
                requester="U1",
                requested_at=at,
                expires_at=at + timedelta(days=1),
                why="policy",
                status=approval,
                execution=ExecutionState.NOT_STARTED,
            )
            await self.insert(V, approval_id=aid, voter="U2", at=at)
        return cid

    async def session_of(self, snapshot_id: str) -> str:
        async with self.sessions() as db:
            query = sa.select(S.c.session_id).where(S.c.snapshot_id == snapshot_id)
            return str(await db.scalar(query))

    async def count(self, table: sa.Table, *where: Any) -> int:
        query = sa.select(sa.func.count()).select_from(table)
        if "team_id" in table.c:
            query = query.where(table.c.team_id == self.team)
        async with self.sessions() as db:
            return int(await db.scalar(query.where(*where)) or 0)

    async def conversations(self) -> set[str]:
        async with self.sessions() as db:
            rows = await db.scalars(sa.select(C.c.id).where(C.c.team_id == self.team))
            return set(rows)


@pytest.fixture
def world(pg_engine: AsyncEngine, team: str) -> World:
    return World(make_session_factory(pg_engine), team)


async def test_old_conversations_go_with_their_sessions_and_live_ones_stay(world: World) -> None:
    gone = await world.conversation(OLD)
    pending = await world.conversation(OLD, turn=TurnState.WAITING, approval=ApprovalState.PENDING)
    held = await world.conversation(OLD, turn=None, busy_until=NOW + timedelta(minutes=5))
    recent = await world.conversation(RECENT)
    orphan = await world.session(OLD)  # a first turn that failed: no conversation points here
    before = {t.name: await world.count(t) for t in (S, M, T, A, V)}

    purged = await Retention(world.sessions).purge(now=NOW)

    assert await world.conversations() == {pending, held, recent}
    assert purged.conversations >= 1 and purged.sessions >= 3
    # The one conversation's two sessions (its own, its turn's) and the orphan, 2 snapshots
    # and 6 messages each; its turn, approval and vote.
    assert {t.name: before[t.name] - await world.count(t) for t in (S, M, T, A, V)} == {
        "agent_snapshots": 6,
        "agent_messages": 18,
        "turns": 1,
        "approvals": 1,
        "approval_votes": 1,
    }
    assert await world.count(S, S.c.session_id == await world.session_of(orphan)) == 0
    # What is kept is whole: the held and pending conversations can continue and resume.
    for cid in (pending, held, recent):
        async with world.sessions() as db:
            leaf = await db.scalar(sa.select(C.c.snapshot_id).where(C.c.id == cid))
        assert await world.count(M, M.c.snapshot_id == leaf) == 3
    assert gone not in await world.conversations()


async def test_a_message_after_the_cutoff_keeps_the_conversation(world: World) -> None:
    """Last activity is the last message, not the first."""
    cid = await world.conversation(OLD)
    async with world.sessions() as db, db.begin():
        await db.execute(sa.update(C).where(C.c.id == cid).values(last_active_at=RECENT))
    await Retention(world.sessions).purge(now=NOW)
    assert cid in await world.conversations()


async def test_a_backlog_goes_in_bounded_batches(world: World) -> None:
    for _ in range(5):
        await world.conversation(OLD, turn=None)
    retention = Retention(world.sessions, batch=2, batches=2)
    first = await retention.purge(now=NOW)
    # At most 2 statements of 2 rows per kind (sessions: 2 looks at 2 sessions each).
    assert first.conversations == 4 and first.sessions <= 4 and first.messages <= 4 * 6
    assert len(await world.conversations()) == 1
    second = await retention.purge(now=NOW)
    assert second.conversations == 1 and await world.conversations() == set()
    # Sessions still in use elsewhere (other tests' held conversations) are passed over,
    # not looked at again and again: these go within a few more sweeps.
    for _ in range(10):
        if await world.count(S) == 0:
            break
        await retention.purge(now=NOW)
    assert await world.count(S) == 0 and await world.count(M) == 0


async def test_old_event_ids_and_audit_rows_go_recent_ones_stay(world: World) -> None:
    old_event, new_event = f"Ev{world.team}old", f"Ev{world.team}new"
    await world.insert(E, event_id=old_event, received_at=NOW - timedelta(days=2))
    await world.insert(E, event_id=new_event, received_at=NOW - timedelta(hours=1))
    for at, action in ((NOW - timedelta(days=401), "old"), (NOW - timedelta(days=399), "kept")):
        await world.insert(
            AU, team_id=world.team, at=at, actor="U1", action=action, tool=None, detail={}
        )

    purged = await Retention(world.sessions).purge(now=NOW)

    assert purged.audit >= 1 and purged.events >= 1
    assert await world.count(E, E.c.event_id.in_([old_event, new_event])) == 1
    assert await world.count(E, E.c.event_id == new_event) == 1
    assert await world.count(AU, AU.c.action == "old") == 0
    assert await world.count(AU, AU.c.action == "kept") == 1


async def test_the_audit_trail_refuses_updates_and_deletes(world: World) -> None:
    await world.insert(
        AU, team_id=world.team, at=OLD, actor="U1", action="approved", tool="t", detail={}
    )
    mine = AU.c.team_id == world.team
    for change in (
        sa.update(AU).where(mine).values(actor="UFORGED"),
        sa.delete(AU).where(mine),
    ):
        with pytest.raises(DBAPIError, match="append-only"):
            async with world.sessions() as db, db.begin():
                await db.execute(change)
    assert await world.count(AU, AU.c.actor == "U1") == 1
    with pytest.raises(DBAPIError, match="append-only"):
        async with world.sessions() as db, db.begin():
            await db.execute(sa.text("TRUNCATE audit_events"))
    # The purge function deletes only what is older than it is told (rows before 1995:
    # only this test writes any).
    ancient = datetime(1990, 1, 1, tzinfo=UTC)
    await world.insert(
        AU, team_id=world.team, at=ancient, actor="U1", action="old", tool="t", detail={}
    )
    async with world.sessions() as db, db.begin():
        deleted = await db.scalar(
            sa.text("SELECT greenlight_purge_audit(:before, 10)"),
            {"before": datetime(1995, 1, 1, tzinfo=UTC)},
        )
    assert deleted == 1 and await world.count(AU) == 1
    assert await world.count(AU, AU.c.at == OLD) == 1


def test_purged_counts_every_kind() -> None:
    assert Purged(1, 2, 3, 4, 5, 6).rows == 21
