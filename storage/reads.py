"""Reads of approvals for the pages and people that show them: inbox, pending, history, audit.

One request, the pending ones, a person's inbox and own requests, the standing approvals live
now, a requester's history, the audit trail's pages.

None of them changes a state; the only write here is the audit row that says someone looked
at the conversation behind a request (`note_viewed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from storage import audit
from storage.db import SessionFactory, autocommit
from storage.domain import (
    HISTORY_ENDS,
    Approval,
    ApprovalState,
    AuditEntry,
    History,
    StandingState,
)
from storage.policy_spec import STANDING_MAX
from storage.rows import LOCATED, OPEN, TEAM, get, located, with_votes
from storage.transitions import NOW, A, T

PENDING = LOCATED.where(TEAM, A.c.status == ApprovalState.PENDING)
_PERSON: sa.BindParameter[str] = sa.bindparam("person", type_=sa.String())
# The Home tab (bot/home.py), each bounded by a LIMIT: others' open requests, found by
# ix_approvals_status_expiry; and a requester's own still pending, or settled with their
# turn going on, by ix_approvals_requester (its (team_id, requester) prefix). A gateway
# request's turn is done from the start (storage/gateway_store.py): it is listed while it
# is pending.
INBOX = PENDING.where(A.c.requester != _PERSON)
_GOES_ON = (ApprovalState.APPROVED, ApprovalState.ANSWERED)
REQUESTED = LOCATED.where(
    TEAM,
    A.c.requester == _PERSON,
    sa.or_(A.c.status == ApprovalState.PENDING, sa.and_(A.c.status.in_(_GOES_ON), OPEN)),
)
# Standing approvals live now, soonest over first (the Home's Revoke, bot/home.py). No index
# of its own: a grant is made before its request's deadline and lasts at most STANDING_MAX,
# so a live one's request expires after `since` (now - STANDING_MAX), which bounds a scan of
# ix_approvals_status_expiry (or the planner takes ix_approvals_requester's team prefix).
LIVE_GRANTS = (
    LOCATED.where(
        TEAM,
        A.c.status == ApprovalState.APPROVED,
        A.c.expires_at > sa.bindparam("since", type_=A.c.expires_at.type),
        A.c.standing == StandingState.GRANTED,
        A.c.standing_until > NOW,
    )
    .order_by(None)
    .order_by(A.c.standing_until, A.c.id)
)
# Pending requests by tool, every workspace: one row per tool, read off the status index.
PENDING_BY_TOOL = (
    sa.select(A.c.tool, sa.func.count())
    .where(A.c.status == ApprovalState.PENDING)
    .group_by(A.c.tool)
)
# A requester's earlier requests for some tools, by how they ended (History's outcomes).
HISTORY = (
    sa.select(A.c.tool, A.c.status, sa.func.count())
    .where(
        TEAM,
        A.c.requester == sa.bindparam("requester"),
        A.c.tool.in_(sa.bindparam("tools", expanding=True)),
        A.c.requested_at >= sa.bindparam("since"),
        A.c.status.in_(HISTORY_ENDS),
    )
    .group_by(A.c.tool, A.c.status)
)
SNAPSHOT_OF_TURN = sa.select(T.c.snapshot_id).where(T.c.id == sa.bindparam("turn"))


class ReadStore:
    """Approvals as pages and people see them."""

    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    async def get(self, team_id: str, approval_id: str) -> Approval | None:
        return await get(self._sessions, team_id, approval_id)

    async def pending(
        self, team_id: str, *, limit: int = 20, offset: int = 0
    ) -> tuple[Approval, ...]:
        """Pending approvals, oldest first, a page at a time."""
        query = PENDING.limit(limit).offset(offset)
        async with autocommit(self._sessions) as db:
            return located(await db.execute(query, {"team": team_id}))

    async def inbox(self, team_id: str, person: str, *, limit: int) -> tuple[Approval, ...]:
        """Pending requests of others, oldest first, at most `limit` (with their votes)."""
        params = {"team": team_id, "person": person}
        async with autocommit(self._sessions) as db:
            found = located(await db.execute(INBOX.limit(limit), params))
        return await with_votes(self._sessions, found)

    async def requested_by(self, team_id: str, person: str, *, limit: int) -> tuple[Approval, ...]:
        """`person`'s requests still pending, or decided and their turn not finished,
        oldest first, at most `limit`."""
        params = {"team": team_id, "person": person}
        async with autocommit(self._sessions) as db:
            found = located(await db.execute(REQUESTED.limit(limit), params))
        return await with_votes(self._sessions, found)

    async def live_grants(self, team_id: str, *, now: datetime, limit: int) -> tuple[Approval, ...]:
        """Standing approvals not revoked and not over at `now`, soonest over first, at most
        `limit`."""
        params = {"team": team_id, "now": now, "since": now - STANDING_MAX}
        async with autocommit(self._sessions) as db:
            return located(await db.execute(LIVE_GRANTS.limit(limit), params))

    async def pending_by_tool(self) -> dict[str, int]:
        """How many requests wait for a decision, by tool, across every workspace."""
        async with autocommit(self._sessions) as db:
            rows = await db.execute(PENDING_BY_TOOL)
        return {tool: count for tool, count in rows}

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
            found = await db.scalar(SNAPSHOT_OF_TURN, {"turn": approval.turn_id})
        return None if found is None else str(found)

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
