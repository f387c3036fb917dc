"""The append-only audit trail: rows are added, never changed."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import AuditEvent

TABLE = cast(sa.Table, AuditEvent.__table__)
INSERT = sa.insert(TABLE)
ENTRY_KEYS = ("team_id", "at", "actor", "action", "tool", "approval_id", "detail")


def entry(
    *,
    team_id: str,
    at: datetime,
    actor: str,
    action: str,
    tool: str | None = None,
    approval_id: str | None = None,
    **detail: Any,
) -> dict[str, Any]:
    """One event as a row, for `record` or for a caller inserting it with other rows."""
    values = (team_id, at, actor, action, tool, approval_id, detail)
    return dict(zip(ENTRY_KEYS, values, strict=True))


async def record(db: AsyncSession, event: dict[str, Any]) -> None:
    """Append one `entry` in the caller's transaction: a prebuilt Core insert."""
    await db.execute(INSERT, event)


async def recent(
    db: AsyncSession, team_id: str, *, tool: str | None = None, limit: int = 20
) -> Sequence[AuditEvent]:
    query = select(AuditEvent).where(AuditEvent.team_id == team_id)
    if tool is not None:
        query = query.where(AuditEvent.tool == tool)
    query = query.order_by(AuditEvent.at.desc(), AuditEvent.id.desc()).limit(limit)
    return (await db.execute(query)).scalars().all()
