"""Conversations, paused turns and approvals: one atomic method per transition and per read.

Every method owns its session. A transition that writes more than one row (a change and
its audit row, a turn and its approvals) is one transaction, on every backend; a lone
statement runs on its own (in autocommit on PostgreSQL, so without BEGIN and COMMIT).

The conditional writes come from storage/lifecycle.py: a transition's WHERE clause is
`guard(transition)`, its source states and requirements, with each requirement's SQL in
REQUIREMENTS. When a write matches no row, `_refusal` reads the same conditions back and
lets the lifecycle say why (IllegalTransition). So when two callers race (two clicks, two
replicas, a retry), exactly one changes the row and the other learns what happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from storage import audit
from storage.db import SessionFactory, autocommit
from storage.lifecycle import (
    APPROVE,
    CLAIM,
    COMPLETE,
    DENY,
    EXPIRE,
    FINISH_EXECUTION,
    GIVE_UP,
    PAUSE,
    RENEW,
    REQUEST,
    START_EXECUTION,
    STATES,
    TRANSITIONS,
    Approval,
    ApprovalState,
    Approved,
    AuditEntry,
    Card,
    Claim,
    Decision,
    Denied,
    Execution,
    ExecutionState,
    Expired,
    Finished,
    IllegalTransition,
    NotStarted,
    PausedTurn,
    Request,
    Requirement,
    Started,
    Subject,
    Thread,
    Transition,
    TurnState,
)
from storage.models import ApprovalRow, ConversationRow, SeenEventRow, TurnRow

A, T, C, S = (
    cast(sa.Table, m.__table__) for m in (ApprovalRow, TurnRow, ConversationRow, SeenEventRow)
)
_sibling = A.alias("sibling")
_now = sa.bindparam("now", type_=A.c.expires_at.type)

# The SQL of each requirement of the lifecycle; a test checks that every one is here.
REQUIREMENTS: Mapping[Requirement, sa.ColumnElement[bool]] = {
    Requirement.BEFORE_DEADLINE: A.c.expires_at > _now,
    Requirement.PAST_DEADLINE: A.c.expires_at <= _now,
    Requirement.APPROVED: A.c.status == ApprovalState.APPROVED,
    Requirement.SAME_CALL: sa.and_(
        A.c.tool == sa.bindparam("call_tool"), A.c.ref == sa.bindparam("call_ref")
    ),
    Requirement.ALL_DECIDED: ~sa.exists().where(
        _sibling.c.turn_id == T.c.id, _sibling.c.status == ApprovalState.PENDING
    ),
    Requirement.LEASE_RAN_OUT: T.c.lease_until < _now,
    Requirement.OWN_CLAIM: T.c.attempts == sa.bindparam("attempt"),
}
STATE_COLUMN = {
    Subject.APPROVAL: A.c.status,
    Subject.EXECUTION: A.c.execution,
    Subject.TURN: T.c.state,
}
_TABLE = {Subject.APPROVAL: A, Subject.EXECUTION: A, Subject.TURN: T}


def guard(transition: Transition) -> sa.ColumnElement[bool]:
    """The transition's WHERE clause: a state it may leave (with what that state requires)
    and what it requires from any state."""
    state = STATE_COLUMN[transition.subject]
    ways = [
        sa.and_(state == source, *(REQUIREMENTS[r] for r in extra))
        for source, extra in transition.leaves.items()
        if source is not None
    ]
    return sa.and_(sa.or_(*ways), *(REQUIREMENTS[r] for r in transition.requires))


def _facts(transition: Transition) -> list[sa.ColumnElement[Any]]:
    """The row's state and each requirement's truth, to explain a write that matched nothing."""
    every = dict.fromkeys(r for s in transition.leaves for r in transition.requirements(s))
    state = STATE_COLUMN[transition.subject].label("state")
    return [state, *(REQUIREMENTS[r].label(f"holds_{r.name}") for r in every)]


def _write(transition: Transition, **values: Any) -> sa.Update:
    """UPDATE … SET the state it enters (and `values`) WHERE id and guard … RETURNING the row.

    An approval is found by its workspace and id (the id comes from a button); a turn by its
    id, which only the store hands out.
    """
    table = _TABLE[transition.subject]
    key = [table.c.id == sa.bindparam("row_id")]
    if table is A:
        key.append(A.c.team_id == sa.bindparam("team"))
    state = STATE_COLUMN[transition.subject].key
    return (
        sa.update(table)
        .where(*key, guard(transition))
        .values({state: transition.enters, **values})
        .returning(table)
    )


_LOCATED = (
    sa.select(A, C.c.channel_id.label("thread_channel"), C.c.thread_ts.label("thread_ts"))
    .join(T, T.c.id == A.c.turn_id)
    .join(C, C.c.id == T.c.conversation_id)
    .order_by(A.c.requested_at, A.c.id)
)
_TEAM = A.c.team_id == sa.bindparam("team")
GET = _LOCATED.where(_TEAM, A.c.id == sa.bindparam("row_id"))
OF_TURN = _LOCATED.where(A.c.turn_id == sa.bindparam("turn"))
PENDING = _LOCATED.where(_TEAM, A.c.status == ApprovalState.PENDING)
OVERDUE = _LOCATED.where(guard(EXPIRE))
UNCARDED = _LOCATED.where(
    A.c.status == ApprovalState.PENDING,
    A.c.card_ts.is_(None),
    A.c.card_channel.is_not(None),
    A.c.requested_at < sa.bindparam("before"),
)
_THREAD = sa.and_(
    C.c.team_id == sa.bindparam("team"),
    C.c.channel_id == sa.bindparam("channel"),
    C.c.thread_ts == sa.bindparam("thread"),
)
_OPEN = T.c.state.in_([TurnState.WAITING, TurnState.RESUMING])
WAITING_ON = _LOCATED.where(_THREAD, _OPEN)
KNOWN = sa.select(C.c.id).where(_THREAD)

# Approvals: the decision, expiry and execution writes, each with its audit row.
DECIDE = {
    t: _write(
        t,
        decided_by=sa.bindparam("by"),
        decided_at=_now,
        reason=sa.bindparam("because"),
    ).returning(
        sa.select(sa.func.count())
        .where(
            _sibling.c.turn_id == A.c.turn_id,
            _sibling.c.id != A.c.id,  # PostgreSQL's RETURNING sees the statement's start
            _sibling.c.status == ApprovalState.PENDING,
        )
        .scalar_subquery()
        .label("others_pending")
    )
    for t in (APPROVE, DENY)
}
EXPIRE_ONE = _write(EXPIRE, decided_at=_now)
START = _write(START_EXECUTION)
FINISH = _write(FINISH_EXECUTION, output=sa.bindparam("result"))
SET_CARD = (
    sa.update(A)
    .where(A.c.id == sa.bindparam("row_id"))
    .values(card_channel=sa.bindparam("channel"), card_ts=sa.bindparam("ts"))
)

# Turns.
CLAIM_TURN = _write(
    CLAIM,
    lease_until=sa.bindparam("lease"),
    attempts=T.c.attempts + 1,
    updated_at=_now,
)
RENEW_LEASE = _write(RENEW, lease_until=sa.bindparam("lease"))
END = {t: _write(t, lease_until=None, updated_at=_now) for t in (COMPLETE, GIVE_UP)}
RECOVERABLE = sa.select(T.c.id).where(guard(CLAIM))

# Conversations (threads): taken by one turn at a time, while it runs or waits.
_idle = sa.and_(
    sa.or_(C.c.busy_until.is_(None), C.c.busy_until < _now),
    ~sa.exists().where(T.c.conversation_id == C.c.id, _OPEN),
)
_NEW_THREAD = {
    "id": sa.bindparam("new_id", type_=C.c.id.type),
    "team_id": sa.bindparam("team", type_=C.c.team_id.type),
    "channel_id": sa.bindparam("channel", type_=C.c.channel_id.type),
    "thread_ts": sa.bindparam("thread", type_=C.c.thread_ts.type),
    "busy_until": sa.bindparam("until", type_=C.c.busy_until.type),
    "created_at": _now,
}
OPEN_THREAD = (
    sa.insert(C)
    .from_select(
        list(_NEW_THREAD),
        sa.select(*_NEW_THREAD.values()).where(~sa.exists().where(_THREAD)),
    )
    .returning(C.c.id, C.c.snapshot_id)
)
TAKE_THREAD = (
    sa.update(C)
    .where(_THREAD, _idle)
    .values(busy_until=sa.bindparam("until"))
    .returning(C.c.id, C.c.snapshot_id)
)
RELEASE = sa.update(C).where(C.c.id == sa.bindparam("conversation")).values(busy_until=None)
RELEASE_AT = RELEASE.values(snapshot_id=sa.bindparam("snapshot"))

_event = {
    "event_id": sa.bindparam("event", type_=S.c.event_id.type),
    "received_at": _now,
}
FIRST_DELIVERY = sa.insert(S).from_select(
    list(_event),
    sa.select(*_event.values()).where(~sa.exists().where(S.c.event_id == _event["event_id"])),
)
FORGET_EVENTS = sa.delete(S).where(S.c.received_at < _now)


@dataclass(frozen=True)
class HeldThread:
    """A thread taken for one turn: its conversation, and the snapshot it continues from."""

    conversation_id: str
    snapshot_id: str | None


class ApprovalStore:
    """The one place approvals, paused turns and conversations are read and written."""

    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    # -- threads -------------------------------------------------------------------------

    async def accept_event(self, event_id: str, *, now: datetime) -> bool:
        """Record a Slack event id; False when it was already recorded (a retry)."""
        try:
            async with autocommit(self._sessions) as db:
                done = await db.execute(FIRST_DELIVERY, {"event": event_id, "now": now})
        except IntegrityError:  # a twin delivery inserted it just now
            return False
        return _count(done) == 1

    async def forget_events(self, *, before: datetime) -> None:
        async with autocommit(self._sessions) as db:
            await db.execute(FORGET_EVENTS, {"now": before})

    async def hold_thread(
        self, thread: Thread, *, new_id: str, now: datetime, until: datetime
    ) -> HeldThread | None:
        """Take the thread's conversation (created on its first message) for one turn, until
        `until`; None while another turn runs or waits for approval in it."""
        values = _thread(thread) | {"new_id": new_id, "now": now, "until": until}
        try:
            async with autocommit(self._sessions) as db:
                row = (await db.execute(OPEN_THREAD, values)).first()
        except IntegrityError:  # a racing first message created it: take it, or find it busy
            row = None
        if row is None:
            async with autocommit(self._sessions) as db:
                row = (await db.execute(TAKE_THREAD, values)).first()
        return None if row is None else HeldThread(row.id, row.snapshot_id)

    async def release_thread(self, conversation_id: str, *, snapshot_id: str | None) -> None:
        """Free the thread; the next message continues from `snapshot_id` when given."""
        async with autocommit(self._sessions) as db:
            await _release(db, conversation_id, snapshot_id)

    async def knows(self, thread: Thread) -> bool:
        """Whether the thread is a conversation already."""
        async with autocommit(self._sessions) as db:
            return (await db.execute(KNOWN, _thread(thread))).first() is not None

    async def waiting_on(self, thread: Thread) -> tuple[Approval, ...]:
        """The approvals of the thread's open turn (empty when it has none)."""
        async with autocommit(self._sessions) as db:
            return _located(await db.execute(WAITING_ON, _thread(thread)))

    # -- paused turns --------------------------------------------------------------------

    async def pause(self, turn: PausedTurn, approvals: Sequence[Approval]) -> None:
        """PAUSE the turn and REQUEST each approval, audited, in one transaction. The thread
        stays held: the open turn keeps later messages out until it ends."""
        async with self._sessions.begin() as db:
            await _insert_paused(db, turn, approvals)

    async def claim(self, turn_id: str, *, now: datetime, lease_until: datetime) -> Claim:
        """CLAIM a turn to resume it, with its approvals (every one decided)."""
        async with autocommit(self._sessions) as db:
            values = {"row_id": turn_id, "now": now, "lease": lease_until}
            row = (await db.execute(CLAIM_TURN, values)).first()
            if row is None:
                raise await _turn_refusal(db, CLAIM, turn_id, now=now)
            approvals = _located(await db.execute(OF_TURN, {"turn": turn_id}))
        return Claim(
            turn_id=row.id,
            conversation_id=row.conversation_id,
            thread=approvals[0].thread,  # a paused turn has one approval per interrupt
            snapshot_id=row.snapshot_id,
            attempt=row.attempts,
            approvals=approvals,
        )

    async def renew(self, claim: Claim, *, until: datetime) -> None:
        """RENEW the claim's lease until `until` (IllegalTransition once another took over)."""
        async with autocommit(self._sessions) as db:
            values = _claimed(claim) | {"lease": until}
            if (await db.execute(RENEW_LEASE, values)).first() is None:
                raise await _turn_refusal(db, RENEW, claim.turn_id, attempt=claim.attempt)

    async def complete(
        self, claim: Claim, *, now: datetime, snapshot_id: str | None
    ) -> tuple[Approval, ...]:
        """COMPLETE the resumed turn and free its thread to continue from `snapshot_id`, in
        one transaction; returns its approvals as settled."""
        async with self._sessions.begin() as db:
            await self._end(db, COMPLETE, claim, now)
            await _release(db, claim.conversation_id, snapshot_id)
        return await self.turn_approvals(claim.turn_id)

    async def complete_and_pause(
        self, claim: Claim, *, now: datetime, turn: PausedTurn, approvals: Sequence[Approval]
    ) -> tuple[Approval, ...]:
        """A resume that stopped on new interrupts: COMPLETE this turn and PAUSE the next in
        one transaction (the thread stays held); returns this turn's approvals."""
        async with self._sessions.begin() as db:
            await self._end(db, COMPLETE, claim, now)
            await _insert_paused(db, turn, approvals)
        return await self.turn_approvals(claim.turn_id)

    async def give_up(self, claim: Claim, *, now: datetime) -> tuple[Approval, ...]:
        """GIVE_UP on the turn and free its thread, which continues from before the turn."""
        async with self._sessions.begin() as db:
            await self._end(db, GIVE_UP, claim, now)
            await _release(db, claim.conversation_id, None)
        return await self.turn_approvals(claim.turn_id)

    async def _end(
        self, db: AsyncSession, transition: Transition, claim: Claim, now: datetime
    ) -> None:
        values = _claimed(claim) | {"now": now}
        if (await db.execute(END[transition], values)).first() is None:
            raise await _turn_refusal(db, transition, claim.turn_id, attempt=claim.attempt)

    async def recoverable(
        self, *, now: datetime, team_id: str | None = None, limit: int = 50
    ) -> list[str]:
        """Turns a sweep may CLAIM: decided but idle, or resuming under a dead lease."""
        query = RECOVERABLE if team_id is None else RECOVERABLE.where(T.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return list((await db.execute(query.limit(limit), {"now": now})).scalars())

    async def turn_approvals(self, turn_id: str) -> tuple[Approval, ...]:
        async with autocommit(self._sessions) as db:
            return _located(await db.execute(OF_TURN, {"turn": turn_id}))

    # -- approvals -----------------------------------------------------------------------

    async def decide(self, approval: Approval, decision: Approved | Denied) -> tuple[Approval, int]:
        """APPROVE or DENY, audited; the approval as decided, and how many of its turn's
        approvals still wait. IllegalTransition (with the current approval) when it was
        decided already or its deadline passed."""
        transition = APPROVE if isinstance(decision, Approved) else DENY
        values = _key(approval) | {
            "by": decision.by,
            "because": decision.reason,
            "now": decision.at,
        }
        async with self._sessions.begin() as db:
            row = (await db.execute(DECIDE[transition], values)).first()
            if row is None:
                raise await _approval_refusal(db, transition, approval, now=decision.at)
            await db.execute(audit.INSERT, _audit(transition, row._mapping, decision.at))
        return _approval(row._mapping, approval.thread), int(row.others_pending)

    async def expire(self, approval: Approval, *, now: datetime) -> Approval:
        """EXPIRE a pending approval past its deadline, audited."""
        async with self._sessions.begin() as db:
            row = (await db.execute(EXPIRE_ONE, _key(approval) | {"now": now})).first()
            if row is None:
                raise await _approval_refusal(db, EXPIRE, approval, now=now)
            await db.execute(audit.INSERT, _audit(EXPIRE, row._mapping, now))
        return _approval(row._mapping, approval.thread)

    async def start_execution(
        self, approval_id: str, *, team_id: str, tool: str, ref: str, now: datetime
    ) -> None:
        """START_EXECUTION of an approved call, audited and committed before the tool runs:
        the one gate every execution passes. IllegalTransition, with the approval as it is,
        for every caller but the first."""
        values = {"row_id": approval_id, "team": team_id, "call_tool": tool, "call_ref": ref}
        async with self._sessions.begin() as db:
            row = (await db.execute(START, values)).first()
            if row is None:
                raise await _refusal(db, START_EXECUTION, _EXPLAIN_APPROVAL, values)
            await db.execute(audit.INSERT, _audit(START_EXECUTION, row._mapping, now))

    async def finish_execution(
        self, approval_id: str, *, team_id: str, output: Any, now: datetime
    ) -> None:
        """FINISH_EXECUTION with the tool's output, audited."""
        values = {"row_id": approval_id, "team": team_id, "result": output}
        async with self._sessions.begin() as db:
            row = (await db.execute(FINISH, values)).first()
            if row is None:
                raise await _refusal(db, FINISH_EXECUTION, _EXPLAIN_APPROVAL, values)
            await db.execute(audit.INSERT, _audit(FINISH_EXECUTION, row._mapping, now))

    async def attach_card(self, approval_id: str, *, channel: str, ts: str) -> None:
        async with autocommit(self._sessions) as db:
            await db.execute(SET_CARD, {"row_id": approval_id, "channel": channel, "ts": ts})

    async def get(self, team_id: str, approval_id: str) -> Approval | None:
        async with autocommit(self._sessions) as db:
            found = _located(await db.execute(GET, {"team": team_id, "row_id": approval_id}))
        return found[0] if found else None

    async def pending(self, team_id: str) -> tuple[Approval, ...]:
        async with autocommit(self._sessions) as db:
            return _located(await db.execute(PENDING, {"team": team_id}))

    async def overdue(self, *, now: datetime, team_id: str | None = None) -> tuple[Approval, ...]:
        """Pending approvals an EXPIRE may take now."""
        query = OVERDUE if team_id is None else OVERDUE.where(A.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return _located(await db.execute(query, {"now": now}))

    async def uncarded(
        self, *, before: datetime, team_id: str | None = None
    ) -> tuple[Approval, ...]:
        """Pending approvals, requested before `before`, whose card was never posted."""
        query = UNCARDED if team_id is None else UNCARDED.where(A.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return _located(await db.execute(query, {"before": before}))

    async def audit_trail(
        self, team_id: str, *, tool: str | None = None, limit: int = 20
    ) -> list[AuditEntry]:
        async with autocommit(self._sessions) as db:
            return await audit.recent(db, team_id, tool=tool, limit=limit)


_EXPLAIN_APPROVAL = {
    t: GET.add_columns(*_facts(t)) for t in TRANSITIONS if t.subject != Subject.TURN
}
_EXPLAIN_TURN = {
    t: sa.select(*_facts(t)).where(T.c.id == sa.bindparam("row_id"))
    for t in TRANSITIONS
    if t.subject == Subject.TURN
}


async def _refusal(
    db: AsyncSession,
    transition: Transition,
    explain: Mapping[Transition, Any],
    values: dict[str, Any],
) -> IllegalTransition:
    """Why `transition` matched no row: the lifecycle's verdict on the row as it is now."""
    row = (await db.execute(explain[transition], values)).first()
    if row is None:
        return IllegalTransition(transition, None)
    state = STATES[transition.subject](row.state)
    current = (
        _approval(row._mapping, _thread_of(row)) if transition.subject != Subject.TURN else None
    )
    holds = {r: bool(row._mapping[f"holds_{r.name}"]) for r in transition.requirements(state)}
    try:
        transition.check(state, holds)
    except IllegalTransition as refused:
        refused.current = current
        return refused
    # Unreachable while states only move forward; said plainly if it ever is not.
    return IllegalTransition(transition, state, current=current)


async def _approval_refusal(
    db: AsyncSession, transition: Transition, approval: Approval, *, now: datetime
) -> IllegalTransition:
    return await _refusal(db, transition, _EXPLAIN_APPROVAL, _key(approval) | {"now": now})


async def _turn_refusal(
    db: AsyncSession,
    transition: Transition,
    turn_id: str,
    *,
    now: datetime | None = None,
    attempt: int | None = None,
) -> IllegalTransition:
    values = {"row_id": turn_id, "now": now, "attempt": attempt}
    return await _refusal(db, transition, _EXPLAIN_TURN, values)


async def _insert_paused(db: AsyncSession, turn: PausedTurn, approvals: Sequence[Approval]) -> None:
    """A new waiting turn (PAUSE), and its pending approvals (REQUEST) with their audit rows."""
    rows = [_columns(a) for a in approvals]
    await db.execute(
        sa.insert(T),
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
        },
    )
    await db.execute(sa.insert(A), rows)
    await db.execute(audit.INSERT, [_audit(REQUEST, row, turn.at) for row in rows])


async def _release(db: AsyncSession, conversation_id: str, snapshot_id: str | None) -> None:
    if snapshot_id is None:
        await db.execute(RELEASE, {"conversation": conversation_id})
    else:
        await db.execute(RELEASE_AT, {"conversation": conversation_id, "snapshot": snapshot_id})


def _count(result: Any) -> int:
    return int(cast(sa.CursorResult[Any], result).rowcount)


def _thread(thread: Thread) -> dict[str, str]:
    return {"team": thread.team_id, "channel": thread.channel_id, "thread": thread.thread_ts}


def _key(approval: Approval) -> dict[str, str]:
    return {"row_id": approval.id, "team": approval.thread.team_id}


def _claimed(claim: Claim) -> dict[str, Any]:
    return {"row_id": claim.turn_id, "attempt": claim.attempt}


def _audit(transition: Transition, row: Mapping[Any, Any], at: datetime) -> dict[str, Any]:
    """The audit row `transition` appends, from the approval's columns after the change."""
    spec = transition.audit
    assert spec is not None, f"{transition.name} records nothing"
    actor = {"decider": row["decided_by"], "requester": row["requester"], "greenlight": None}
    return audit.entry(
        team_id=row["team_id"],
        at=at,
        actor=actor[spec.actor] or "greenlight",
        action=spec.action,
        tool=row["tool"],
        approval_id=row["id"],
        **{key: row[key] for key in spec.detail},
    )


def _thread_of(row: Any) -> Thread:
    return Thread(row.team_id, row.thread_channel, row.thread_ts)


def _located(result: Any) -> tuple[Approval, ...]:
    return tuple(_approval(row._mapping, _thread_of(row)) for row in result)


def _approval(row: Mapping[Any, Any], thread: Thread) -> Approval:
    """An approvals row as the lifecycle's value."""
    request = Request(
        tool=row["tool"],
        ref=row["ref"],
        input=dict(row["input"]),
        requester=row["requester"],
        why=row["why"],
        requested_at=row["requested_at"],
        expires_at=row["expires_at"],
    )
    card = None if row["card_channel"] is None else Card(row["card_channel"], row["card_ts"])
    return Approval(
        id=row["id"],
        turn_id=row["turn_id"],
        thread=thread,
        request=request,
        decision=_decision(row),
        execution=_execution(row),
        card=card,
    )


def _decision(row: Mapping[Any, Any]) -> Decision | None:
    by, at, reason = row["decided_by"], row["decided_at"], row["reason"]
    match ApprovalState(row["status"]):
        case ApprovalState.PENDING:
            return None
        case ApprovalState.APPROVED:
            return Approved(by, at, reason)
        case ApprovalState.DENIED:
            return Denied(by, at, reason)
        case ApprovalState.EXPIRED:
            return Expired(at)


def _execution(row: Mapping[Any, Any]) -> Execution:
    match ExecutionState(row["execution"]):
        case ExecutionState.NOT_STARTED:
            return NotStarted()
        case ExecutionState.STARTED:
            return Started()
        case ExecutionState.FINISHED:
            return Finished(row["output"])


def _columns(approval: Approval) -> dict[str, Any]:
    """A new (pending) approval as an approvals row."""
    r = approval.request
    return {
        "id": approval.id,
        "team_id": approval.thread.team_id,
        "turn_id": approval.turn_id,
        "tool": r.tool,
        "ref": r.ref,
        "input": r.input,
        "requester": r.requester,
        "requested_at": r.requested_at,
        "expires_at": r.expires_at,
        "why": r.why,
        "status": REQUEST.enters,
        "decided_by": None,
        "decided_at": None,
        "reason": None,
        "execution": ExecutionState.NOT_STARTED,
        "output": None,
        "card_channel": approval.card.channel if approval.card else None,
        "card_ts": None,
    }
