"""Conversations, paused turns and approvals: every state change is one conditional write.

Each transition names the state it leaves in its WHERE clause, so when two callers race
(two clicks, two replicas, a retry) exactly one gets a row back and the other learns so.

Statements on the paths every conversation takes are Core, built once at import and
returning what the caller needs (RETURNING) instead of a second read: through the ORM they
cost more CPU than the database spends running them. Rows come back as detached model
instances, so callers stay typed. On PostgreSQL a change and what goes with it (its audit
row, the rows the caller reads next) are one statement with data-modifying CTEs, run
without a transaction around it; SQLite runs the parts in the caller's transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from storage import audit
from storage.models import (
    Approval,
    ApprovalStatus,
    Base,
    Conversation,
    Execution,
    ToolPolicy,
    Turn,
    TurnState,
)

OPEN_TURN_STATES = (TurnState.WAITING, TurnState.RESUMING)
A, T, C = (cast(sa.Table, m.__table__) for m in (Approval, Turn, Conversation))
M = TypeVar("M", bound=Base)


def _as(model: type[M], row: sa.Row[Any] | None) -> M | None:
    return None if row is None else model(**row._mapping)


def _all(model: type[M], rows: Sequence[sa.Row[Any]]) -> list[M]:
    return [model(**row._mapping) for row in rows]


def _changed(result: sa.Result[Any]) -> bool:
    return cast(sa.CursorResult[Any], result).rowcount == 1


@dataclass(frozen=True)
class Recorded:
    """A decision that took effect, and how many of its turn's approvals still wait."""

    approval: Approval
    others_pending: int


@dataclass(frozen=True)
class Located:
    """An approval with the Slack thread of its conversation."""

    approval: Approval
    channel_id: str
    thread_ts: str


# The conflicting row, named as PostgreSQL and SQLite name it in an upsert's WHERE: the
# compiler does not correlate a subquery there, and C.c.id would add `conversations` to
# the subquery's FROM.
_EXISTING_ID: sa.ColumnClause[str] = sa.literal_column(f"{C.name}.id")
_OPEN_TURN = (
    sa.select(T.c.id)
    .where(T.c.conversation_id == _EXISTING_ID, T.c.state.in_(OPEN_TURN_STATES))
    .exists()
)


def _claim_thread(dialect: Any) -> Any:
    """Create the thread's conversation, or take an idle one: one statement either way."""
    insert = dialect.insert(C)
    return insert.on_conflict_do_update(
        index_elements=[C.c.team_id, C.c.channel_id, C.c.thread_ts],
        set_={"busy_until": insert.excluded.busy_until},
        where=sa.and_(
            sa.or_(C.c.busy_until.is_(None), C.c.busy_until < sa.bindparam("now")), ~_OPEN_TURN
        ),
    ).returning(C)


