"""Turns in storage: a thread held by one turn at a time; a turn paused, claimed, leased, ended.

Every method owns its session. The conditional writes come from storage/lifecycle.py by way
of storage/transitions.py; a write that matched nothing says why (IllegalTransition). A
turn's end and the thread it frees, or a paused turn and its approvals, are one `Atomic`
statement.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from storage import audit
from storage.db import SessionFactory, autocommit
from storage.domain import Approval, Claim, PausedTurn, Thread
from storage.driver import prepared
from storage.held_saves import Held
from storage.lifecycle import (
    CLAIM,
    COMPLETE,
    GIVE_UP,
    LET_GO,
    PAUSE,
    RENEW,
    REQUEST,
    IllegalTransition,
    Transition,
)
from storage.rows import (
    EXPLAIN_TURN,
    LOCATED,
    OPEN,
    audit_row,
    columns,
    count,
    located,
    refusal,
    thread_params,
    with_votes,
)
from storage.session_store import CREATED, STORED, S
from storage.transitions import NOW, A, Atomic, C, NewRow, T, guard, write

OF_TURN = prepared(LOCATED.where(A.c.turn_id == sa.bindparam("turn")))
_THREAD = sa.and_(
    C.c.team_id == sa.bindparam("team"),
    C.c.channel_id == sa.bindparam("channel"),
    C.c.thread_ts == sa.bindparam("thread"),
)
WAITING_ON = prepared(LOCATED.where(_THREAD, OPEN))
KNOWN = prepared(sa.select(C.c.id).where(_THREAD))


def _approvals_of(turn: sa.FromClause) -> sa.Select[Any]:
    """The approvals of `turn` (a changed turn row) with their thread, and the turn's own
    fields a resume needs."""
    fields = (turn.c.conversation_id, turn.c.snapshot_id, turn.c.attempts.label("attempt"))
    return LOCATED.add_columns(*fields).where(A.c.turn_id == turn.c.id)


# What a CLAIM writes beside the state: a lease, and the attempt that names the claim.
CLAIMING = {"lease_until": sa.bindparam("lease"), "attempts": T.c.attempts + 1, "updated_at": NOW}
CLAIM_TURN = Atomic(write(CLAIM, **CLAIMING), read=_approvals_of)
# The version of a claimed turn's snapshot row, read with the claim (`Claim.snapshot_version`).
SNAPSHOT_VERSION = (
    sa.select(S.c.version)
    .where(S.c.team_id == T.c.team_id, S.c.snapshot_id == T.c.snapshot_id)
    .scalar_subquery()
    .label("snapshot_version")
)
RENEW_LEASE = prepared(write(RENEW, lease_until=sa.bindparam("lease")))
LET_GO_OF = prepared(write(LET_GO, lease_until=None, updated_at=NOW))
RECOVERABLE = sa.select(T.c.id).where(guard(CLAIM))
# The thread freed; the next message continues from `snapshot` when given.
RELEASE = prepared(
    sa.update(C)
    .where(C.c.id == sa.bindparam("conversation"))
    .values(
        busy_until=None,
        snapshot_id=sa.func.coalesce(
            sa.bindparam("snapshot", type_=C.c.snapshot_id.type), C.c.snapshot_id
        ),
    )
)
END = {
    t: Atomic(write(t, lease_until=None, updated_at=NOW), RELEASE, read=_approvals_of)
    for t in (COMPLETE, GIVE_UP)
}
UNIQUE_VIOLATION = "23505"
# The same with the turn's held snapshot (storage/held_saves.py), each gated on its row.
_SAVED = sa.exists(CREATED.select())
COMPLETE_SAVING = Atomic(
    write(COMPLETE, lease_until=None, updated_at=NOW).where(_SAVED),
    RELEASE,
    read=_approvals_of,
    also=(STORED,),
)
RELEASE_SAVING = prepared(RELEASE.where(_SAVED).returning(C.c.id).add_cte(STORED))


@functools.cache
def paused_turn(approvals: int, after: Transition | None = None, *, saving: bool = False) -> Atomic:
    """PAUSE a turn with `approvals` REQUESTs and their audit rows; `after`: the turn a
    resume COMPLETEs in the same breath (its interrupts chained); `saving`: with the turn's
    held snapshot, paused only if its row went in. Built once per shape."""
    turn = NewRow(T, "t_")
    rows = [NewRow(A, f"a{i}_") for i in range(approvals)]
    notes = [NewRow(audit.TABLE, f"e{i}_") for i in range(approvals)]
    if after is None and saving:
        return Atomic(turn.after(CREATED).returning(T.c.id), *rows, *notes, also=(STORED,))
    if after is None:
        return Atomic(turn.alone().returning(T.c.id), *rows, *notes)
    ended = write(after, lease_until=None, updated_at=NOW)
    return Atomic(ended, turn, *rows, *notes, read=_approvals_of)


def pause_params(turn: PausedTurn, approvals: Sequence[Approval]) -> dict[str, Any]:
    """The parameters of `paused_turn`: the turn's row, each approval's row and audit row."""
    params = NewRow(T, "t_").params(
        {
            "id": turn.id,
            "team_id": turn.thread.team_id,
            "conversation_id": turn.conversation_id,
            "session_id": turn.session_id,
            "snapshot_id": turn.snapshot_id,
            "state": PAUSE.enters,
            "lease_until": None,
            "attempts": 0,
            "created_at": turn.at,
            "updated_at": turn.at,
        }
    )
    for i, approval in enumerate(approvals):
        params |= NewRow(A, f"a{i}_").params(columns(approval))
        params |= NewRow(audit.TABLE, f"e{i}_").params(audit_row(REQUEST, approval, turn.at))
    return params


# Conversations (threads): taken by one turn at a time, while it runs or waits.
_idle = sa.and_(
    sa.or_(C.c.busy_until.is_(None), C.c.busy_until < NOW),
    ~sa.exists().where(T.c.conversation_id == C.c.id, OPEN),
)
_NEW_THREAD = {
    "id": sa.bindparam("new_id", type_=C.c.id.type),
    "team_id": sa.bindparam("team", type_=C.c.team_id.type),
    "channel_id": sa.bindparam("channel", type_=C.c.channel_id.type),
    "thread_ts": sa.bindparam("thread", type_=C.c.thread_ts.type),
    "busy_until": sa.bindparam("until", type_=C.c.busy_until.type),
    "participants": sa.bindparam("participants", type_=C.c.participants.type),
    "created_at": NOW,
    "last_active_at": NOW,
}
OPEN_THREAD = prepared(
    sa.insert(C)
    .from_select(
        list(_NEW_THREAD),
        sa.select(*_NEW_THREAD.values()).where(~sa.exists().where(_THREAD)),
    )
    .returning(C.c.id, C.c.snapshot_id, C.c.participants)
)
TAKE_THREAD = prepared(
    sa.update(C)
    .where(_THREAD, _idle)
    .values(busy_until=sa.bindparam("until"), last_active_at=NOW)
    .returning(C.c.id, C.c.snapshot_id, C.c.participants)
)
# A running turn's hold, renewed while the turn runs; a hold already let go stays free.
KEEP_THREAD = prepared(
    sa.update(C)
    .where(C.c.id == sa.bindparam("conversation"), C.c.busy_until.is_not(None))
    .values(busy_until=sa.bindparam("until", type_=C.c.busy_until.type))
)
# Only the thread's holder writes it, so a whole new list loses nobody.
SET_PARTICIPANTS = prepared(
    sa.update(C)
    .where(C.c.id == sa.bindparam("conversation"))
    .values(participants=sa.bindparam("people", type_=C.c.participants.type))
)


@dataclass(frozen=True)
class HeldThread:
    """A thread taken for one turn: its conversation, the snapshot it continues from, and
    every human whose message ran a turn in it (this turn's author included)."""

    conversation_id: str
    snapshot_id: str | None
    participants: tuple[str, ...]


class TurnStore:
    """Threads (conversations) and paused turns: held, paused, claimed, renewed, ended."""

    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    # -- threads -------------------------------------------------------------------------

    async def hold_thread(
        self, thread: Thread, *, author: str, new_id: str, now: datetime, until: datetime
    ) -> HeldThread | None:
        """Take the thread's conversation (created on its first message) for one turn by
        `author`'s message, until `until`; None while another turn runs or waits for
        approval in it. The author joins the conversation's participants."""
        values = thread_params(thread) | {"new_id": new_id, "now": now, "until": until}
        try:
            async with autocommit(self._sessions) as db:
                row = (await db.execute(OPEN_THREAD, values | {"participants": [author]})).first()
        except IntegrityError:  # a racing first message created it: take it, or find it busy
            row = None
        if row is None:
            async with autocommit(self._sessions) as db:
                row = (await db.execute(TAKE_THREAD, values)).first()
        if row is None:
            return None
        people = tuple(row.participants)
        if author not in people:  # held by this turn alone, so nobody else writes it now
            people += (author,)
            async with autocommit(self._sessions) as db:
                await db.execute(SET_PARTICIPANTS, {"conversation": row.id, "people": list(people)})
        return HeldThread(row.id, row.snapshot_id, people)

    async def join(self, conversation_id: str, people: Sequence[str]) -> None:
        """Make `people` the conversation's participants (the thread's holder only: a
        resume, whose decisions' words reached the model, writes those who wrote them)."""
        async with autocommit(self._sessions) as db:
            await db.execute(
                SET_PARTICIPANTS, {"conversation": conversation_id, "people": list(people)}
            )

    async def keep_thread(self, conversation_id: str, *, until: datetime) -> bool:
        """Hold the thread for the turn running in it until `until`; False once it was freed."""
        async with autocommit(self._sessions) as db:
            kept = await db.execute(KEEP_THREAD, {"conversation": conversation_id, "until": until})
        return count(kept) == 1

    async def release_thread(
        self, conversation_id: str, *, snapshot_id: str | None, held: Held | None = None
    ) -> None:
        """Free the thread; the next message continues from `snapshot_id` when given (and
        `held`, that snapshot's row, is written with it)."""
        values = {"conversation": conversation_id, "snapshot": snapshot_id}
        if held is not None and await self._saving(RELEASE_SAVING, values, held):
            return
        async with autocommit(self._sessions) as db:
            await db.execute(RELEASE, values)

    async def _saving(
        self,
        statement: sa.Executable,
        values: dict[str, Any],
        held: Held,
        *,
        resumable: bool = False,
    ) -> Sequence[sa.Row[Any]]:
        """What `statement`, run with the held snapshot's row, read; nothing when it wrote
        nothing, and then the snapshot is written alone, for the caller's plain statement
        to point at. `resumable`: the statement pauses the turn (its resume loads it)."""
        try:
            async with autocommit(self._sessions) as db:
                rows = (await db.execute(statement, values | held.params)).all()
        except IntegrityError as taken:  # its id, or a row of the statement's own, is taken
            if getattr(taken.orig, "sqlstate", None) != UNIQUE_VIOLATION:
                raise
            rows = []
        if rows:
            held.written(resumable)
        else:
            await held.flush()
        return rows

    async def knows(self, thread: Thread) -> bool:
        """Whether the thread is a conversation already."""
        async with autocommit(self._sessions) as db:
            return (await db.execute(KNOWN, thread_params(thread))).first() is not None

    async def waiting_on(self, thread: Thread) -> tuple[Approval, ...]:
        """The approvals of the thread's open turn (empty when it has none)."""
        async with autocommit(self._sessions) as db:
            return located(await db.execute(WAITING_ON, thread_params(thread)))

    # -- paused turns --------------------------------------------------------------------

    async def pause(
        self, turn: PausedTurn, approvals: Sequence[Approval], held: Held | None = None
    ) -> None:
        """PAUSE the turn and REQUEST each approval, audited, atomically (with `held`, the
        turn's snapshot). The thread stays held: the open turn keeps later messages out
        until a resume ends it."""
        values = pause_params(turn, approvals)
        if held is not None:
            saving = paused_turn(len(approvals), saving=True).one
            if await self._saving(saving, values, held, resumable=True):
                return
        await paused_turn(len(approvals)).run(self._sessions, values)

    async def claim(self, turn_id: str, *, now: datetime, lease_until: datetime) -> Claim:
        """CLAIM a turn to resume it, with its approvals (every one decided)."""
        values = {"row_id": turn_id, "now": now, "lease": lease_until}
        rows = await CLAIM_TURN.run(self._sessions, values)
        if not rows:  # a paused turn has one approval per interrupt, so at least one
            raise await self._refusal(CLAIM, values)
        approvals = await with_votes(self._sessions, located(rows))  # their notes, too
        return Claim(
            turn_id=turn_id,
            conversation_id=rows[0].conversation_id,
            thread=approvals[0].thread,
            snapshot_id=rows[0].snapshot_id,
            attempt=rows[0].attempt,
            approvals=approvals,
            lease_until=lease_until,
        )

    async def renew(self, claim: Claim, *, until: datetime) -> None:
        """RENEW the claim's lease until `until` (IllegalTransition once another took over)."""
        values = _claimed(claim) | {"lease": until}
        async with autocommit(self._sessions) as db:
            if (await db.execute(RENEW_LEASE, values)).first() is None:
                raise await refusal(db, RENEW, EXPLAIN_TURN, values)

    async def let_go(self, claim: Claim, *, now: datetime) -> None:
        """LET_GO of the claim: the turn waits again, for the next sweep to CLAIM at once
        (IllegalTransition once another took over)."""
        values = _claimed(claim) | {"now": now}
        async with autocommit(self._sessions) as db:
            if (await db.execute(LET_GO_OF, values)).first() is None:
                raise await refusal(db, LET_GO, EXPLAIN_TURN, values)

    async def complete(
        self, claim: Claim, *, now: datetime, snapshot_id: str | None, held: Held | None = None
    ) -> tuple[Approval, ...]:
        """COMPLETE the resumed turn and free its thread to continue from `snapshot_id`,
        atomically (with `held`, that snapshot's row); returns the turn's approvals, settled."""
        if held is not None:
            values = _claimed(claim) | {"now": now, "conversation": claim.conversation_id}
            values |= {"snapshot": snapshot_id}
            if rows := await self._saving(COMPLETE_SAVING.one, values, held):
                return await with_votes(self._sessions, located(rows))
        return await self._end(COMPLETE, claim, now=now, snapshot_id=snapshot_id)

    async def give_up(self, claim: Claim, *, now: datetime) -> tuple[Approval, ...]:
        """GIVE_UP on the turn and free its thread, which continues from before the turn."""
        return await self._end(GIVE_UP, claim, now=now, snapshot_id=None)

    async def _end(
        self, transition: Transition, claim: Claim, *, now: datetime, snapshot_id: str | None
    ) -> tuple[Approval, ...]:
        values = _claimed(claim) | {"now": now}
        release = {"conversation": claim.conversation_id, "snapshot": snapshot_id}
        if not (rows := await END[transition].run(self._sessions, values | release)):
            raise await self._refusal(transition, values)
        return await with_votes(self._sessions, located(rows))

    async def complete_and_pause(
        self, claim: Claim, *, now: datetime, turn: PausedTurn, approvals: Sequence[Approval]
    ) -> tuple[Approval, ...]:
        """A resume that stopped on new interrupts: COMPLETE this turn and PAUSE the next,
        atomically (the thread stays held); returns this turn's approvals, settled."""
        values = _claimed(claim) | {"now": now} | pause_params(turn, approvals)
        if not (rows := await paused_turn(len(approvals), COMPLETE).run(self._sessions, values)):
            raise await self._refusal(COMPLETE, values)
        return await with_votes(self._sessions, located(rows))

    async def _refusal(self, transition: Transition, values: dict[str, Any]) -> IllegalTransition:
        async with autocommit(self._sessions) as db:
            return await refusal(db, transition, EXPLAIN_TURN, values)

    async def recoverable(
        self, *, now: datetime, team_id: str | None = None, limit: int = 50
    ) -> list[str]:
        """Turns a sweep may CLAIM: decided but idle, or resuming under a dead lease."""
        query = RECOVERABLE if team_id is None else RECOVERABLE.where(T.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return list((await db.execute(query.limit(limit), {"now": now})).scalars())

    async def turn_approvals(self, turn_id: str) -> tuple[Approval, ...]:
        async with autocommit(self._sessions) as db:
            return located(await db.execute(OF_TURN, {"turn": turn_id}))


def _claimed(claim: Claim) -> dict[str, Any]:
    return {"row_id": claim.turn_id, "attempt": claim.attempt}
