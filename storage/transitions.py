"""How storage turns the lifecycle table (storage/lifecycle.py) into SQL.

Each requirement's SQL (REQUIREMENTS), a transition's WHERE clause (`guard`) and its
conditional write (`write`), the same conditions as columns to explain a write that matched
nothing (`facts`), and `Atomic`: a change and the rows that must be written with it, as one
statement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa

from storage.db import SessionFactory, autocommit
from storage.domain import ApprovalState
from storage.driver import prepared
from storage.lifecycle import Requirement, Subject, Transition
from storage.models import ApprovalRow, ConversationRow, TurnRow, VoteRow

A, T, C, V = (cast(sa.Table, m.__table__) for m in (ApprovalRow, TurnRow, ConversationRow, VoteRow))
SIBLING = A.alias("sibling")
CALLS = T.alias("conversation_turn")  # the turns of a conversation
NOW = sa.bindparam("now", type_=A.c.expires_at.type)
ROW_ID: sa.BindParameter[str] = sa.bindparam("row_id", type_=sa.String())  # the changed row
SEEN = sa.bindparam("seen", type_=A.c.version.type)  # the version the approver saw
# A call a standing approval may cover: who is part of its turn (none of them may approve it).
PARTICIPANTS = sa.bindparam("call_participants", expanding=True, type_=A.c.decided_by.type)

# The SQL of each requirement of the lifecycle; a test checks that every one is here.
REQUIREMENTS: Mapping[Requirement, sa.ColumnElement[bool]] = {
    Requirement.BEFORE_DEADLINE: A.c.expires_at > NOW,
    Requirement.PAST_DEADLINE: A.c.expires_at <= NOW,
    Requirement.APPROVED: A.c.status == ApprovalState.APPROVED,
    Requirement.SAME_CALL: sa.and_(
        A.c.tool == sa.bindparam("call_tool"), A.c.ref == sa.bindparam("call_ref")
    ),
    Requirement.ALL_DECIDED: ~sa.exists().where(
        SIBLING.c.turn_id == T.c.id, SIBLING.c.status == ApprovalState.PENDING
    ),
    Requirement.LEASE_RAN_OUT: T.c.lease_until < NOW,
    Requirement.OWN_CLAIM: T.c.attempts == sa.bindparam("attempt"),
    Requirement.NEW_VOTER: ~sa.exists().where(
        V.c.approval_id == A.c.id, V.c.voter == sa.bindparam("by")
    ),
    Requirement.QUORUM_MET: A.c.votes + 1 >= A.c.approvals_needed,
    Requirement.QUORUM_SHORT: A.c.votes + 1 < A.c.approvals_needed,
    Requirement.STILL_PENDING: A.c.status == ApprovalState.PENDING,
    Requirement.BY_REQUESTER: A.c.requester == sa.bindparam("by"),
    Requirement.REMINDER_DUE: A.c.remind_at <= NOW,
    Requirement.ESCALATION_DUE: A.c.escalate_at <= NOW,
    Requirement.POST_RAN_OUT: A.c.card_attempted_at < sa.bindparam("card_stale"),
    Requirement.ESCALATION_POST_RAN_OUT: A.c.escalation_attempted_at < sa.bindparam("card_stale"),
    Requirement.ASKS_APPROVAL: A.c.asks.is_(None),
    Requirement.ASKS_ANSWER: A.c.asks.is_not(None),
    Requirement.SEVERAL_NEEDED: A.c.approvals_needed > 1,
    Requirement.AS_SEEN: A.c.version == SEEN,
    Requirement.SAME_VERSION: A.c.version == sa.bindparam("call_version", type_=A.c.version.type),
    Requirement.STANDING_OFFERED: sa.and_(
        A.c.standing_offer_seconds.is_not(None), A.c.approvals_needed == 1
    ),
    Requirement.STANDING_LIVE: A.c.standing_until > NOW,
    Requirement.STANDING_MATCHES: sa.and_(
        A.c.tool == sa.bindparam("call_tool"),
        A.c.requester == sa.bindparam("call_requester"),
        A.c.standing_rule == sa.bindparam("call_rule"),
        A.c.turn_id.in_(
            sa.select(CALLS.c.id).where(CALLS.c.conversation_id == sa.bindparam("conversation"))
        ),
        A.c.decided_by.not_in(PARTICIPANTS),
    ),
}
STATE_COLUMN = {
    Subject.APPROVAL: A.c.status,
    Subject.EXECUTION: A.c.execution,
    Subject.TURN: T.c.state,
    Subject.CARD: A.c.card_state,
    Subject.REMINDER: A.c.reminder,
    Subject.ESCALATION: A.c.escalation,
    Subject.ESCALATION_CARD: A.c.escalation_card,
    Subject.STANDING: A.c.standing,
}
TABLE_OF = {subject: T if subject == Subject.TURN else A for subject in Subject}


def guard(transition: Transition, *, but: tuple[Requirement, ...] = ()) -> sa.ColumnElement[bool]:
    """The transition's WHERE clause: a state it may leave (with what that state requires)
    and what it requires from any state; `but`: requirements the caller's statement checks
    its own way (one that must see the statement's own change)."""
    state = STATE_COLUMN[transition.subject]
    ways = [
        sa.and_(state == source, *(REQUIREMENTS[r] for r in extra if r not in but))
        for source, extra in transition.leaves.items()
        if source is not None
    ]
    rest = (REQUIREMENTS[r] for r in transition.requires if r not in but)
    return sa.and_(sa.or_(*ways), *rest)


def facts(transition: Transition) -> list[sa.ColumnElement[Any]]:
    """The row's state and each requirement's truth, to explain a write that matched nothing."""
    every = dict.fromkeys(r for s in transition.leaves for r in transition.requirements(s))
    state = STATE_COLUMN[transition.subject].label("state")
    return [state, *(REQUIREMENTS[r].label(f"holds_{r.name}") for r in every)]


def write(transition: Transition, **values: Any) -> sa.Update:
    """UPDATE … SET the state it enters (and `values`) WHERE id and guard … RETURNING the row.

    An approval is found by its workspace and id (the id comes from a button); a turn by its
    id, which only the store hands out.
    """
    table = TABLE_OF[transition.subject]
    key = [table.c.id == ROW_ID]
    if table is A:
        key.append(A.c.team_id == sa.bindparam("team"))
    state = STATE_COLUMN[transition.subject].key
    return (
        sa.update(table)
        .where(*key, guard(transition))
        .values({state: transition.enters, **values})
        .returning(table)
    )


class Atomic:
    """A change and the writes that must happen exactly when it happens, built once.

    `change` is a conditional UPDATE (or an INSERT) with RETURNING; each of `then` is a row
    to insert (`NewRow`) or an UPDATE; `read`, if given, builds what to return from the changed
    row (by default, the changed row itself); `also`: writes the change is gated on (a
    held snapshot's, storage/turns.py); `follow`: a write built from the changed row, which
    decides itself whether to write, its RETURNING read beside the rest as `followed_*`
    columns (null when it wrote nothing: a decision's claim of its turn, storage/decisions.py).
    All of it is one statement: the change as a
    data-modifying CTE, each write and the read reading from it, so all or none commit with
    no transaction around them: one round trip where a transaction takes four to six
    (README, Performance, says what that is worth).
    """

    def __init__(
        self,
        change: sa.Update | sa.Insert,
        *then: NewRow | sa.Update,
        read: Callable[[sa.FromClause], sa.Select[Any]] | None = None,
        also: Sequence[sa.CTE] = (),
        follow: Callable[[sa.CTE], sa.Update] | None = None,
    ) -> None:
        changed = change.cte("changed")
        writes = [
            (t.after(changed) if isinstance(t, NewRow) else t.where(sa.exists(changed.select())))
            for t in then
        ]
        result = sa.select(changed) if read is None else read(changed)
        if follow is not None:  # its row, if it wrote one, beside what is read
            followed = follow(changed).cte("followed")
            result = result.add_columns(*(c.label(f"followed_{c.key}") for c in followed.c))
            result = result.outerjoin(followed, sa.true())
        ctes = [*(w.cte(f"then{i}") for i, w in enumerate(writes)), *also]
        self.one = prepared(result.add_cte(*ctes))

    async def run(
        self, sessions: SessionFactory, params: Mapping[str, Any]
    ) -> Sequence[sa.Row[Any]]:
        """What it read; nothing when the change matched nothing (and nothing was written)."""
        async with autocommit(sessions) as db:
            return (await db.execute(self.one, params)).all()


@dataclass(frozen=True)
class NewRow:
    """One row of `table` written with a change, its values bound as `prefix` + column."""

    table: sa.Table
    prefix: str

    def _values(self) -> dict[str, sa.BindParameter[Any]]:
        columns = [c for c in self.table.c if not (c.primary_key and c.autoincrement is True)]
        return {c.key: sa.bindparam(self.prefix + c.key, type_=c.type) for c in columns}

    def alone(self) -> sa.Insert:
        return sa.insert(self.table).values(self._values())

    def after(self, changed: sa.CTE) -> sa.Insert:
        values = self._values()
        return sa.insert(self.table).from_select(
            list(values), sa.select(*values.values()).select_from(changed)
        )

    def params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {self.prefix + key: value for key, value in values.items()}