CLAIM_THREAD = {"postgresql": _claim_thread(postgresql), "sqlite": _claim_thread(sqlite)}
FIND_CONVERSATION = sa.select(C).where(
    C.c.team_id == sa.bindparam("team_id"),
    C.c.channel_id == sa.bindparam("channel_id"),
    C.c.thread_ts == sa.bindparam("thread_ts"),
)
# (Bind names in UPDATEs differ from the columns': SQLAlchemy reserves those for SET.)
RELEASE = sa.update(C).where(C.c.id == sa.bindparam("conversation")).values(busy_until=None)
RELEASE_AT = RELEASE.values(snapshot_id=sa.bindparam("snapshot"))
_LOCATED = (
    sa.select(A, C.c.channel_id.label("thread_channel"), C.c.thread_ts.label("thread_ts"))
    .join(T, T.c.id == A.c.turn_id)
    .join(C, C.c.id == T.c.conversation_id)
)
LOCATED = _LOCATED.where(A.c.team_id == sa.bindparam("team_id"), A.c.id == sa.bindparam("id"))
_P = cast(sa.Table, ToolPolicy.__table__)
# An approval to decide: with its thread and its tool's policy row (None: the defaults).
LOCATED_WITH_POLICY = LOCATED.add_columns(*(c.label(f"policy_{c.key}") for c in _P.c)).outerjoin(
    _P, sa.and_(_P.c.team_id == A.c.team_id, _P.c.tool == A.c.tool)
)
LOCATED_BY_TURN = _LOCATED.where(A.c.turn_id == sa.bindparam("turn_id")).order_by(
    A.c.requested_at, A.c.id
)
TURN_APPROVALS = (
    sa.select(A).where(A.c.turn_id == sa.bindparam("turn_id")).order_by(A.c.requested_at, A.c.id)
)
_sibling = A.alias("sibling")
# Still pending besides the row being decided (PostgreSQL's RETURNING sees the statement's
# starting state, SQLite's may not: leaving the row out makes both agree).
_OTHERS_PENDING = (
    sa.select(sa.func.count())
    .where(
        _sibling.c.turn_id == A.c.turn_id,
        _sibling.c.id != A.c.id,
        _sibling.c.status == ApprovalStatus.PENDING,
    )
    .scalar_subquery()
    .label("others_pending")
)
DECIDE = (
    sa.update(A)
    .where(A.c.id == sa.bindparam("approval"), A.c.status == ApprovalStatus.PENDING)
    .values(
        status=sa.bindparam("decision"),
        decided_by=sa.bindparam("by"),
        decided_at=sa.bindparam("now"),
        reason=sa.bindparam("because"),
    )
    .returning(A, _OTHERS_PENDING)
)
_undecided_of_turn = (
    sa.select(sa.func.count())
    .select_from(A)
    .where(A.c.turn_id == T.c.id, A.c.status == ApprovalStatus.PENDING)
    .scalar_subquery()
)
_claimable = sa.or_(
    T.c.state == TurnState.WAITING,
    sa.and_(T.c.state == TurnState.RESUMING, T.c.lease_until < sa.bindparam("now")),
)
CLAIM_TURN = (
    sa.update(T)
    .where(T.c.id == sa.bindparam("turn"), _undecided_of_turn == 0, _claimable)
    .values(
        state=TurnState.RESUMING,
        lease_until=sa.bindparam("lease"),
        attempts=T.c.attempts + 1,
        updated_at=sa.bindparam("now"),
    )
    .returning(T)
)
_claimed = CLAIM_TURN.cte("claimed")
# PostgreSQL: the claim and the turn's approvals with their thread, in one statement.
CLAIM_TURN_LOCATED = (
    sa.select(
        *(c.label(f"claimed_{c.key}") for c in _claimed.c),
        A,
        C.c.channel_id.label("thread_channel"),
        C.c.thread_ts.label("thread_ts"),
    )
    .join(A, A.c.turn_id == _claimed.c.id)
    .join(C, C.c.id == _claimed.c.conversation_id)
    .order_by(A.c.requested_at, A.c.id)
)
_resuming = sa.and_(
    T.c.id == sa.bindparam("turn"),
    T.c.state == TurnState.RESUMING,
    T.c.attempts == sa.bindparam("attempt"),
)
EXTEND_LEASE = sa.update(T).where(_resuming).values(lease_until=sa.bindparam("until"))
FINISH_TURN = (
    sa.update(T)
    .where(_resuming)
    .values(state=sa.bindparam("new_state"), lease_until=None, updated_at=sa.bindparam("now"))
)
_finished = FINISH_TURN.returning(T.c.id).cte("finished")
_released = (
    sa.update(C)
    .where(C.c.id == sa.bindparam("conversation"), sa.exists(sa.select(_finished.c.id)))
    .values(
        busy_until=None,
        snapshot_id=sa.func.coalesce(sa.bindparam("snapshot", type_=sa.String), C.c.snapshot_id),
    )
    .returning(C.c.id)
    .cte("released")
)
# PostgreSQL: a resumed turn done and its thread freed, returning its approvals (none when
# the lease was lost, and then nothing changed).
FINISH_AND_RELEASE = (
    sa.select(A)
    .join(_finished, _finished.c.id == A.c.turn_id)
    .order_by(A.c.requested_at, A.c.id)
    .add_cte(_released)
)
START_EXECUTION = (
    sa.update(A)
    .where(
        A.c.id == sa.bindparam("approval"),
        A.c.team_id == sa.bindparam("team"),
        A.c.tool == sa.bindparam("tool_name"),
        A.c.ref == sa.bindparam("call_ref"),
        A.c.status == ApprovalStatus.APPROVED,
        A.c.execution == Execution.NOT_STARTED,
    )
    .values(execution=Execution.STARTED)
    .returning(A)
)
FINISH_EXECUTION = (
    sa.update(A)
    .where(A.c.id == sa.bindparam("approval"), A.c.execution == Execution.STARTED)
    .values(execution=Execution.FINISHED, output=sa.bindparam("result"))
    .returning(A.c.id)
)


