"""Decisions in storage: Approve (a vote, or the approval), Deny, an edit, an answer, a
withdrawal, expiry.

Each is one conditional write with its audit row (an edit, rare, is one transaction), from
storage/lifecycle.py by way of storage/transitions.py: of two clicks, two replicas or a
retry, exactly one changes the row and the other learns why (IllegalTransition, with the
approval as it is now).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from storage.db import SessionFactory, autocommit
from storage.domain import (
    Answered,
    Approval,
    ApprovalState,
    Approved,
    Claim,
    Denied,
    Edit,
    Vote,
    Withdrawn,
)
from storage.driver import prepared
from storage.lifecycle import (
    ANSWER,
    APPROVE,
    CLAIM,
    DENY,
    EDIT,
    EXPIRE,
    VOTE,
    WITHDRAW,
    IllegalTransition,
    Requirement,
)
from storage.models import PolicyRow
from storage.policies import POLICY_FIELDS, stored_policy
from storage.policy_spec import StoredPolicy
from storage.rows import (
    EXPLAIN_APPROVAL,
    GET,
    NOTE,
    TEAM,
    approval_of,
    audit_row,
    change,
    get,
    key,
    refusal,
    thread_of,
    with_votes,
)
from storage.transitions import NOW, ROW_ID, SIBLING, A, Atomic, NewRow, T, V, guard, write
from storage.turns import CLAIMING, SNAPSHOT_VERSION

# An approval to decide, with its tool's stored policy (None: the defaults) in one query.
_P = cast(sa.Table, PolicyRow.__table__)
DECIDABLE = prepared(
    GET.add_columns(*(_P.c[f].label(f"policy_{f}") for f in POLICY_FIELDS)).outerjoin(
        _P, sa.and_(_P.c.team_id == A.c.team_id, _P.c.tool == A.c.tool)
    )
)
OTHERS_PENDING = (
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


def _claim_its_turn(changed: sa.CTE) -> sa.Update:
    """CLAIM the decided request's turn in the decision's own write (`claiming`), when it
    was the turn's only request and the decision settled it (not a vote short of its
    quorum): ALL_DECIDED, which cannot see the statement's own change, read off the
    changed row instead. Else nothing, and the resume claims the turn on its own."""
    alone = ~sa.exists().where(SIBLING.c.turn_id == T.c.id, SIBLING.c.id != changed.c.id)
    return (
        sa.update(T)
        .where(
            sa.bindparam("claiming", type_=sa.Boolean()),
            T.c.id == changed.c.turn_id,
            changed.c.status != ApprovalState.PENDING,
            alone,
            guard(CLAIM, but=(Requirement.ALL_DECIDED,)),
        )
        .values(state=CLAIM.enters, **CLAIMING)
        .returning(T.c.conversation_id, T.c.snapshot_id, T.c.attempts, SNAPSHOT_VERSION)
    )


_EDITED = sa.bindparam("edited", type_=sa.JSON(none_as_null=True))
_EDITED_PREVIEW = sa.bindparam("new_preview", type_=A.c.edited_preview.type)


def _if_complete(value: Any) -> sa.Case[Any]:
    return sa.case((_completes, value), else_=sa.null())


# An Approve: VOTE or APPROVE, whichever the row allows, in one write with the vote's row.
APPROVING = Atomic(
    sa.update(A)
    .where(A.c.id == ROW_ID, TEAM, sa.or_(guard(VOTE), guard(APPROVE)))
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
    .returning(A, OTHERS_PENDING),
    NewRow(V, "vote_"),
    NOTE,
    follow=_claim_its_turn,
)
DENYING = Atomic(
    write(
        DENY, decided_by=sa.bindparam("by"), decided_at=NOW, reason=sa.bindparam("because")
    ).returning(OTHERS_PENDING),
    NOTE,
    follow=_claim_its_turn,
)
WITHDRAWING = Atomic(
    write(WITHDRAW, decided_by=sa.bindparam("by"), decided_at=NOW).returning(OTHERS_PENDING),
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
    approval_id=ROW_ID,
    voter=_EDITOR,
    at=NOW,
    version=sa.bindparam("new_version"),
    note=sa.bindparam("note", type_=V.c.note.type),
)
ANSWERING = Atomic(
    write(
        ANSWER, decided_by=sa.bindparam("by"), decided_at=NOW, answer=sa.bindparam("answer")
    ).returning(OTHERS_PENDING),
    NOTE,
)
EXPIRE_ONE = Atomic(write(EXPIRE, decided_at=NOW), NOTE)


class DecisionStore:
    """Decisions on approvals, each one conditional write (or transaction) with its audit row."""

    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

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
        return approval_of(row._mapping, thread_of(row)), policy

    async def decide(
        self,
        approval: Approval,
        decision: Approved | Denied,
        *,
        edited: Edit | None = None,
        seen: int | None = None,
        claim_until: datetime | None = None,
    ) -> tuple[Approval, int, Claim | None]:
        """An Approve of version `seen` (VOTE, or APPROVE once it completes the quorum;
        `edited`: with changes, of a request one approver decides, approving the version
        they make) or a DENY of it, audited; the approval as it is now, how many of its
        turn's approvals still wait, and (`claim_until`: for a caller that resumes the turn
        at once) the turn CLAIMed in the same write, leased until then, when this decision
        settled its only request. IllegalTransition (with the current approval) when it
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
        params |= {"claiming": claim_until is not None, "lease": claim_until}
        if isinstance(decision, Denied):
            row = await change(self._sessions, DENYING, DENY, decided, decision.at, params)
            denied = approval_of(row._mapping, approval.thread)
            if row.followed_attempts is not None:  # claimed: its resume tells the votes' notes
                [denied] = await with_votes(self._sessions, [denied])
            return denied, int(row.others_pending), _claimed(row, denied, claim_until)
        vote = NewRow(V, "vote_").params(
            {"approval_id": approval.id, "voter": decision.by, "at": decision.at}
            | {"version": version, "note": decision.reason}
        )
        try:
            row = await change(
                self._sessions, APPROVING, APPROVE, decided, decision.at, params | vote
            )
        except IntegrityError:  # the same person's second vote, racing the first
            current = await get(self._sessions, approval.thread.team_id, approval.id)
            state = current.state if current else None
            raise IllegalTransition(
                VOTE, state, (Requirement.NEW_VOTER,), current=current
            ) from None
        except IllegalTransition as refused:
            if refused.unmet != (Requirement.QUORUM_MET,):
                raise
            async with autocommit(self._sessions) as db:  # it was a VOTE that did not take
                values = key(approval) | params
                raise await refusal(db, VOTE, EXPLAIN_APPROVAL, values) from None
        [now] = await with_votes(self._sessions, [approval_of(row._mapping, approval.thread)])
        return now, int(row.others_pending), _claimed(row, now, claim_until)

    async def edit(
        self, approval: Approval, edit: Edit, *, seen: int | None = None, note: str | None = None
    ) -> Approval:
        """EDIT a request that needs several approvers, audited, in one transaction: a new
        version, standing with the editor's vote alone (with their `note`). IllegalTransition
        when it was decided, its deadline passed, `seen` (by default: `approval`'s version)
        is no longer the current version, or it needs one approver (then the edit is an
        APPROVE)."""
        seen = approval.version if seen is None else seen
        vote = Vote(edit.by, edit.at, note)
        edited = replace(approval, edit=edit, votes=(vote,), version=seen + 1)
        params: dict[str, Any] = key(approval) | {"by": edit.by, "edited": edit.input}
        params |= {"now": edit.at, "note": note, "new_preview": edit.preview, "seen": seen}
        params["new_version"] = seen + 1
        audited = NOTE.params(audit_row(EDIT, edited, edit.at))
        async with self._sessions.begin() as db:
            row = (await db.execute(EDITING, params)).first()
            if row is None:  # nothing was written: say why
                raise await refusal(db, EDIT, EXPLAIN_APPROVAL, params)
            await db.execute(EARLIER_VOTES, params)
            await db.execute(EDITORS_VOTE, params)
            await db.execute(NOTE.alone(), audited)
        [now] = await with_votes(self._sessions, [approval_of(row._mapping, approval.thread)])
        return now

    async def answer(self, approval: Approval, answered: Answered) -> tuple[Approval, int]:
        """ANSWER a question, audited: the approval as it is now, and how many of its turn's
        requests still wait. IllegalTransition when it was answered (or expired) already."""
        params = {"by": answered.by, "answer": answered.answer, "now": answered.at}
        done = replace(approval, decision=answered)
        row = await change(self._sessions, ANSWERING, ANSWER, done, answered.at, params)
        return approval_of(row._mapping, approval.thread), int(row.others_pending)

    async def withdraw(self, approval: Approval, withdrawn: Withdrawn) -> tuple[Approval, int]:
        """WITHDRAW a pending request, by its requester, audited: the approval as it is now,
        and how many of its turn's requests still wait. IllegalTransition (with the current
        approval) when it was settled already, its deadline passed, or `withdrawn.by` is not
        its requester."""
        params = {"by": withdrawn.by, "now": withdrawn.at}
        done = replace(approval, decision=withdrawn)
        row = await change(self._sessions, WITHDRAWING, WITHDRAW, done, withdrawn.at, params)
        return approval_of(row._mapping, approval.thread), int(row.others_pending)

    async def expire(self, approval: Approval, *, now: datetime) -> Approval:
        """EXPIRE a pending approval past its deadline, audited."""
        row = await change(self._sessions, EXPIRE_ONE, EXPIRE, approval, now, {"now": now})
        return approval_of(row._mapping, approval.thread)


def _claimed(row: sa.Row[Any], approval: Approval, until: datetime | None) -> Claim | None:
    """The claim a decision's write made of its turn (`_claim_its_turn`), if it made one."""
    if row.followed_attempts is None:
        return None
    return Claim(
        turn_id=approval.turn_id,
        conversation_id=row.followed_conversation_id,
        thread=approval.thread,
        snapshot_id=row.followed_snapshot_id,
        attempt=row.followed_attempts,
        approvals=(approval,),
        lease_until=until,
        snapshot_version=row.followed_snapshot_version,
    )
