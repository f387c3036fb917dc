"""Per-minute message counters, shared by every replica through the database.

Counting a message adds one to the person's counter and, while the person is within their
own limit, to the workspace's: one statement (the person's upsert in a CTE). A person over
their limit so uses up none of the workspace's messages, and each count is exact however
many replicas count at once. A Slack message is counted in the statement that records its
event id (`count_event`): only its first delivery counts, and a retry is known as one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from storage.db import SessionFactory, autocommit
from storage.driver import prepared
from storage.models import MessageCountRow, SeenEventRow

M = cast(sa.Table, MessageCountRow.__table__)
WORKSPACE = ""  # the user_id of a workspace's own counter
_AT = sa.bindparam("at_minute", type_=M.c.minute.type)
_TEAM = sa.bindparam("team", type_=M.c.team_id.type)
_LIMIT = sa.bindparam("limit", type_=sa.Integer())
_KEY = [M.c.team_id, M.c.user_id, M.c.minute]
_ADD_ONE = {"count": M.c.count + 1}


_E = cast(sa.Table, SeenEventRow.__table__)


def _delivered() -> sa.CTE:
    """Record a Slack event's id: a row on its first delivery, none on a retry's."""
    row = {"event_id": sa.bindparam("event", type_=_E.c.event_id.type)}
    stmt = postgresql.insert(_E).values(row | {"received_at": sa.bindparam("now")})
    first = stmt.on_conflict_do_nothing(index_elements=[_E.c.event_id])
    return first.returning(_E.c.event_id).cte("delivered")


def _person(after: sa.CTE | None = None) -> sa.CTE:
    """Add one to the person's counter (only if `after` has a row); returns it."""
    row = {"team_id": _TEAM, "user_id": sa.bindparam("user", type_=M.c.user_id.type), "minute": _AT}
    if after is None:
        stmt = postgresql.insert(M).values(row | {"count": 1, "told": False})
    else:
        values = sa.select(*row.values(), sa.literal(1), sa.false()).select_from(after)
        stmt = postgresql.insert(M).from_select([*row, "count", "told"], values)
    upsert = stmt.on_conflict_do_update(index_elements=_KEY, set_=_ADD_ONE)
    return upsert.returning(M.c.count).cte("person")


def _workspace(person: sa.CTE) -> sa.Insert:
    """Add one to the workspace's counter if `person` (their new count) is within the limit;
    returns it (no row when the person is over)."""
    values = sa.select(_TEAM, sa.literal(WORKSPACE), _AT, sa.literal(1), sa.false())
    values = values.select_from(person).where(person.c.count <= _LIMIT)
    stmt = postgresql.insert(M).from_select(
        ["team_id", "user_id", "minute", "count", "told"], values
    )
    return stmt.on_conflict_do_update(index_elements=_KEY, set_=_ADD_ONE).returning(M.c.count)


COUNT = prepared(_workspace(_person()))
# The event recorded and, on its first delivery, the message counted: whether it was the
# first, and the workspace's count (None: the person is over, or it was not the first).
_first = _delivered()
_counted = _workspace(_person(_first)).cte("workspace")
COUNT_EVENT = prepared(
    sa.select(
        sa.select(sa.func.count()).select_from(_first).scalar_subquery().label("first"),
        sa.select(_counted.c.count).scalar_subquery().label("team_count"),
    )
)
# The first refusal of a person in a minute, once (across replicas): whoever sets it tells.
TELL = prepared(
    sa.update(M)
    .where(
        M.c.team_id == sa.bindparam("team"),
        M.c.user_id == sa.bindparam("user"),
        M.c.minute == _AT,
        ~M.c.told,
    )
    .values(told=True)
)
FORGET = prepared(sa.delete(M).where(M.c.minute < sa.bindparam("before", type_=M.c.minute.type)))


class MessageCounts:
    def __init__(self, sessions: SessionFactory, *, events: SessionFactory | None = None) -> None:
        """`events`: where Slack's event ids are recorded, if not `sessions` (whose commits
        may skip the disk: a count is not worth an fsync, a first delivery is)."""
        self._sessions = sessions
        self._events = events or sessions

    async def count(self, team: str, user: str, *, minute: datetime, per_user: int) -> int | None:
        """Count one message of `user` in `team` in `minute`: the workspace's count with it,
        or None when the person is over `per_user` (the workspace's count unchanged)."""
        params = {"team": team, "user": user, "at_minute": minute, "limit": per_user}
        async with autocommit(self._sessions) as db:
            return cast(int | None, await db.scalar(COUNT, params))

    async def count_event(
        self, team: str, user: str, event_id: str, *, now: datetime, per_user: int
    ) -> tuple[bool, int | None]:
        """Record Slack event `event_id` and, on its first delivery, count its message as
        `count` does, in one statement: whether this was its first delivery, and the
        workspace's count (None when the person is over, or it was not the first)."""
        minute = now.replace(second=0, microsecond=0)
        params = {"team": team, "user": user, "at_minute": minute, "limit": per_user}
        async with autocommit(self._events) as db:
            row = (await db.execute(COUNT_EVENT, params | {"event": event_id, "now": now})).one()
        return bool(row.first), row.team_count

    async def first_refusal(self, team: str, user: str, *, minute: datetime) -> bool:
        """Whether this is the person's first refused message in `minute` (to be told)."""
        params = {"team": team, "user": user, "at_minute": minute}
        async with autocommit(self._sessions) as db:
            done = await db.execute(TELL, params)
        return cast(sa.CursorResult[Any], done).rowcount == 1

    async def forget(self, *, before: datetime) -> None:
        """Drop the counters of minutes before `before`."""
        async with autocommit(self._sessions) as db:
            await db.execute(FORGET, {"before": before})