def _audited(update: Any, **from_row: Callable[[Any], Any]) -> Any:
    """On PostgreSQL, `update` (RETURNING) and its audit row as one statement: the row is
    appended exactly when the update took, atomically, with no transaction around the two.

    Audit values are bound as `audit_<key>`, except those in `from_row`, read off the
    changed row (given the CTE).
    """
    changed = update.cte("changed")
    columns = [
        from_row[key](changed) if key in from_row else sa.bindparam(f"audit_{key}", type_=col.type)
        for key, col in ((k, audit.TABLE.c[k]) for k in audit.ENTRY_KEYS)
    ]
    noted = audit.INSERT.from_select(audit.ENTRY_KEYS, sa.select(*columns).select_from(changed))
    return sa.select(changed).add_cte(noted.cte("noted"))


DECIDE_AUDITED = _audited(DECIDE)
START_EXECUTION_AUDITED = _audited(
    START_EXECUTION,
    actor=lambda row: sa.func.coalesce(row.c.decided_by, ""),
    detail=lambda row: sa.func.json_build_object("input", row.c.input),
)
FINISH_EXECUTION_AUDITED = _audited(FINISH_EXECUTION)
SET_CARD = (
    sa.update(A)
    .where(A.c.id == sa.bindparam("approval"))
    .values(card_channel=sa.bindparam("channel"), card_ts=sa.bindparam("ts"))
)


async def claim_thread(
    db: AsyncSession,
    *,
    new_id: str,
    team_id: str,
    channel_id: str,
    thread_ts: str,
    now: datetime,
    until: datetime,
) -> Conversation | None:
    """Take the Slack thread's conversation (created on its first message) for one turn.

    None while another turn runs in it or waits for approval there. Concurrent first
    messages share one row: the unique thread index decides which insert becomes it.
    """
    statement = CLAIM_THREAD[db.get_bind().dialect.name]
    values = {
        "id": new_id,
        "team_id": team_id,
        "channel_id": channel_id,
        "thread_ts": thread_ts,
        "snapshot_id": None,
        "created_at": now,
        "busy_until": until,
        "now": now,
    }
    return _as(Conversation, (await db.execute(statement, values)).first())


async def find_conversation(
    db: AsyncSession, team_id: str, channel_id: str, thread_ts: str
) -> Conversation | None:
    keys = {"team_id": team_id, "channel_id": channel_id, "thread_ts": thread_ts}
    return _as(Conversation, (await db.execute(FIND_CONVERSATION, keys)).first())


async def release_conversation(
    db: AsyncSession, conversation_id: str, *, snapshot_id: str | None
) -> None:
    """Free the thread; `snapshot_id` (when given) is where the next message continues."""
    if snapshot_id is None:
        await db.execute(RELEASE, {"conversation": conversation_id})
    else:
        await db.execute(RELEASE_AT, {"conversation": conversation_id, "snapshot": snapshot_id})


async def open_turn(db: AsyncSession, conversation_id: str) -> Turn | None:
    query = sa.select(Turn).where(
        Turn.conversation_id == conversation_id, Turn.state.in_(OPEN_TURN_STATES)
    )
    return (await db.execute(query.limit(1))).scalar_one_or_none()


