"""Conversations, paused turns and approvals: every state change is one conditional write.

Each transition names the state it leaves in its WHERE clause, so when two callers race
(two clicks, two replicas, a retry) exactly one gets a row back and the other learns so.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import Approval, ApprovalStatus, Conversation, Execution, Turn, TurnState

OPEN_TURN_STATES = (TurnState.WAITING, TurnState.RESUMING)


async def find_conversation(
    db: AsyncSession, team_id: str, channel_id: str, thread_ts: str
) -> Conversation | None:
    query = select(Conversation).where(
        Conversation.team_id == team_id,
        Conversation.channel_id == channel_id,
        Conversation.thread_ts == thread_ts,
    )
    return (await db.execute(query)).scalar_one_or_none()


async def get_or_create_conversation(
    db: AsyncSession, *, new_id: str, team_id: str, channel_id: str, thread_ts: str, now: datetime
) -> Conversation:
    """The conversation bound to a Slack thread; concurrent first messages share one row."""
    found = await find_conversation(db, team_id, channel_id, thread_ts)
    if found is not None:
        return found
    row = Conversation(
        id=new_id, team_id=team_id, channel_id=channel_id, thread_ts=thread_ts, created_at=now
    )
    try:
        async with db.begin_nested():
            db.add(row)
    except IntegrityError:
        existing = await find_conversation(db, team_id, channel_id, thread_ts)
        assert existing is not None
        return existing
    return row


async def claim_conversation(
    db: AsyncSession, conversation_id: str, *, now: datetime, until: datetime
) -> bool:
    """Take the thread for one turn; False while another turn runs in it."""
    result = await db.execute(
        update(Conversation)
        .where(
            Conversation.id == conversation_id,
            or_(Conversation.busy_until.is_(None), Conversation.busy_until < now),
        )
        .values(busy_until=until)
    )
    return result.rowcount == 1  # type: ignore[attr-defined,no-any-return]


async def release_conversation(
    db: AsyncSession, conversation_id: str, *, snapshot_id: str | None
) -> None:
    """Free the thread; `snapshot_id` (when given) is where the next message continues."""
    values: dict[str, Any] = {"busy_until": None}
    if snapshot_id is not None:
        values["snapshot_id"] = snapshot_id
    await db.execute(update(Conversation).where(Conversation.id == conversation_id).values(values))


async def open_turn(db: AsyncSession, conversation_id: str) -> Turn | None:
    query = select(Turn).where(
        Turn.conversation_id == conversation_id, Turn.state.in_(OPEN_TURN_STATES)
    )
    return (await db.execute(query.limit(1))).scalar_one_or_none()


async def conversation_of_turn(db: AsyncSession, turn_id: str) -> Conversation:
    query = select(Conversation).join(Turn, Turn.conversation_id == Conversation.id)
    return (await db.execute(query.where(Turn.id == turn_id))).scalar_one()


async def get_approval(db: AsyncSession, team_id: str, approval_id: str) -> Approval | None:
    query = select(Approval).where(Approval.team_id == team_id, Approval.id == approval_id)
    return (await db.execute(query)).scalar_one_or_none()


async def turn_approvals(db: AsyncSession, turn_id: str) -> Sequence[Approval]:
    query = select(Approval).where(Approval.turn_id == turn_id)
    return (await db.execute(query.order_by(Approval.requested_at, Approval.id))).scalars().all()


async def record_decision(
    db: AsyncSession,
    approval_id: str,
    *,
    status: ApprovalStatus,
    decided_by: str | None,
    reason: str | None,
    now: datetime,
) -> bool:
    """pending -> approved/denied/expired, once. False when someone else decided first."""
    result = await db.execute(
        update(Approval)
        .where(Approval.id == approval_id, Approval.status == ApprovalStatus.PENDING)
        .values(status=status, decided_by=decided_by, decided_at=now, reason=reason)
    )
    return result.rowcount == 1  # type: ignore[attr-defined,no-any-return]


async def expired_approvals(
    db: AsyncSession, *, now: datetime, team_id: str | None = None
) -> Sequence[Approval]:
    query = select(Approval).where(
        Approval.status == ApprovalStatus.PENDING, Approval.expires_at <= now
    )
    if team_id is not None:
        query = query.where(Approval.team_id == team_id)
    return (await db.execute(query)).scalars().all()


async def claim_turn(
    db: AsyncSession, turn_id: str, *, now: datetime, lease_until: datetime
) -> Turn | None:
    """Take the right to resume a turn whose every approval is decided.

    A waiting turn is claimed once; a resuming turn only after its lease ran out (its
    process died or gave up), which is how recovery takes over without a second runner.
    """
    undecided = (
        select(func.count())
        .select_from(Approval)
        .where(Approval.turn_id == Turn.id, Approval.status == ApprovalStatus.PENDING)
        .scalar_subquery()
    )
    result = await db.execute(
        update(Turn)
        .where(
            Turn.id == turn_id,
            undecided == 0,
            or_(
                Turn.state == TurnState.WAITING,
                and_(Turn.state == TurnState.RESUMING, Turn.lease_until < now),
            ),
        )
        .values(
            state=TurnState.RESUMING,
            lease_until=lease_until,
            attempts=Turn.attempts + 1,
            updated_at=now,
        )
        .returning(Turn)
    )
    return result.scalar_one_or_none()


async def extend_lease(db: AsyncSession, turn_id: str, *, attempt: int, until: datetime) -> bool:
    """Keep a running resume's claim alive; False if it was lost (another took over)."""
    result = await db.execute(
        update(Turn)
        .where(Turn.id == turn_id, Turn.state == TurnState.RESUMING, Turn.attempts == attempt)
        .values(lease_until=until)
    )
    return result.rowcount == 1  # type: ignore[attr-defined,no-any-return]


