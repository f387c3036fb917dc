"""The append-only audit trail: rows are added, never changed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa

from storage.db import Db, SessionFactory, autocommit
from storage.domain import AuditEntry
from storage.models import AuditRow

TABLE = cast(sa.Table, AuditRow.__table__)
INSERT = sa.insert(TABLE)
_RECENT = sa.select(TABLE).order_by(TABLE.c.at.desc(), TABLE.c.id.desc())
_AFTER = sa.tuple_(TABLE.c.at, TABLE.c.id) > sa.tuple_(
    sa.bindparam("after_at", type_=TABLE.c.at.type), sa.bindparam("after_id", type_=sa.Integer)
)
COLUMNS = ("id", "at", "team_id", "actor", "action", "tool", "approval_id", "detail")


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
    db: Db, team_id: str, *, tool: str | None = None, limit: int = 20, offset: int = 0
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


async def export(
    sessions: SessionFactory,
    *,
    since: datetime,
    tool: str | None = None,
    team_id: str | None = None,
    page: int = 1000,
) -> AsyncIterator[Sequence[sa.Row[Any]]]:
    """Every event at or after `since`, oldest first, `page` rows per query: each query
    starts after the last row of the one before (on the (at, id) index), so a trail of any
    length streams in bounded pieces and none is skipped or repeated."""
    query = sa.select(*(TABLE.c[c] for c in COLUMNS)).where(TABLE.c.at >= since)
    if tool is not None:
        query = query.where(TABLE.c.tool == tool)
    if team_id is not None:
        query = query.where(TABLE.c.team_id == team_id)
    query = query.order_by(TABLE.c.at, TABLE.c.id).limit(page)
    params: dict[str, Any] = {}
    while True:
        async with autocommit(sessions) as db:
            rows = (await db.execute(query.where(_AFTER) if params else query, params)).all()
        if rows:
            yield rows
        if len(rows) < page:
            return
        params = {"after_at": rows[-1].at, "after_id": rows[-1].id}