async def conversation_of_turn(db: AsyncSession, turn_id: str) -> Conversation:
    query = sa.select(Conversation).join(Turn, Turn.conversation_id == Conversation.id)
    return (await db.execute(query.where(Turn.id == turn_id))).scalar_one()


async def locate(db: AsyncSession, team_id: str, approval_id: str) -> Located | None:
    """The approval and its thread, in one query."""
    row = (await db.execute(LOCATED, {"team_id": team_id, "id": approval_id})).first()
    return None if row is None else _located(row)


async def locate_with_policy(
    db: AsyncSession, team_id: str, approval_id: str
) -> tuple[Located, ToolPolicy | None] | None:
    """The approval, its thread and its tool's stored policy, in one query."""
    values = {"team_id": team_id, "id": approval_id}
    row = (await db.execute(LOCATED_WITH_POLICY, values)).first()
    if row is None:
        return None
    stored = _prefixed(row, "policy_")
    policy = None if stored["team_id"] is None else ToolPolicy(**stored)
    return _located(row, skip="policy_"), policy


async def locate_turn(db: AsyncSession, turn_id: str) -> list[Located]:
    """A turn's approvals, each with the thread, in one query."""
    return [_located(row) for row in await db.execute(LOCATED_BY_TURN, {"turn_id": turn_id})]


def _prefixed(row: sa.Row[Any], prefix: str) -> dict[str, Any]:
    """The columns of another table joined into `row`, labelled `prefix` + name, by name."""
    return {k[len(prefix) :]: v for k, v in row._mapping.items() if k.startswith(prefix)}


def _located(row: sa.Row[Any], skip: str | None = None) -> Located:
    """`skip`: the label prefix of another table's columns in the row (see `_prefixed`)."""
    values = {k: v for k, v in row._mapping.items() if skip is None or not k.startswith(skip)}
    channel, thread_ts = values.pop("thread_channel"), values.pop("thread_ts")
    return Located(Approval(**values), channel, thread_ts)


async def turn_approvals(db: AsyncSession, turn_id: str) -> list[Approval]:
    return _all(Approval, (await db.execute(TURN_APPROVALS, {"turn_id": turn_id})).all())


async def add_paused_turn(
    db: AsyncSession, turn: Turn, rows: Sequence[Approval], events: Sequence[dict[str, Any]]
) -> None:
    """Insert a turn stopped on interrupts, one approval per interrupt, and audit `events`
    (one per approval).

    On PostgreSQL one statement (data-modifying CTEs): atomic on its own, one round trip on
    the way to the card. Elsewhere three inserts, atomic in the caller's transaction.
    """
    turn_row, approval_rows = _values(T, turn), [_values(A, row) for row in rows]
    if db.get_bind().dialect.name != "postgresql":
        await db.execute(sa.insert(T), [turn_row])
        await db.execute(sa.insert(A), approval_rows)
        await db.execute(audit.INSERT, list(events))
        return
    values = {f"t_{key}": value for key, value in turn_row.items()}
    for i, (row, event) in enumerate(zip(approval_rows, events, strict=True)):
        values |= {f"a{i}_{key}": value for key, value in row.items()}
        values |= {f"e{i}_{key}": value for key, value in event.items()}
    await db.execute(_paused(len(rows)), values)


@functools.cache
def _paused(n: int) -> sa.Insert:
    """The PostgreSQL statement for a turn with `n` approvals, built once per `n`.

    Single-row inserts only, with named parameters: SQLAlchemy caches the compiled form of
    those, while a multi-row VALUES was compiled afresh on every call.
    """

    def row(table: sa.Table, prefix: str, keys: Sequence[str]) -> dict[str, Any]:
        return {k: sa.bindparam(prefix + k, type_=table.c[k].type) for k in keys}

    event_keys = audit.ENTRY_KEYS
    ctes = [sa.insert(T).values(row(T, "t_", T.c.keys())).cte("paused")]
    ctes += [sa.insert(A).values(row(A, f"a{i}_", A.c.keys())).cte(f"asked{i}") for i in range(n)]
    ctes += [
        audit.INSERT.values(row(audit.TABLE, f"e{i}_", event_keys)).cte(f"noted{i}")
        for i in range(1, n)
    ]
    return audit.INSERT.values(row(audit.TABLE, "e0_", event_keys)).add_cte(*ctes)


