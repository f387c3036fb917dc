"""Data lifecycle: old conversations, agent sessions, Slack event ids and audit rows go.

The recovery sweep calls `Retention.purge` (agent/workflow.py). Every DELETE is bounded (a
batch of rows, by default 500) and commits on its own, and one purge runs a bounded number of
batches per kind, so a large backlog goes over several sweeps without long locks or long
transactions next to live turns (bench/retention.py measures that).

What "old" means, precisely:
- A conversation: the last message that took its thread (`last_active_at`) and the last
  change of any of its paused turns are both older than the cutoff, its thread is not held
  (`busy_until` in the past), it has no open turn and no pending approval. It goes with its
  turns, their approvals and votes. (The audit trail keeps its own copy of each request and
  decision, for AUDIT_RETENTION_DAYS.)
- An agent session (Genkit snapshots and their messages): its newest snapshot is older than
  the cutoff, and no conversation and no turn points into it. Sessions go whole: a snapshot
  stores only the messages its parent did not have.
- A Slack event id: older than `keep_events` (a day; Slack retries for minutes).
- An audit row: older than the audit cutoff; only through the database's own purge path,
  which the append-only trigger allows (migrations/versions/0012_retention.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa

from storage.db import SessionFactory, autocommit
from storage.domain import ApprovalState
from storage.lifecycle import OPEN_TURN
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

A, T, C, V, AU = (
    cast(sa.Table, m.__table__) for m in (ApprovalRow, TurnRow, ConversationRow, VoteRow, AuditRow)
)
SNAP, MSG, EVENTS = (cast(sa.Table, m.__table__) for m in (SnapshotRow, MessageRow, SeenEventRow))

_CUTOFF = sa.bindparam("cutoff", type_=C.c.last_active_at.type)
_NOW = sa.bindparam("now", type_=C.c.busy_until.type)
_BATCH = sa.bindparam("batch", type_=sa.Integer)
_IDS: sa.BindParameter[list[str]] = sa.bindparam("ids", expanding=True)

# -- conversations ---------------------------------------------------------------------------
_T2 = T.alias("t2")
_OLD_CONVERSATION = sa.and_(
    C.c.last_active_at < _CUTOFF,
    sa.or_(C.c.busy_until.is_(None), C.c.busy_until < _NOW),  # no turn holds the thread
    ~sa.exists().where(
        _T2.c.conversation_id == C.c.id,
        sa.or_(_T2.c.state.in_(OPEN_TURN), _T2.c.updated_at >= _CUTOFF),
    ),
    ~sa.exists().where(
        A.c.turn_id == _T2.c.id,
        _T2.c.conversation_id == C.c.id,
        A.c.status == ApprovalState.PENDING,
    ),
)
OLD_CONVERSATIONS = (
    sa.select(C.c.id).where(_OLD_CONVERSATION).order_by(C.c.last_active_at).limit(_BATCH)
)
_CLOSED_TURNS = sa.select(T.c.id).where(T.c.conversation_id.in_(_IDS), T.c.state.not_in(OPEN_TURN))
DELETE_VOTES = sa.delete(V).where(
    V.c.approval_id.in_(sa.select(A.c.id).where(A.c.turn_id.in_(_CLOSED_TURNS)))
)
DELETE_APPROVALS = sa.delete(A).where(A.c.turn_id.in_(_CLOSED_TURNS))
DELETE_TURNS = sa.delete(T).where(T.c.conversation_id.in_(_IDS), T.c.state.not_in(OPEN_TURN))
# Checked again as it deletes: a message that took the thread meanwhile keeps it.
DELETE_CONVERSATIONS = sa.delete(C).where(
    C.c.id.in_(_IDS), _OLD_CONVERSATION, ~sa.exists().where(T.c.conversation_id == C.c.id)
)

# -- agent sessions --------------------------------------------------------------------------
_SESSION_CUTOFF = sa.bindparam("session_cutoff", type_=SNAP.c.created_at.type)  # ISO text
_newer, _pointed = SNAP.alias("newer"), SNAP.alias("pointed")
_SAME_SESSION = sa.and_(
    _newer.c.team_id == SNAP.c.team_id, _newer.c.session_id == SNAP.c.session_id
)
OLD_SESSIONS = (
    sa.select(SNAP.c.team_id, SNAP.c.session_id)
    .where(
        SNAP.c.created_at < _SESSION_CUTOFF,
        SNAP.c.session_id.is_not(None),
        ~sa.exists().where(_SAME_SESSION, _newer.c.created_at >= _SESSION_CUTOFF),
        ~sa.exists().where(T.c.team_id == SNAP.c.team_id, T.c.session_id == SNAP.c.session_id),
        # After the last one looked at: sessions found in use are not found again and again.
        sa.tuple_(SNAP.c.session_id, SNAP.c.team_id)
        > sa.tuple_(
            sa.bindparam("after_session", type_=SNAP.c.session_id.type),
            sa.bindparam("after_team", type_=SNAP.c.team_id.type),
        ),
    )
    .distinct()
    .order_by(SNAP.c.session_id, SNAP.c.team_id)
    .limit(_BATCH)
)
# Of those, the sessions a conversation points into. Asked apart: PostgreSQL planned this as
# one more NOT EXISTS in OLD_SESSIONS as a merge join on team_id, 6 s at 100k snapshots.
IN_USE = (
    sa.select(_pointed.c.session_id)
    .join(C, sa.and_(C.c.team_id == _pointed.c.team_id, C.c.snapshot_id == _pointed.c.snapshot_id))
    .where(
        _pointed.c.team_id == sa.bindparam("team", type_=SNAP.c.team_id.type),
        _pointed.c.session_id.in_(sa.bindparam("sessions", expanding=True)),
    )
    .distinct()
)
# Per workspace, by plain lists of snapshot ids: row-value IN lists and LIMIT subqueries
# over agent_messages planned badly (a quarter second per 500 rows), these use the keys.
_TEAM = sa.bindparam("team", type_=SNAP.c.team_id.type)
SNAPSHOTS_OF = sa.select(
    SNAP.c.snapshot_id, sa.func.coalesce(SNAP.c.message_count, 0) - SNAP.c.inherited
).where(SNAP.c.team_id == _TEAM, SNAP.c.session_id.in_(sa.bindparam("sessions", expanding=True)))
_SNAPSHOT_IDS: sa.BindParameter[list[str]] = sa.bindparam("snapshots", expanding=True)
DELETE_MESSAGES = sa.delete(MSG).where(MSG.c.team_id == _TEAM, MSG.c.snapshot_id.in_(_SNAPSHOT_IDS))
DELETE_SNAPSHOTS = sa.delete(SNAP).where(
    SNAP.c.team_id == _TEAM, SNAP.c.snapshot_id.in_(_SNAPSHOT_IDS)
)

# -- Slack event ids and audit rows ----------------------------------------------------------
DELETE_EVENTS = sa.delete(EVENTS).where(
    EVENTS.c.event_id.in_(
        sa.select(EVENTS.c.event_id).where(EVENTS.c.received_at < _CUTOFF).limit(_BATCH)
    )
)
PURGE_AUDIT = sa.select(
    sa.func.greenlight_purge_audit(sa.bindparam("cutoff", type_=AU.c.at.type), _BATCH)
)


@dataclass(frozen=True)
class Purged:
    """What one purge deleted, row counts by kind."""

    conversations: int = 0
    sessions: int = 0
    snapshots: int = 0
    messages: int = 0
    events: int = 0
    audit: int = 0

    @property
    def rows(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


class Retention:
    """Deletes what is older than `keep` (`keep_audit` for the audit trail), `batch` rows per
    statement and at most `batches` statements per kind and purge, pausing `pace` times as
    long as each statement took (0: no pause)."""

    def __init__(
        self,
        sessions: SessionFactory,
        *,
        keep: timedelta = timedelta(days=90),
        keep_audit: timedelta = timedelta(days=400),
        keep_events: timedelta = timedelta(days=1),
        batch: int = 500,
        batches: int = 20,
        pace: float = 1.0,
    ) -> None:
        if batch < 1 or batches < 1:
            raise ValueError("batch and batches must be at least 1")
        self._sessions = sessions
        self._keep, self._keep_audit, self._keep_events = keep, keep_audit, keep_events
        self._batch, self._batches, self._pace = batch, batches, pace
        # Where the look for old sessions goes on (session, team): those found in use are
        # passed over until the look comes round again, however many there are.
        self._after = ("", "")

    async def purge(self, *, now: datetime) -> Purged:
        """One round of deletes; what is left waits for the next sweep."""
        cutoff = now - self._keep
        conversations = await self._repeat(lambda: self._conversations(cutoff, now))
        sessions = snapshots = messages = 0
        for _ in range(self._batches):
            found, unused = await self._old_sessions(cutoff, self._after)
            sessions += len(unused)
            m, s = await self._delete_sessions(unused)
            messages, snapshots = messages + m, snapshots + s
            if len(found) < self._batch:
                self._after = ("", "")  # at the end: the next purge starts over
                break
            self._after = (found[-1][1], found[-1][0])
        events = await self._repeat(
            lambda: self._delete(DELETE_EVENTS, {"cutoff": now - self._keep_events})
        )
        audit = await self._repeat(lambda: self._audit(now - self._keep_audit))
        return Purged(conversations, sessions, snapshots, messages, events, audit)

    async def _repeat(self, batch: Callable[[], Awaitable[int]]) -> int:
        """Run `batch` until it deletes less than a full batch, at most `batches` times."""
        total = 0
        for _ in range(self._batches):
            done = await batch()
            total += done
            if done < self._batch:
                break
        return total

    async def _delete(self, statement: sa.Delete, params: dict[str, Any]) -> int:
        started = time.monotonic()
        async with autocommit(self._sessions) as db:
            result = await db.execute(statement, params | {"batch": self._batch})
        # Paced: after each statement as long a pause as it took, so a backlog takes at most
        # half of one connection's time and live turns keep the rest of the database.
        await asyncio.sleep((time.monotonic() - started) * self._pace)
        return int(cast(sa.CursorResult[Any], result).rowcount)

    async def _conversations(self, cutoff: datetime, now: datetime) -> int:
        params = {"cutoff": cutoff, "now": now, "batch": self._batch}
        async with autocommit(self._sessions) as db:
            ids = list((await db.scalars(OLD_CONVERSATIONS, params)).all())
        if not ids:
            return 0
        # Children first, each its own statement: a conversation whose old turns are gone
        # and that a new message takes meanwhile lacks nothing a live turn needs.
        for statement in (DELETE_VOTES, DELETE_APPROVALS, DELETE_TURNS):
            await self._delete(statement, {"ids": ids})
        return await self._delete(DELETE_CONVERSATIONS, params | {"ids": ids})

    async def _old_sessions(
        self, cutoff: datetime, after: tuple[str, str]
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """The next old sessions after `after` (session, team), up to a batch, and those of
        them nothing points into."""
        params = {
            "session_cutoff": cutoff.isoformat(),
            "batch": self._batch,
            "after_session": after[0],
            "after_team": after[1],
        }
        async with autocommit(self._sessions) as db:
            found = [(r.team_id, r.session_id) for r in await db.execute(OLD_SESSIONS, params)]
            used: set[tuple[str, str]] = set()
            for team, sessions in _by_team(found).items():
                rows = await db.scalars(IN_USE, {"team": team, "sessions": sessions})
                used.update((team, session) for session in rows)
        return found, [key for key in found if key not in used]

    async def _delete_sessions(self, found: Sequence[tuple[str, str]]) -> tuple[int, int]:
        """Delete whole sessions, a chunk of snapshots at a time: the chunk's messages (about
        a batch of rows: each snapshot stores its own count), then the snapshots."""
        messages = snapshots = 0
        for team, sessions in _by_team(found).items():
            async with autocommit(self._sessions) as db:
                rows = (await db.execute(SNAPSHOTS_OF, {"team": team, "sessions": sessions})).all()
            for chunk in _chunks([(sid, own) for sid, own in rows], self._batch):
                params = {"team": team, "snapshots": chunk}
                messages += await self._delete(DELETE_MESSAGES, params)
                snapshots += await self._delete(DELETE_SNAPSHOTS, params)
        return messages, snapshots

    async def _audit(self, cutoff: datetime) -> int:
        params = {"cutoff": cutoff, "batch": self._batch}
        async with autocommit(self._sessions) as db:
            return int(await db.scalar(PURGE_AUDIT, params) or 0)


def _chunks(sized: Sequence[tuple[str, int]], limit: int) -> list[list[str]]:
    """Ids in order, grouped so that each group's sizes add up to at most `limit` (or
    to one id's size, when that alone is more), and at most `limit` ids a group."""
    chunks: list[list[str]] = []
    total = limit + 1
    for key, size in sized:
        if total + max(size, 0) > limit or len(chunks[-1]) >= limit:
            chunks.append([])
            total = 0
        chunks[-1].append(key)
        total += max(size, 0)
    return chunks


def _by_team(keys: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for team, key in keys:
        grouped.setdefault(team, []).append(key)
    return grouped