async def finish_turn(
    db: AsyncSession, turn_id: str, *, attempt: int, state: TurnState, now: datetime
) -> bool:
    result = await db.execute(
        update(Turn)
        .where(Turn.id == turn_id, Turn.state == TurnState.RESUMING, Turn.attempts == attempt)
        .values(state=state, lease_until=None, updated_at=now)
    )
    return result.rowcount == 1  # type: ignore[attr-defined,no-any-return]


async def recoverable_turns(
    db: AsyncSession, *, now: datetime, team_id: str | None = None, limit: int = 50
) -> Sequence[str]:
    """Turns a sweep should try to claim: decided but idle, or resuming with a dead lease."""
    undecided = (
        select(Approval.id)
        .where(Approval.turn_id == Turn.id, Approval.status == ApprovalStatus.PENDING)
        .exists()
    )
    query = select(Turn.id).where(
        ~undecided,
        or_(
            Turn.state == TurnState.WAITING,
            and_(Turn.state == TurnState.RESUMING, Turn.lease_until < now),
        ),
    )
    if team_id is not None:
        query = query.where(Turn.team_id == team_id)
    return (await db.execute(query.limit(limit))).scalars().all()


async def start_execution(
    db: AsyncSession, approval_id: str, *, team_id: str, tool: str, ref: str
) -> bool:
    """not_started -> started for an approved call: the one gate every execution passes."""
    result = await db.execute(
        update(Approval)
        .where(
            Approval.id == approval_id,
            Approval.team_id == team_id,
            Approval.tool == tool,
            Approval.ref == ref,
            Approval.status == ApprovalStatus.APPROVED,
            Approval.execution == Execution.NOT_STARTED,
        )
        .values(execution=Execution.STARTED)
    )
    return result.rowcount == 1  # type: ignore[attr-defined,no-any-return]


async def finish_execution(db: AsyncSession, approval_id: str, *, output: dict[str, Any]) -> None:
    await db.execute(
        update(Approval)
        .where(Approval.id == approval_id, Approval.execution == Execution.STARTED)
        .values(execution=Execution.FINISHED, output=output)
    )


async def set_card(db: AsyncSession, approval_id: str, *, channel: str, ts: str) -> None:
    await db.execute(
        update(Approval).where(Approval.id == approval_id).values(card_channel=channel, card_ts=ts)
    )


async def uncarded_approvals(
    db: AsyncSession, *, requested_before: datetime, team_id: str | None = None
) -> Sequence[Approval]:
    query = select(Approval).where(
        Approval.status == ApprovalStatus.PENDING,
        Approval.card_ts.is_(None),
        Approval.card_channel.is_not(None),
        Approval.requested_at < requested_before,
    )
    if team_id is not None:
        query = query.where(Approval.team_id == team_id)
    return (await db.execute(query)).scalars().all()


async def pending_approvals(db: AsyncSession, team_id: str) -> Sequence[Approval]:
    query = select(Approval).where(
        Approval.team_id == team_id, Approval.status == ApprovalStatus.PENDING
    )
    return (await db.execute(query.order_by(Approval.requested_at))).scalars().all()
