"""Follow-ups in storage: what falls due after a request is made, and the cards' outboxes.

The sweep finds what is due here: overdue requests (EXPIRE), cards (and escalated cards)
whose post failed or was cut off, reminders and escalations.

Each follow-up is recorded as done before the transport does it (REMIND, ESCALATE,
RETRY_CARD, RETRY_ESCALATION), in one conditional write: whichever replica gets there first
does it, once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from storage.db import SessionFactory, autocommit
from storage.domain import Approval, CardState
from storage.driver import prepared
from storage.lifecycle import (
    CARD_FAILED,
    CARD_POSTED,
    ESCALATE,
    ESCALATION_FAILED,
    ESCALATION_POSTED,
    EXPIRE,
    REMIND,
    RETRY_CARD,
    RETRY_ESCALATION,
    Transition,
)
from storage.rows import (
    EXPLAIN_APPROVAL,
    LOCATED,
    NOTE,
    approval_of,
    change,
    key,
    located,
    refusal,
)
from storage.transitions import NOW, A, Atomic, guard, write

OVERDUE = LOCATED.where(guard(EXPIRE))
STALE_CARDS = LOCATED.where(guard(RETRY_CARD))
STALE_ESCALATIONS = LOCATED.where(guard(RETRY_ESCALATION))
DUE = {t: LOCATED.where(guard(t)) for t in (REMIND, ESCALATE)}
# The card's outbox, and the escalated card's.
POSTED = prepared(write(CARD_POSTED, card_ts=sa.bindparam("ts")))
FAILED = Atomic(write(CARD_FAILED), NOTE)
RETRY = prepared(write(RETRY_CARD, card_attempted_at=NOW))
ESCALATION_OUT = prepared(write(ESCALATION_POSTED, escalation_ts=sa.bindparam("ts")))
ESCALATION_LOST = Atomic(write(ESCALATION_FAILED), NOTE)
RETRY_UP = prepared(write(RETRY_ESCALATION, escalation_attempted_at=NOW))
# Follow-ups, each with its audit row; an escalation's card is then being posted.
FOLLOW_UP = {
    REMIND: Atomic(write(REMIND), NOTE),
    ESCALATE: Atomic(
        write(ESCALATE, escalation_card=CardState.POSTING, escalation_attempted_at=NOW), NOTE
    ),
}


class FollowUpStore:
    """What is due after a request is made, and where its card got to."""

    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    async def overdue(self, *, now: datetime, team_id: str | None = None) -> tuple[Approval, ...]:
        """Pending approvals an EXPIRE may take now."""
        query = OVERDUE if team_id is None else OVERDUE.where(A.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return located(await db.execute(query, {"now": now}))

    async def due(
        self, transition: Transition, *, now: datetime, team_id: str | None = None
    ) -> tuple[Approval, ...]:
        """Pending approvals whose REMIND or ESCALATE is due now."""
        query = DUE[transition]
        if team_id is not None:
            query = query.where(A.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return located(await db.execute(query, {"now": now}))

    async def follow_up(
        self, transition: Transition, approval: Approval, *, now: datetime
    ) -> Approval:
        """REMIND or ESCALATE, audited: recorded before it is done, so it is done once."""
        row = await change(
            self._sessions, FOLLOW_UP[transition], transition, approval, now, {"now": now}
        )
        return approval_of(row._mapping, approval.thread)

    async def escalation_posted(self, approval: Approval, *, ts: str) -> Approval:
        """ESCALATION_POSTED: the escalated card is out, at `ts` (a decision redraws it too)."""
        return await self._card(ESCALATION_OUT, ESCALATION_POSTED, approval, {"ts": ts})

    async def retry_escalation(
        self, approval: Approval, *, now: datetime, stale: datetime
    ) -> Approval:
        """RETRY_ESCALATION: take over an escalated card's post that failed or was cut off
        before `stale` (one sweep gets it)."""
        params = {"now": now, "card_stale": stale}
        return await self._card(RETRY_UP, RETRY_ESCALATION, approval, params)

    async def escalation_failed(self, approval: Approval, *, now: datetime) -> Approval:
        """ESCALATION_FAILED, audited: Slack refused the escalated card for good."""
        row = await change(self._sessions, ESCALATION_LOST, ESCALATION_FAILED, approval, now, {})
        return approval_of(row._mapping, approval.thread)

    async def stale_cards(
        self, *, stale: datetime, team_id: str | None = None, escalated: bool = False
    ) -> tuple[Approval, ...]:
        """Pending approvals whose card post (`escalated`: the escalated card's) began
        before `stale` and never finished."""
        query = STALE_ESCALATIONS if escalated else STALE_CARDS
        if team_id is not None:
            query = query.where(A.c.team_id == team_id)
        async with autocommit(self._sessions) as db:
            return located(await db.execute(query, {"card_stale": stale}))

    async def card_posted(self, approval: Approval, *, ts: str) -> Approval:
        """CARD_POSTED: the card is out, at `ts`."""
        return await self._card(POSTED, CARD_POSTED, approval, {"ts": ts})

    async def retry_card(self, approval: Approval, *, now: datetime, stale: datetime) -> Approval:
        """RETRY_CARD: take over a post cut off before `stale` (one sweep gets it)."""
        return await self._card(RETRY, RETRY_CARD, approval, {"now": now, "card_stale": stale})

    async def _card(
        self, write: sa.Update, transition: Transition, approval: Approval, params: dict[str, Any]
    ) -> Approval:
        values = key(approval) | params
        async with autocommit(self._sessions) as db:
            row = (await db.execute(write, values)).first()
            if row is None:
                raise await refusal(db, transition, EXPLAIN_APPROVAL, values)
        return approval_of(row._mapping, approval.thread)

    async def card_failed(self, approval: Approval, *, now: datetime) -> Approval:
        """CARD_FAILED, audited: Slack refused the card for good."""
        row = await change(self._sessions, FAILED, CARD_FAILED, approval, now, {})
        return approval_of(row._mapping, approval.thread)
