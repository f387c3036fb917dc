"""Slack event ids already seen: the first delivery wins, retries are dropped."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import SeenEvent


async def first_delivery(db: AsyncSession, event_id: str, *, now: datetime) -> bool:
    """Record the event id; False when it was already recorded (a retry or a replica's twin)."""
    dialect = postgresql if db.get_bind().dialect.name == "postgresql" else sqlite
    insert = dialect.insert(SeenEvent).values(event_id=event_id, received_at=now)
    result = await db.execute(insert.on_conflict_do_nothing(index_elements=["event_id"]))
    return result.rowcount == 1  # type: ignore[attr-defined,no-any-return]


async def forget_before(db: AsyncSession, cutoff: datetime) -> None:
    """Slack retries for minutes, not days: old ids can go."""
    await db.execute(delete(SeenEvent).where(SeenEvent.received_at < cutoff))
