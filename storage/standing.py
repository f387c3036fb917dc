"""Standing approvals in storage: granted with an Approve, used by later calls, revoked.

Each is one conditional write with its audit rows, from storage/lifecycle.py (GRANT with the
APPROVE it rides on; USE with the APPROVE_UNDER of the call it covers, that call's own done
turn and approval row; REVOKE) by way of storage/transitions.py. USE and REVOKE both update
the grant's row, so PostgreSQL orders a use and a revoke that race: whichever comes second
re-checks the row as the first left it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from storage import audit
from storage.db import SessionFactory, autocommit
from storage.decisions import OTHERS_PENDING
from storage.domain import Approval, Approved, Standing, StandingState, Thread, TurnState
from storage.lifecycle import (
    APPROVE,
    APPROVE_UNDER,
    GRANT,
    REQUEST,
    REVOKE,
    USE,
    IllegalTransition,
)
from storage.rows import (
    EXPLAIN_APPROVAL,
    LOCATED,
    NOTE,
    TEAM,
    approval_of,
    audit_row,
    change,
    columns,
    key,
    located,
    refusal,
)
from storage.transitions import NOW, ROW_ID, A, Atomic, NewRow, T, V, guard, write

# Approve for <duration>: the APPROVE and the GRANT, in one write with the vote's row and
# both audit rows.
GRANTING = Atomic(
    sa.update(A)
    .where(A.c.id == ROW_ID, TEAM, guard(APPROVE), guard(GRANT))
    .values(
        status=APPROVE.enters,
        votes=A.c.votes + 1,
        decided_by=sa.bindparam("by"),
        decided_at=NOW,
        reason=sa.bindparam("because"),
        standing=GRANT.enters,
        standing_until=sa.bindparam("until", type_=A.c.standing_until.type),
        standing_rule=sa.bindparam("rule", type_=A.c.standing_rule.type),
    )
    .returning(A, OTHERS_PENDING),
    NewRow(V, "vote_"),
    NOTE,
    NewRow(audit.TABLE, "granted_"),
)
# The newest live grant a call matches, if any.
MATCHING = LOCATED.where(TEAM, guard(USE)).order_by(None).order_by(A.c.decided_at.desc()).limit(1)
# Prefixes that make no column's name (an UPDATE would set a column its parameters name).
_TURN, _CALL = NewRow(T, "t_"), NewRow(A, "new_")
_REQUESTED, _APPROVED = NewRow(audit.TABLE, "e0_"), NewRow(audit.TABLE, "e1_")
USING = Atomic(write(USE, standing_uses=A.c.standing_uses + 1), _TURN, _CALL, _REQUESTED, _APPROVED)
REVOKING = Atomic(
    write(REVOKE, standing_revoked_by=sa.bindparam("by"), standing_revoked_at=NOW), NOTE
)


@dataclass(frozen=True)
class Call:
    """A call a standing approval may cover: what it is and where, and who took part in
    its turn (none of them may approve it)."""

    tool: str
    requester: str
    rule: str
    conversation_id: str
    thread: Thread
    participants: Collection[str]

    def params(self, now: datetime) -> dict[str, Any]:
        return {
            "team": self.thread.team_id,
            "call_tool": self.tool,
            "call_requester": self.requester,
            "call_rule": self.rule,
            "conversation": self.conversation_id,
            "call_participants": list(self.participants),
            "now": now,
        }


class StandingStore:
    """Standing approvals: granted, used, revoked, each one conditional write."""

    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    async def grant(
        self, approval: Approval, decision: Approved, *, seen: int, until: datetime, rule: str
    ) -> tuple[Approval, int]:
        """APPROVE version `seen` and GRANT a standing approval until `until` for calls
        `rule` matches, audited, in one write: the approval as it is now, and how many of
        its turn's approvals still wait. IllegalTransition (with the approval as it is now)
        when either may not happen."""
        standing = Standing(until=until, rule=rule)
        decided = replace(approval, decision=decision, standing=standing)
        params: dict[str, Any] = key(approval) | {"by": decision.by, "now": decision.at}
        params |= {"because": decision.reason, "seen": seen, "until": until, "rule": rule}
        params |= NewRow(V, "vote_").params(
            {"approval_id": approval.id, "voter": decision.by, "at": decision.at}
            | {"version": seen, "note": decision.reason}
        )
        params |= NOTE.params(audit_row(APPROVE, decided, decision.at))
        params |= NewRow(audit.TABLE, "granted_").params(audit_row(GRANT, decided, decision.at))
        if rows := await GRANTING.run(self._sessions, params):
            return approval_of(rows[0]._mapping, approval.thread), int(rows[0].others_pending)
        async with autocommit(self._sessions) as db:
            refused = await refusal(db, APPROVE, EXPLAIN_APPROVAL, params)
            if not refused.unmet and refused.current and refused.current.decision is None:
                refused = await refusal(db, GRANT, EXPLAIN_APPROVAL, params)
        raise refused

    async def matching(self, call: Call, *, now: datetime) -> Approval | None:
        """The newest live standing approval that covers `call`, if any."""
        async with autocommit(self._sessions) as db:
            found = located(await db.execute(MATCHING, call.params(now)))
        return found[0] if found else None

    async def use(
        self, grant: Approval, covered: Approval, call: Call, *, now: datetime
    ) -> Approval | None:
        """USE `grant` for `covered` (a new request, `under` the grant): count the use and
        write the call's own done turn and its approval, born approved by the grant's
        approver, with their audit rows, in one write. The grant as it is now; None when it
        no longer covers the call (revoked, run out, or its approver joined the turn)."""
        assert isinstance(grant.decision, Approved)
        decision = Approved(grant.decision.by, now)
        approved = replace(covered, decision=decision, under=grant.id)
        row = columns(approved) | {
            "status": APPROVE_UNDER.enters,
            "decided_by": decision.by,
            "decided_at": now,
            "votes": 1,
        }
        turn = {
            "id": covered.turn_id,
            "team_id": call.thread.team_id,
            "conversation_id": call.conversation_id,
            "session_id": "",
            "snapshot_id": "",
            "state": TurnState.DONE,  # no Genkit turn waits on it: nothing to resume
            "lease_until": None,
            "attempts": 0,
            "created_at": now,
            "updated_at": now,
        }
        params = key(grant) | call.params(now) | _TURN.params(turn) | _CALL.params(row)
        params |= _REQUESTED.params(audit_row(REQUEST, covered, now))
        params |= _APPROVED.params(audit_row(APPROVE_UNDER, approved, now))
        rows = await USING.run(self._sessions, params)
        return approval_of(rows[0]._mapping, grant.thread) if rows else None

    async def revoke(self, grant: Approval, *, by: str, now: datetime) -> Approval:
        """REVOKE a live standing approval, audited. IllegalTransition (with the approval as
        it is now) when it is not granted, or over."""
        if grant.standing is None:
            raise IllegalTransition(REVOKE, StandingState.NONE, current=grant)
        ended = replace(
            grant,
            standing=replace(
                grant.standing, state=StandingState.REVOKED, revoked_by=by, revoked_at=now
            ),
        )
        row = await change(self._sessions, REVOKING, REVOKE, ended, now, {"by": by, "now": now})
        return approval_of(row._mapping, grant.thread)
