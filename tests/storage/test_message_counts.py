"""The per-minute message counters: one statement per message, exact under concurrency."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from storage.db import make_session_factory
from storage.message_counts import MessageCounts
from storage.models import MessageCountRow

MINUTE = datetime(2030, 1, 2, 3, 4, tzinfo=UTC)


async def test_a_person_over_their_limit_uses_up_none_of_the_workspace(
    pg_engine: AsyncEngine, team: str
) -> None:
    counts = MessageCounts(make_session_factory(pg_engine))
    seen = [await counts.count(team, "UA", minute=MINUTE, per_user=2) for _ in range(4)]
    assert seen == [1, 2, None, None]  # the workspace's count, while the person is within
    assert await counts.count(team, "UB", minute=MINUTE, per_user=2) == 3
    # A new minute starts over.
    later = MINUTE + timedelta(minutes=1)
    assert await counts.count(team, "UA", minute=later, per_user=2) == 1


async def test_each_person_is_told_once_a_minute(pg_engine: AsyncEngine, team: str) -> None:
    counts = MessageCounts(make_session_factory(pg_engine))
    await counts.count(team, "UA", minute=MINUTE, per_user=1)
    told = [await counts.first_refusal(team, "UA", minute=MINUTE) for _ in range(3)]
    assert told == [True, False, False]
    await counts.count(team, "UB", minute=MINUTE, per_user=1)
    assert await counts.first_refusal(team, "UB", minute=MINUTE)


async def test_concurrent_messages_are_counted_exactly_and_old_minutes_are_forgotten(
    pg_engine: AsyncEngine, team: str
) -> None:
    sessions = make_session_factory(pg_engine)
    counts = MessageCounts(sessions)
    seen = await asyncio.gather(
        *(counts.count(team, "UA", minute=MINUTE, per_user=10) for _ in range(30))
    )
    # Exactly the person's first 10 reach the workspace's counter, racing as they may.
    assert sorted(c for c in seen if c is not None) == list(range(1, 11))
    assert seen.count(None) == 20
    await counts.count(team, "UA", minute=MINUTE + timedelta(minutes=1), per_user=10)

    await counts.forget(before=MINUTE + timedelta(minutes=1))
    async with sessions() as db:
        query = select(MessageCountRow.minute).where(MessageCountRow.team_id == team)
        left = set((await db.scalars(query)).all())
        assert left == {MINUTE + timedelta(minutes=1)}
        total = select(func.sum(MessageCountRow.count)).where(MessageCountRow.team_id == team)
        assert await db.scalar(total) == 2  # the person's and the workspace's, one each


async def test_an_event_is_counted_on_its_first_delivery_only(
    pg_engine: AsyncEngine, team: str
) -> None:
    """Slack's retries of one event, racing: exactly one is its first delivery, and only
    that one counts; a retry after the person went over is a retry still."""
    counts = MessageCounts(make_session_factory(pg_engine))
    event = f"Ev{team}"
    got = await asyncio.gather(
        *(counts.count_event(team, "UA", event, now=MINUTE, per_user=1) for _ in range(5))
    )
    assert sorted(got, key=str) == [(False, None)] * 4 + [(True, 1)]
    assert await counts.count_event(team, "UA", f"{event}2", now=MINUTE, per_user=1) == (
        True,
        None,  # over their limit: recorded, counted for the person, not for the workspace
    )
    assert await counts.count_event(team, "UA", f"{event}2", now=MINUTE, per_user=1) == (
        False,
        None,
    )
    assert await counts.count(team, "UB", minute=MINUTE, per_user=1) == 2
