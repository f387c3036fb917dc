"""The append-only audit trail: rows are added, never changed."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from storage.lifecycle import AuditEntry
from storage.models import AuditRow

TABLE = cast(sa.Table, AuditRow.__table__)
INSERT = sa.insert(TABLE)
_RECENT = sa.select(TABLE).order_by(TABLE.c.at.desc(), TABLE.c.id.desc())


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
    """One event as a row, for inserting with the change it records."""
    return {
        "team_id": team_id,
        "at": at,
        "actor": actor,
        "action": action,
        "tool": tool,
        "approval_id": approval_id,
        "detail": detail,
    }


async def recent(
    db: AsyncSession, team_id: str, *, tool: str | None = None, limit: int = 20, offset: int = 0
) -> list[AuditEntry]:
    """The newest events first, a page of `limit` after skipping `offset`."""
    query = _RECENT.where(TABLE.c.team_id == team_id)
    if tool is not None:
        query = query.where(TABLE.c.tool == tool)
    rows = (await db.execute(query.limit(limit).offset(offset))).all()
    return [
        AuditEntry(
            at=row.at,
            actor=row.actor,
            action=row.action,
            tool=row.tool,
            approval_id=row.approval_id,
            detail=dict(row.detail),
        )
        for row in rows
    ]
