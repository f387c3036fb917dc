"""Per-tool policy rows: read at every tool call, written by admins."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import ToolPolicy

_P = cast(sa.Table, ToolPolicy.__table__)
# Read at every tool call: a prebuilt Core query, not the ORM's identity-map get.
GET = sa.select(_P).where(
    _P.c.team_id == sa.bindparam("team_id"), _P.c.tool == sa.bindparam("tool")
)


async def get_policy(db: AsyncSession, team_id: str, tool: str) -> ToolPolicy | None:
    row = (await db.execute(GET, {"team_id": team_id, "tool": tool})).first()
    return None if row is None else ToolPolicy(**row._mapping)


async def team_policies(db: AsyncSession, team_id: str) -> Sequence[ToolPolicy]:
    query = select(ToolPolicy).where(ToolPolicy.team_id == team_id)
    return (await db.execute(query)).scalars().all()


async def update_policy(
    db: AsyncSession, team_id: str, tool: str, *, by: str, now: datetime, **changes: Any
) -> ToolPolicy:
    """Apply `changes` to the tool's row, creating it with defaults the first time."""
    row = await db.get(ToolPolicy, (team_id, tool), with_for_update=True)
    if row is None:
        row = ToolPolicy(
            team_id=team_id, tool=tool, allowed=False, approver_users=[], approver_groups=[]
        )
        db.add(row)
    for key, value in changes.items():
        setattr(row, key, value)
    row.updated_at = now
    row.updated_by = by
    await db.flush()
    return row