def _values(table: sa.Table, obj: Base) -> dict[str, Any]:
    return {c.key: getattr(obj, c.key) for c in table.columns}


async def record_decision(
    db: AsyncSession,
    approval_id: str,
    *,
    status: ApprovalStatus,
    decided_by: str | None,
    reason: str | None,
    now: datetime,
    event: dict[str, Any],
) -> Recorded | None:
    """pending -> approved/denied/expired, once, with its audit `event`; None when someone
    else decided first (and nothing is written)."""
    values = {
        "approval": approval_id,
        "decision": status,
        "by": decided_by,
        "because": reason,
        "now": now,
    }
    row = await _transition(db, DECIDE, DECIDE_AUDITED, values, event)
    if row is None:
        return None
    columns = dict(row._mapping)
    others = int(columns.pop("others_pending"))
    return Recorded(Approval(**columns), others)


async def _transition(
    db: AsyncSession,
    update: Any,
    audited: Any,
    values: dict[str, Any],
    event: dict[str, Any],
    from_row: Callable[[sa.Row[Any]], dict[str, Any]] | None = None,
) -> sa.Row[Any] | None:
    """Run a conditional update and append its audit `event` if it took: on PostgreSQL one
    statement (`audited`), elsewhere two in the caller's transaction. Audit values that
    come from the changed row are `from_row`'s here and read off the row by `audited`."""
    if db.get_bind().dialect.name == "postgresql":
        bound = {f"audit_{key}": value for key, value in event.items()}
        return (await db.execute(audited, values | bound)).first()
    row = (await db.execute(update, values)).first()
    if row is not None:
        await audit.record(db, event | (from_row(row) if from_row else {}))
    return row


async def expired_approvals(
    db: AsyncSession, *, now: datetime, team_id: str | None = None
) -> Sequence[Approval]:
    query = sa.select(Approval).where(
        Approval.status == ApprovalStatus.PENDING, Approval.expires_at <= now
    )
    if team_id is not None:
        query = query.where(Approval.team_id == team_id)
    return (await db.execute(query)).scalars().all()


async def claim_turn(
    db: AsyncSession, turn_id: str, *, now: datetime, lease_until: datetime
) -> tuple[Turn, list[Located]] | None:
    """Take the right to resume a turn whose every approval is decided; returns the turn
    and its approvals with their thread (one statement on PostgreSQL).

    A waiting turn is claimed once; a resuming turn only after its lease ran out (its
    process died or gave up), which is how recovery takes over without a second runner.
    """
    values = {"turn": turn_id, "now": now, "lease": lease_until}
    if db.get_bind().dialect.name != "postgresql":
        turn = _as(Turn, (await db.execute(CLAIM_TURN, values)).first())
        return None if turn is None else (turn, await locate_turn(db, turn.id))
    rows = cast(Sequence[sa.Row[Any]], (await db.execute(CLAIM_TURN_LOCATED, values)).all())
    if not rows:
        return None
    turn = Turn(**_prefixed(rows[0], "claimed_"))
    return turn, [_located(row, skip="claimed_") for row in rows]


async def extend_lease(db: AsyncSession, turn_id: str, *, attempt: int, until: datetime) -> bool:
    """Keep a running resume's claim alive; False if it was lost (another took over)."""
    values = {"turn": turn_id, "attempt": attempt, "until": until}
    return _changed(await db.execute(EXTEND_LEASE, values))


async def finish_turn(
    db: AsyncSession, turn_id: str, *, attempt: int, state: TurnState, now: datetime
) -> bool:
    values = {"turn": turn_id, "attempt": attempt, "new_state": state, "now": now}
    return _changed(await db.execute(FINISH_TURN, values))


