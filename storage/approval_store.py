"""Conversations, paused turns and approvals: one atomic method per transition and per read.

Every method owns its session. The conditional writes come from storage/lifecycle.py, by
way of storage/transitions.py: a transition's WHERE clause is `guard(transition)`, its
source states and requirements. When a write matches no row, `_refusal` reads the same
conditions back and lets the lifecycle say why (IllegalTransition). So when two
callers race (two clicks, two replicas, a retry), exactly one changes the row and the
other learns what happened.

A transition that writes more than one row (a decision and its audit row, a paused turn and
its approvals, a finished turn and its freed thread) is an `Atomic`: one statement on
PostgreSQL, one transaction elsewhere. A lone statement runs on its own (in autocommit on
PostgreSQL: no BEGIN and COMMIT round trips).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from pydantic import TypeAdapter
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from storage import audit
from storage.db import SessionFactory, autocommit
from storage.domain import (
    Answered,
    Approval,
    ApprovalState,
    Approved,
    AuditEntry,
    Card,
    CardState,
    Claim,
    Context,
    Decision,
    Denied,
    Edit,
    EscalationState,
    Execution,
    ExecutionState,
    Expired,
    Finished,
    FollowUp,
    History,
    NotStarted,
    PausedTurn,
    ReminderState,
    Request,
    Started,
    Thread,
    Vote,
)
from storage.lifecycle import (
    ANSWER,
    APPROVE,
    CARD_FAILED,
    CARD_POSTED,
    CLAIM,
    COMPLETE,
    DENY,
    EDIT,
    ESCALATE,
    EXPIRE,
    FINISH_EXECUTION,
    GIVE_UP,
    LET_GO,
    OPEN_TURN,
    PAUSE,
    REMIND,
    RENEW,
    REQUEST,
    RETRY_CARD,
    START_EXECUTION,
    STATES,
    TRANSITIONS,
    VOTE,
    IllegalTransition,
    Requirement,
    Subject,
    Transition,
)
from storage.models import (
    PolicyRow,
)
from storage.policies import POLICY_FIELDS, StoredPolicy, stored_policy
from storage.transitions import (
    NOW,
    ROW_ID,
    SIBLING,
    A,
    Atomic,
    C,
    NewRow,
    S,
    T,
    V,
    facts,
    guard,
    write,
)

_LOCATED = (
    sa.select(A, C.c.channel_id.label("thread_channel"), C.c.thread_ts.label("thread_ts"))
    .join(T, T.c.id == A.c.turn_id)
    .join(C, C.c.id == T.c.conversation_id)
    .order_by(A.c.requested_at, A.c.id)
)
_TEAM = A.c.team_id == sa.bindparam("team")
GET = _LOCATED.where(_TEAM, A.c.id == ROW_ID)
OF_TURN = _LOCATED.where(A.c.turn_id == sa.bindparam("turn"))
# An approval to decide, with its tool's stored policy (None: the defaults) in one query.
_P = cast(sa.Table, PolicyRow.__table__)
DECIDABLE = GET.add_columns(*(_P.c[f].label(f"policy_{f}") for f in POLICY_FIELDS)).outerjoin(
    _P, sa.and_(_P.c.team_id == A.c.team_id, _P.c.tool == A.c.tool)
)
PENDING = _LOCATED.where(_TEAM, A.c.status == ApprovalState.PENDING)
_PERSON: sa.BindParameter[str] = sa.bindparam("person", type_=sa.String())
# The Home tab (bot/home.py), each bounded by a LIMIT: others' open requests, found by
# ix_approvals_status_expiry; and a requester's own whose turn goes on, by
# ix_approvals_requester (its (team_id, requester) prefix).
INBOX = PENDING.where(A.c.requester != _PERSON)
_GOES_ON = (ApprovalState.PENDING, ApprovalState.APPROVED, ApprovalState.ANSWERED)
# Pending requests by tool, every workspace: one row per tool, read off the status index.
PENDING_BY_TOOL = (
    sa.select(A.c.tool, sa.func.count())
    .where(A.c.status == ApprovalState.PENDING)
    .group_by(A.c.tool)
)
OVERDUE = _LOCATED.where(guard(EXPIRE))
STALE_CARDS = _LOCATED.where(guard(RETRY_CARD))
DUE = {t: _LOCATED.where(guard(t)) for t in (REMIND, ESCALATE)}
_THREAD = sa.and_(
    C.c.team_id == sa.bindparam("team"),
    C.c.channel_id == sa.bindparam("channel"),
    C.c.thread_ts == sa.bindparam("thread"),
)
_OPEN = T.c.state.in_(OPEN_TURN)
WAITING_ON = _LOCATED.where(_THREAD, _OPEN)
REQUESTED = _LOCATED.where(_TEAM, A.c.requester == _PERSON, A.c.status.in_(_GOES_ON), _OPEN)
KNOWN = sa.select(C.c.id).where(_THREAD)
# A requester's earlier requests for some tools, by how they ended.
HISTORY = (
    sa.select(A.c.tool, A.c.status, sa.func.count())
    .where(
        _TEAM,
        A.c.requester == sa.bindparam("requester"),
        A.c.tool.in_(sa.bindparam("tools", expanding=True)),
        A.c.requested_at >= sa.bindparam("since"),
        A.c.status != ApprovalState.PENDING,
    )
    .group_by(A.c.tool, A.c.status)
)
SNAPSHOT_OF_TURN = sa.select(T.c.snapshot_id).where(T.c.id == sa.bindparam("turn"))
# A request's context as JSON and back (validated: the column is only as good as its reader).
CONTEXT = TypeAdapter(Context)


NOTE = NewRow(audit.TABLE, "audit_")  # a transition's audit row

# Approvals: each change with its audit row.
_OTHERS_PENDING = (
    sa.select(sa.func.count())
    .where(
        SIBLING.c.turn_id == A.c.turn_id,
        SIBLING.c.id != A.c.id,  # PostgreSQL's RETURNING sees the statement's start
        SIBLING.c.status == ApprovalState.PENDING,
    )
    .scalar_subquery()
    .label("others_pending")
)
_completes = guard(APPROVE)  # read off the row as it was: this vote completes the quorum


_EDITED = sa.bindparam("edited", type_=sa.JSON(none_as_null=True))
_EDITED_PREVIEW = sa.bindparam("new_preview", type_=A.c.edited_preview.type)


def _if_complete(value: Any) -> sa.Case[Any]:
    return sa.case((_completes, value), else_=sa.null())


# An Approve: VOTE or APPROVE, whichever the row allows, in one write with the vote's row.
APPROVING = Atomic(
    sa.update(A)
    .where(A.c.id == ROW_ID, _TEAM, sa.or_(guard(VOTE), guard(APPROVE)))
    .values(
        status=sa.case(
            (_completes, sa.literal(APPROVE.enters, A.c.status.type)),
            else_=sa.literal(VOTE.enters, A.c.status.type),
        ),
        votes=A.c.votes + 1,
        decided_by=_if_complete(sa.bindparam("by")),
        decided_at=_if_complete(NOW),
        reason=_if_complete(sa.bindparam("because")),
        # Approved with changes (one approver needed): the edit is part of the decision,
        # and the version it makes is the one approved.
        edited_input=sa.func.coalesce(_EDITED, A.c.edited_input),
        edited_by=sa.case((_EDITED.is_not(None), sa.bindparam("by")), else_=A.c.edited_by),
        edited_at=sa.case((_EDITED.is_not(None), NOW), else_=A.c.edited_at),
        edited_preview=sa.case((_EDITED.is_not(None), _EDITED_PREVIEW), else_=A.c.edited_preview),
        version=sa.case((_EDITED.is_not(None), A.c.version + 1), else_=A.c.version),
    )
    .returning(A, _OTHERS_PENDING),
    NewRow(V, "vote_"),
    NOTE,
)
DENYING = Atomic(
    write(
        DENY, decided_by=sa.bindparam("by"), decided_at=NOW, reason=sa.bindparam("because")
    ).returning(_OTHERS_PENDING),
    NOTE,
)
# EDIT: a new version, its votes the editor's alone; in one transaction (edits are rare).
EDITING = write(
    EDIT,
    votes=1,
    version=A.c.version + 1,
    edited_input=_EDITED,
    edited_by=sa.bindparam("by"),
    edited_at=NOW,
    edited_preview=_EDITED_PREVIEW,
)
_EDITOR = sa.bindparam("by", type_=V.c.voter.type)
EARLIER_VOTES = sa.delete(V).where(V.c.approval_id == ROW_ID)  # they named other versions
EDITORS_VOTE = sa.insert(V).values(
    approval_id=ROW_ID, voter=_EDITOR, at=NOW, version=sa.bindparam("new_version")
)
ANSWERING = Atomic(
    write(
        ANSWER, decided_by=sa.bindparam("by"), decided_at=NOW, answer=sa.bindparam("answer")
    ).returning(_OTHERS_PENDING),
    NOTE,
)
VOTES = (
    sa.select(V.c.approval_id, V.c.voter, V.c.at)
    .where(V.c.approval_id.in_(sa.bindparam("ids", expanding=True)))
    .order_by(V.c.at, V.c.voter)
)
EXPIRE_ONE = Atomic(write(EXPIRE, decided_at=NOW), NOTE)
START = Atomic(write(START_EXECUTION), NOTE)
FINISH = Atomic(write(FINISH_EXECUTION, output=sa.bindparam("result")), NOTE)
# The card's outbox.
POSTED = write(CARD_POSTED, card_ts=sa.bindparam("ts"))
FAILED = Atomic(write(CARD_FAILED), NOTE)
RETRY = write(RETRY_CARD, card_attempted_at=NOW)
# Follow-ups, each with its audit row.
FOLLOW_UP = {t: Atomic(write(t), NOTE) for t in (REMIND, ESCALATE)}
ESCALATION_POSTED = (
    sa.update(A).where(A.c.id == ROW_ID, _TEAM).values(escalation_ts=sa.bindparam("ts"))
)


# Turns.
def _approvals_of(turn: sa.FromClause) -> sa.Select[Any]:
    """The approvals of `turn` (a changed turn row) with their thread, and the turn's own
    fields a resume needs."""
    fields = (turn.c.conversation_id, turn.c.snapshot_id, turn.c.attempts.label("attempt"))
    return _LOCATED.add_columns(*fields).where(A.c.turn_id == turn.c.id)


CLAIM_TURN = Atomic(
    write(CLAIM, lease_until=sa.bindparam("lease"), attempts=T.c.attempts + 1, updated_at=NOW),
    read=_approvals_of,
)
RENEW_LEASE = write(RENEW, lease_until=sa.bindparam("lease"))
LET_GO_OF = write(LET_GO, lease_until=None, updated_at=NOW)
RECOVERABLE = sa.select(T.c.id).where(guard(CLAIM))
# The thread freed; the next message continues from `snapshot` when given.
RELEASE = (
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


@functools.cache
def paused_turn(approvals: int, after: Transition | None = None) -> Atomic:
    """PAUSE a turn with `approvals` REQUESTs and their audit rows; `after`: the turn a
    resume COMPLETEs in the same breath (its interrupts chained). Built once per shape."""
    turn = NewRow(T, "t_")
    rows = [NewRow(A, f"a{i}_") for i in range(approvals)]
    notes = [NewRow(audit.TABLE, f"e{i}_") for i in range(approvals)]
    if after is None:
        return Atomic(turn.alone().returning(T.c.id), *rows, *notes)
    ended = write(after, lease_until=None, updated_at=NOW)
    return Atomic(ended, turn, *rows, *notes, read=_approvals_of)


# Conversations (threads): taken by one turn at a time, while it runs or waits.
_idle = sa.and_(
    sa.or_(C.c.busy_until.is_(None), C.c.busy_until < NOW),
    ~sa.exists().where(T.c.conversation_id == C.c.id, _OPEN),
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
OPEN_THREAD = (
    sa.insert(C)
    .from_select(
        list(_NEW_THREAD),
        sa.select(*_NEW_THREAD.values()).where(~sa.exists().where(_THREAD)),
    )
    .returning(C.c.id, C.c.snapshot_id, C.c.participants)
)
TAKE_THREAD = (
    sa.update(C)
    .where(_THREAD, _idle)
    .values(busy_until=sa.bindparam("until"), last_active_at=NOW)
    .returning(C.c.id, C.c.snapshot_id, C.c.participants)
)
# A running turn's hold, renewed while the turn runs; a hold already let go stays free.
KEEP_THREAD = (
    sa.update(C)
    .where(C.c.id == sa.bindparam("conversation"), C.c.busy_until.is_not(None))
    .values(busy_until=sa.bindparam("until", type_=C.c.busy_until.type))
)
# Only the thread's holder writes it, so a whole new list loses nobody.
SET_PARTICIPANTS = (
    sa.update(C)
    .where(C.c.id == sa.bindparam("conversation"))
    .values(participants=sa.bindparam("people", type_=C.c.participants.type))
)

_event = {
    "event_id": sa.bindparam("event", type_=S.c.event_id.type),
    "received_at": NOW,
}
FIRST_DELIVERY = sa.insert(S).from_select(
    list(_event),
    sa.select(*_event.values()).where(~sa.exists().where(S.c.event_id == _event["event_id"])),
)


@dataclass(frozen=True)
class HeldThread:
    """A thread taken for one turn: its conversation, the snapshot it continues from, and
    every human whose message ran a turn in it (this turn's author included)."""

    conversation_id: str
    snapshot_id: str | None
    participants: tuple[str, ...]


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

    async def hold_thread(
        self, thread: Thread, *, author: str, new_id: str, now: datetime, until: datetime
    ) -> HeldThread | None:
        """Take the thread's conversation (created on its first message) for one turn by
        `author`'s message, until `until`; None while another turn runs or waits for
        approval in it. The author joins the conversation's participants."""
        values = _thread(thread) | {"new_id": new_id, "now": now, "until": until}
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

    async def keep_thread(self, conversation_id: str, *, until: datetime) -> bool:
        """Hold the thread for the turn running in it until `until`; False once it was freed."""
        async with autocommit(self._sessions) as db:
            kept = await db.execute(KEEP_THREAD, {"conversation": conversation_id, "until": until})
        return _count(kept) == 1

    async def release_thread(self, conversation_id: str, *, snapshot_id: str | None) -> None:
        """Free the thread; the next message continues from `snapshot_id` when given."""
        async with autocommit(self._sessions) as db:
            await db.execute(RELEASE, {"conversation": conversation_id, "snapshot": snapshot_id})

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
        """PAUSE the turn and REQUEST each approval, audited, atomically. The thread stays
        held: the open turn keeps later messages out until a resume ends it."""
        await paused_turn(len(approvals)).run(self._sessions, pause_params(turn, approvals))

    async def claim(self, turn_id: str, *, now: datetime, lease_until: datetime) -> Claim:
        """CLAIM a turn to resume it, with its approvals (every one decided)."""
        values = {"row_id": turn_id, "now": now, "lease": lease_until}
        rows = await CLAIM_TURN.run(self._sessions, values)
        if not rows:  # a paused turn has one approval per interrupt, so at least one
            raise await self._turn_refusal(CLAIM, values)
        approvals = _located(rows)
        return Claim(
            turn_id=turn_id,
            conversation_id=rows[0].conversation_id,
            thread=approvals[0].thread,
            snapshot_id=rows[0].snapshot_id,
            attempt=rows[0].attempt,
            approvals=approvals,
        )

    async def renew(self, claim: Claim, *, until: datetime) -> None:
        """RENEW the claim's lease until `until` (IllegalTransition once another took over)."""
        values = _claimed(claim) | {"lease": until}
        async with autocommit(self._sessions) as db:
            if (await db.execute(RENEW_LEASE, values)).first() is None:
                raise await _refusal(db, RENEW, _EXPLAIN_TURN, values)

    async def let_go(self, claim: Claim, *, now: datetime) -> None:
        """LET_GO of the claim: the turn waits again, for the next sweep to CLAIM at once
        (IllegalTransition once another took over)."""
        values = _claimed(claim) | {"now": now}
        async with autocommit(self._sessions) as db:
            if (await db.execute(LET_GO_OF, values)).first() is None:
                raise await _refusal(db, LET_GO, _EXPLAIN_TURN, values)

    async def complete(
        self, claim: Claim, *, now: datetime, snapshot_id: str | None
    ) -> tuple[Approval, ...]:
        """COMPLETE the resumed turn and free its thread to continue from `snapshot_id`,
        atomically; returns the turn's approvals, settled."""
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
            raise await self._turn_refusal(transition, values)
        return await self._with_votes(_located(rows))

    async def complete_and_pause(
        self, claim: Claim, *, now: datetime, turn: PausedTurn, approvals: Sequence[Approval]
    ) -> tuple[Approval, ...]:
        """A resume that stopped on new interrupts: COMPLETE this turn and PAUSE the next,
        atomically (the thread stays held); returns this turn's approvals, settled."""
        values = _claimed(claim) | {"now": now} | pause_params(turn, approvals)
        if not (rows := await paused_turn(len(approvals), COMPLETE).run(self._sessions, values)):
            raise await self._turn_refusal(COMPLETE, values)
        return await self._with_votes(_located(rows))

    async def _turn_refusal(
        self, transition: Transition, values: dict[str, Any]
    ) -> IllegalTransition:
        async with autocommit(self._sessions) as db:
            return await _refusal(db, transition, _EXPLAIN_TURN, values)

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

    async def decide(
        self,
        approval: Approval,
        decision: Approved | Denied,
        *,
        edited: Edit | None = None,
        seen: int | None = None,
    ) -> tuple[Approval, int]:
        """An Approve of version `seen` (VOTE, or APPROVE once it completes the quorum;
        `edited`: with changes, of a request one approver decides, approving the version
        they make) or a DENY of it, audited; the approval as it is now, and how many of its
        turn's approvals still wait. IllegalTransition (with the current approval) when it
        was decided already, its deadline passed, this person approved it before, or `seen`
        (by default: `approval`'s version) is no longer the current version."""
        seen = approval.version if seen is None else seen
        version = seen + 1 if edited else seen
        decided = replace(
            approval, decision=decision, edit=edited or approval.edit, version=version
        )
        params: dict[str, Any] = {"by": decision.by, "because": decision.reason}
        params |= {"now": decision.at, "edited": edited.input if edited else None}
        params |= {"new_preview": edited.preview if edited else None, "seen": seen}
        if isinstance(decision, Denied):
            row = await self._change(DENYING, DENY, decided, decision.at, params)
            return _approval(row._mapping, approval.thread), int(row.others_pending)
        vote = NewRow(V, "vote_").params(
            {"approval_id": approval.id, "voter": decision.by, "at": decision.at}
            | {"version": version}
        )
        try:
            row = await self._change(APPROVING, APPROVE, decided, decision.at, params | vote)
        except IntegrityError:  # the same person's second vote, racing the first
            current = await self.get(approval.thread.team_id, approval.id)
            state = current.state if current else None
            raise IllegalTransition(
                VOTE, state, (Requirement.NEW_VOTER,), current=current
            ) from None
        except IllegalTransition as refused:
            if refused.unmet != (Requirement.QUORUM_MET,):
                raise
            async with autocommit(self._sessions) as db:  # it was a VOTE that did not take
                values = _key(approval) | params
                raise await _refusal(db, VOTE, _EXPLAIN_APPROVAL, values) from None
        [now] = await self._with_votes([_approval(row._mapping, approval.thread)])
        return now, int(row.others_pending)

    async def edit(self, approval: Approval, edit: Edit, *, seen: int | None = None) -> Approval:
        """EDIT a request that needs several approvers, audited, in one transaction: a new
        version, standing with the editor's vote alone. IllegalTransition when it was
        decided, its deadline passed, `seen` (by default: `approval`'s version) is no longer
        the current version, or it needs one approver (then the edit is an APPROVE)."""
        seen = approval.version if seen is None else seen
        edited = replace(approval, edit=edit, votes=(Vote(edit.by, edit.at),), version=seen + 1)
        params = _key(approval) | {"by": edit.by, "edited": edit.input, "now": edit.at}
        params |= {"new_preview": edit.preview, "seen": seen, "new_version": seen + 1}
        note = NOTE.params(_audit(EDIT, edited, edit.at))
        async with self._sessions.begin() as db:
            row = (await db.execute(EDITING, params)).first()
            if row is None:  # nothing was written: say why
                raise await _refusal(db, EDIT, _EXPLAIN_APPROVAL, params)
            await db.execute(EARLIER_VOTES, params)
            await db.execute(EDITORS_VOTE, params)
            await db.execute(NOTE.alone(), note)
        [now] = await self._with_votes([_approval(row._mapping, approval.thread)])
        return now

    async def answer(self, approval: Approval, answered: Answered) -> tuple[Approval, int]:
        """ANSWER a question, audited: the approval as it is now, and how many of its turn's
        requests still wait. IllegalTransition when it was answered (or expired) already."""
        params = {"by": answered.by, "answer": answered.answer, "now": answered.at}
        done = replace(approval, decision=answered)
        row = await self._change(ANSWERING, ANSWER, done, answered.at, params)
        return _approval(row._mapping, approval.thread), int(row.others_pending)

    async def _with_votes(self, approvals: Sequence[Approval]) -> tuple[Approval, ...]:
        """`approvals` with who approved each so far, for those that need several."""
        ids = [a.id for a in approvals if a.request.approvals_needed > 1]
        if not ids:
            return tuple(approvals)
        async with autocommit(self._sessions) as db:
            rows = (await db.execute(VOTES, {"ids": ids})).all()
        votes: dict[str, list[Vote]] = {}
        for row in rows:
            votes.setdefault(row.approval_id, []).append(Vote(row.voter, row.at))
        return tuple(replace(a, votes=tuple(votes.get(a.id, ()))) for a in approvals)

    async def expire(self, approval: Approval, *, now: datetime) -> Approval:
        """EXPIRE a pending approval past its deadline, audited."""
        row = await self._change(EXPIRE_ONE, EXPIRE, approval, now, {"now": now})
        return _approval(row._mapping, approval.thread)

    async def start_execution(self, approval: Approval, *, now: datetime) -> None:
        """START_EXECUTION of an approved call, audited, committed before the tool runs: the
        one gate every execution passes. IllegalTransition, with the approval as it is now,
        for every caller but the first."""
        r = approval.request
        call = {"call_tool": r.tool, "call_ref": r.ref, "call_version": approval.version}
        await self._change(START, START_EXECUTION, approval, now, call)

    async def finish_execution(self, approval: Approval, *, output: Any, now: datetime) -> None:
        """FINISH_EXECUTION with the tool's output, audited."""
        finished = replace(approval, execution=Finished(output))
        await self._change(FINISH, FINISH_EXECUTION, finished, now, {"result": output})

    async def _change(
        self,
        atomic: Atomic,
        transition: Transition,
        approval: Approval,
        at: datetime,
        params: dict[str, Any],
    ) -> sa.Row[Any]:
        """An approval's transition with its audit row (`approval` as it is after it);
        IllegalTransition when it may not happen, and then nothing was written."""
        values = _key(approval) | params
        note = NOTE.params(_audit(transition, approval, at))
        if not (rows := await atomic.run(self._sessions, values | note)):
            async with autocommit(self._sessions) as db:
                raise await _refusal(db, transition, _EXPLAIN_APPROVAL, values | {"now": at})
        return rows[0]

    async def card_posted(self, approval: Approval, *, ts: str) -> Approval:
        """CARD_POSTED: the card is out, at `ts`."""
        return await self._card(POSTED, CARD_POSTED, approval, {"ts": ts})

    async def retry_card(self, approval: Approval, *, now: datetime, stale: datetime) -> Approval:
        """RETRY_CARD: take over a post cut off before `stale` (one sweep gets it)."""
        return await self._card(RETRY, RETRY_CARD, approval, {"now": now, "card_stale": stale})

    async def _card(
        self, write: sa.Update, transition: Transition, approval: Approval, params: dict[str, Any]
    ) -> Approval:
        values = _key(approval) | params
        async with autocommit(self._sessions) as db:
            row = (await db.execute(write, values)).first()
            if row is None:
                raise await _refusal(db, transition, _EXPLAIN_APPROVAL, values)
        return _approval(row._mapping, approval.thread)

    async def card_failed(self, approval: Approval, *, now: datetime) -> Approval:
        """CARD_FAILED, audited: Slack refused the card for good."""
        row = await self._change(FAILED, CARD_FAILED, approval, now, {})
        return _approval(row._mapping, approval.thread)

    async def decidable(
        self, team_id: str, approval_id: str
    ) -> tuple[Approval, StoredPolicy | None] | None:
        """The approval and its tool's stored policy, read together for a decision."""
        async with autocommit(self._sessions) as db:
            row = (await db.execute(DECIDABLE, {"team": team_id, "row_id": approval_id})).first()
        if row is None:
            return None
        policy = None
        if row.policy_tool is not None:
            policy = stored_policy({f: row._mapping[f"policy_{f}"] for f in POLICY_FIELDS})
        return _approval(row._mapping, _thread_of(row)), policy

    async def get(self, team_id: str, approval_id: str) -> Approval | None:
        async with autocommit(self._sessions) as db:
            found = _located(await db.execute(GET, {"team": team_id, "row_id": approval_id}))
        return (await self._with_votes(found))[0] if found else None

    async def pending(
        self, team_id: str, *, limit: int = 20, offset: int = 0
    ) -> tuple[Approval, ...]:
        """Pending approvals, oldest first, a page at a time."""
        query = PENDING.limit(limit).offset(offset)
        async with autocommit(self._sessions) as db:
            return _located(await db.execute(query, {"team": team_id}))

    async def inbox(self, team_id: str, person: str, *, limit: int) -> tuple[Approval, ...]:
        """Pending requests of others, oldest first, at most `limit` (with their votes)."""
        params = {"team": team_id, "person": person}
        async with autocommit(self._sessions) as db:
            found = _located(await db.execute(INBOX.limit(limit), params))
        return await self._with_votes(found)

    async def requested_by(self, team_id: str, person: str, *, limit: int) -> tuple[Approval, ...]:
        """`person`'s requests still pending, or decided and their turn not finished,
        oldest first, at most `limit`."""
        params = {"team": team_id, "person": person}
        async with autocommit(self._sessions) as db:
            found = _located(await db.execute(REQUESTED.limit(limit), params))
        return await self._with_votes(found)

    async def pending_by_tool(self) -> dict[str, int]:
        """How many requests wait for a decision, by tool, across every workspace."""
        async with autocommit(self._sessions) as db:
            rows = await db.execute(PENDING_BY_TOOL)
        return {tool: count for tool, count in rows}

    async def overdue(self, *, now: datetime, team_id: str | None = None) -> tuple[Approval, ...]:
        """Pending approvals an EXPIRE may take now."""
        query = OVERDUE if team_id is None else OVERDUE.where(A.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return _located(await db.execute(query, {"now": now}))

    async def due(
        self, transition: Transition, *, now: datetime, team_id: str | None = None
    ) -> tuple[Approval, ...]:
        """Pending approvals whose REMIND or ESCALATE is due now."""
        query = DUE[transition]
        if team_id is not None:
            query = query.where(A.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return _located(await db.execute(query, {"now": now}))

    async def follow_up(
        self, transition: Transition, approval: Approval, *, now: datetime
    ) -> Approval:
        """REMIND or ESCALATE, audited: recorded before it is done, so it is done once."""
        row = await self._change(FOLLOW_UP[transition], transition, approval, now, {"now": now})
        return _approval(row._mapping, approval.thread)

    async def escalation_posted(self, approval: Approval, *, ts: str) -> None:
        """Where the escalated card is, so a decision redraws it too."""
        async with autocommit(self._sessions) as db:
            await db.execute(ESCALATION_POSTED, _key(approval) | {"ts": ts})

    async def stale_cards(
        self, *, stale: datetime, team_id: str | None = None
    ) -> tuple[Approval, ...]:
        """Pending approvals whose card post began before `stale` and never finished."""
        query = STALE_CARDS if team_id is None else STALE_CARDS.where(A.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return _located(await db.execute(query, {"card_stale": stale}))

    async def audit_trail(
        self, team_id: str, *, tool: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[AuditEntry]:
        async with autocommit(self._sessions) as db:
            return await audit.recent(db, team_id, tool=tool, limit=limit, offset=offset)

    async def history(
        self, team_id: str, requester: str, tools: Sequence[str], *, since: datetime, days: int
    ) -> dict[str, History]:
        """How each tool's earlier requests by `requester` since `since` ended, in one query."""
        params = {"team": team_id, "requester": requester, "tools": list(tools), "since": since}
        counts: dict[str, dict[str, int]] = {tool: {} for tool in tools}
        async with autocommit(self._sessions) as db:
            for tool, status, n in await db.execute(HISTORY, params):
                counts[tool][ApprovalState(status).value] = n
        return {tool: History(**c, days=days) for tool, c in counts.items()}

    async def paused_snapshot(self, approval: Approval) -> str | None:
        """The agent's session as it was when the turn paused on this approval."""
        async with autocommit(self._sessions) as db:
            return await db.scalar(SNAPSHOT_OF_TURN, {"turn": approval.turn_id})

    async def note_viewed(self, approval: Approval, *, by: str, now: datetime) -> None:
        """Audit that `by` saw the conversation behind this request."""
        event = audit.entry(
            team_id=approval.thread.team_id,
            at=now,
            actor=by,
            action="conversation_viewed",
            tool=approval.request.tool,
            approval_id=approval.id,
        )
        async with autocommit(self._sessions) as db:
            await db.execute(audit.INSERT, event)


_EXPLAIN_APPROVAL = {
    t: GET.add_columns(*facts(t)) for t in TRANSITIONS if t.subject != Subject.TURN
}
_EXPLAIN_TURN = {
    t: sa.select(*facts(t)).where(T.c.id == sa.bindparam("row_id"))
    for t in TRANSITIONS
    if t.subject == Subject.TURN
}


async def _refusal(
    db: AsyncSession,
    transition: Transition,
    explain: Mapping[Transition, Any],
    values: Mapping[str, Any],
) -> IllegalTransition:
    """Why `transition` matched no row: the lifecycle's verdict on the row as it is now."""
    row = (await db.execute(explain[transition], values)).first()
    if row is None:
        return IllegalTransition(transition, None)
    state = STATES[transition.subject](row.state)
    current = (
        None if transition.subject == Subject.TURN else _approval(row._mapping, _thread_of(row))
    )
    holds = {r: bool(row._mapping[f"holds_{r.name}"]) for r in transition.requirements(state)}
    try:
        transition.check(state, holds)
    except IllegalTransition as refused:
        refused.current = current
        return refused
    # Unreachable while states only move forward; said plainly if it ever is not.
    return IllegalTransition(transition, state, current=current)


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
        params |= NewRow(A, f"a{i}_").params(_columns(approval))
        params |= NewRow(audit.TABLE, f"e{i}_").params(_audit(REQUEST, approval, turn.at))
    return params


def _count(result: Any) -> int:
    return int(cast(sa.CursorResult[Any], result).rowcount)


def _thread(thread: Thread) -> dict[str, str]:
    return {"team": thread.team_id, "channel": thread.channel_id, "thread": thread.thread_ts}


def _key(approval: Approval) -> dict[str, str]:
    return {"row_id": approval.id, "team": approval.thread.team_id}


def _claimed(claim: Claim) -> dict[str, Any]:
    return {"row_id": claim.turn_id, "attempt": claim.attempt}


def _audit(transition: Transition, approval: Approval, at: datetime) -> dict[str, Any]:
    """The audit row `transition` appends, as its Audit spec says, for `approval` as it is
    once the transition took."""
    spec = transition.audit
    assert spec is not None, f"{transition.name} records nothing"
    r, decision, execution = approval.request, approval.decision, approval.execution
    decider: str = ""
    editor = approval.edit.by if approval.edit else ""
    reason: str | None = None
    answer: Any = None
    match decision:
        case Approved(by=decider, reason=reason) | Denied(by=decider, reason=reason):
            pass
        case Answered(by=decider, answer=answer):
            pass
    actor = {
        "decider": decider,
        "editor": editor,
        "requester": r.requester,
        "greenlight": "greenlight",
    }
    fields = {
        "input": r.input,
        "edited": approval.edit.input if approval.edit else None,
        "why": r.why,
        "reason": reason,
        "answer": answer,
        "output": execution.output if isinstance(execution, Finished) else None,
    }
    # Which door the request came through (slack, or the gateway's mcp, api) and its key.
    via = r.context.via
    door = {"door": "slack"} if via is None else {"door": via.door, "key": via.key}
    return audit.entry(
        team_id=approval.thread.team_id,
        at=at,
        actor=actor[spec.actor],
        action=spec.action,
        tool=r.tool,
        approval_id=approval.id,
        **{key: fields[key] for key in spec.detail},
        **door,
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
        participants=tuple(row["participants"]),
        preview=row["preview"],
        approvals_needed=row["approvals_needed"],
        context=Context() if row["context"] is None else CONTEXT.validate_python(row["context"]),
        asks=row["asks"],
        asked=None if row["asked_input"] is None else dict(row["asked_input"]),
    )
    channel = row["card_channel"]
    card = None if channel is None else Card(channel, row["card_ts"], CardState(row["card_state"]))
    reminder = None
    if row["remind_at"] is not None:
        reminder = FollowUp(row["remind_at"], ReminderState(row["reminder"]))
    escalation = None
    if row["escalate_at"] is not None:
        escalation = FollowUp(
            row["escalate_at"],
            EscalationState(row["escalation"]),
            row["escalation_channel"],
            row["escalation_ts"],
        )
    edit = None
    if row["edited_input"] is not None:
        edit = Edit(
            dict(row["edited_input"]), row["edited_by"], row["edited_at"], row["edited_preview"]
        )
    return Approval(
        id=row["id"],
        turn_id=row["turn_id"],
        thread=thread,
        request=request,
        edit=edit,
        decision=_decision(row),
        execution=_execution(row),
        card=card,
        reminder=reminder,
        escalation=escalation,
        version=row["version"],
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
        case ApprovalState.ANSWERED:
            return Answered(by, at, row["answer"])


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
        "participants": list(r.participants),
        "preview": r.preview,
        "context": CONTEXT.dump_python(r.context, mode="json", exclude_defaults=True) or None,
        "asks": r.asks,
        "answer": None,
        "edited_input": None,
        "edited_by": None,
        "edited_at": None,
        "edited_preview": None,
        "version": approval.version,
        "asked_input": r.asked,
        "status": REQUEST.enters,
        "decided_by": None,
        "decided_at": None,
        "reason": None,
        "execution": ExecutionState.NOT_STARTED,
        "output": None,
        "card_channel": approval.card.channel if approval.card else None,
        "card_ts": None,
        # Recorded before the post: whoever paused the turn posts it now (else a sweep will).
        "card_state": CardState.POSTING if approval.card else CardState.FAILED,
        "card_attempted_at": r.requested_at,
        "approvals_needed": r.approvals_needed,
        "votes": 0,
        "remind_at": approval.reminder.at if approval.reminder else None,
        "reminder": ReminderState.SCHEDULED if approval.reminder else ReminderState.NONE,
        "escalate_at": approval.escalation.at if approval.escalation else None,
        "escalation": (EscalationState.SCHEDULED if approval.escalation else EscalationState.NONE),
        "escalation_channel": approval.escalation.channel if approval.escalation else None,
        "escalation_ts": None,
    }
