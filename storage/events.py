"""Slack event ids already seen: the first delivery wins, retries are dropped."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import SeenEvent


async def first_delivery(db: AsyncSession, event_id: str, *, now: datetime) -> bool:
    """Record the event id; False when it was already recorded (a retry or a replica's twin)."""
    try:
        async with db.begin_nested():
            db.add(SeenEvent(event_id=event_id, received_at=now))
    except IntegrityError:
        return False
    return True


async def forget_before(db: AsyncSession, cutoff: datetime) -> None:
    """Slack retries for minutes, not days: old ids can go."""
    await db.execute(delete(SeenEvent).where(SeenEvent.received_at < cutoff))
