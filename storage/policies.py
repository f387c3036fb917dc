"""Per-tool policy rows: read at every tool call, written by admins."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import ToolPolicy


async def get_policy(db: AsyncSession, team_id: str, tool: str) -> ToolPolicy | None:
    return await db.get(ToolPolicy, (team_id, tool))


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
