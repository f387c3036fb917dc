"""Slack event ids already seen: the first delivery wins, retries are dropped."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from storage.models import SeenEvent


def _first(dialect: Any) -> Any:
    insert = dialect.insert(SeenEvent.__table__).values(
        event_id=sa.bindparam("event"), received_at=sa.bindparam("now")
    )
    return insert.on_conflict_do_nothing(index_elements=["event_id"])


# Built once: building the statement per event cost more than running it.
FIRST = {"postgresql": _first(postgresql), "sqlite": _first(sqlite)}


async def first_delivery(db: AsyncSession, event_id: str, *, now: datetime) -> bool:
    """Record the event id; False when it was already recorded (a retry or a replica's twin)."""
    statement = FIRST[db.get_bind().dialect.name]
    result = await db.execute(statement, {"event": event_id, "now": now})
    return result.rowcount == 1  # type: ignore[attr-defined,no-any-return]


async def forget_before(db: AsyncSession, cutoff: datetime) -> None:
    """Slack retries for minutes, not days: old ids can go."""
    await db.execute(delete(SeenEvent).where(SeenEvent.received_at < cutoff))