async def finish_and_release(
    db: AsyncSession,
    turn_id: str,
    *,
    attempt: int,
    now: datetime,
    conversation_id: str,
    snapshot_id: str | None,
) -> list[Approval] | None:
    """A resumed turn is done and its thread free to continue from `snapshot_id`; returns
    the turn's approvals, or None when its lease was lost (and nothing changed). On
    PostgreSQL one statement, elsewhere three in the caller's transaction."""
    if db.get_bind().dialect.name == "postgresql":
        values = {
            "turn": turn_id,
            "attempt": attempt,
            "new_state": TurnState.DONE,
            "now": now,
            "conversation": conversation_id,
            "snapshot": snapshot_id,
        }
        return _all(Approval, (await db.execute(FINISH_AND_RELEASE, values)).all()) or None
    if not await finish_turn(db, turn_id, attempt=attempt, state=TurnState.DONE, now=now):
        return None
    await release_conversation(db, conversation_id, snapshot_id=snapshot_id)
    return await turn_approvals(db, turn_id)


async def recoverable_turns(
    db: AsyncSession, *, now: datetime, team_id: str | None = None, limit: int = 50
) -> Sequence[str]:
    """Turns a sweep should try to claim: decided but idle, or resuming with a dead lease."""
    undecided = (
        sa.select(Approval.id)
        .where(Approval.turn_id == Turn.id, Approval.status == ApprovalStatus.PENDING)
        .exists()
    )
    query = sa.select(Turn.id).where(
        ~undecided,
        sa.or_(
            Turn.state == TurnState.WAITING,
            sa.and_(Turn.state == TurnState.RESUMING, Turn.lease_until < now),
        ),
    )
    if team_id is not None:
        query = query.where(Turn.team_id == team_id)
    return (await db.execute(query.limit(limit))).scalars().all()


async def start_execution(
    db: AsyncSession, approval_id: str, *, team_id: str, tool: str, ref: str, now: datetime
) -> Approval | None:
    """not_started -> started for an approved call: the one gate every execution passes,
    audited with its approver and input. The row when this caller passed it; None for
    everyone else, ever."""
    values = {"approval": approval_id, "team": team_id, "tool_name": tool, "call_ref": ref}
    event = audit.entry(
        team_id=team_id, at=now, actor="", action="execution_started", tool=tool,
        approval_id=approval_id,
    )  # fmt: skip
    del event["actor"], event["detail"]  # off the row: who approved it, and its input

    def from_row(row: sa.Row[Any]) -> dict[str, Any]:
        return {"actor": row.decided_by or "", "detail": {"input": row.input}}

    row = await _transition(db, START_EXECUTION, START_EXECUTION_AUDITED, values, event, from_row)
    return _as(Approval, row)


async def finish_execution(
    db: AsyncSession, approval_id: str, *, output: dict[str, Any], event: dict[str, Any]
) -> None:
    """started -> finished with the tool's output, and its audit `event`."""
    values = {"approval": approval_id, "result": output}
    await _transition(db, FINISH_EXECUTION, FINISH_EXECUTION_AUDITED, values, event)


async def set_card(db: AsyncSession, approval_id: str, *, channel: str, ts: str) -> None:
    await db.execute(SET_CARD, {"approval": approval_id, "channel": channel, "ts": ts})


async def uncarded_approvals(
    db: AsyncSession, *, requested_before: datetime, team_id: str | None = None
) -> Sequence[Approval]:
    query = sa.select(Approval).where(
        Approval.status == ApprovalStatus.PENDING,
        Approval.card_ts.is_(None),
        Approval.card_channel.is_not(None),
        Approval.requested_at < requested_before,
    )
    if team_id is not None:
        query = query.where(Approval.team_id == team_id)
    return (await db.execute(query)).scalars().all()


async def pending_approvals(db: AsyncSession, team_id: str) -> Sequence[Approval]:
    query = sa.select(Approval).where(
        Approval.team_id == team_id, Approval.status == ApprovalStatus.PENDING
    )
    return (await db.execute(query.order_by(Approval.requested_at))).scalars().all()
