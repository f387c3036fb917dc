"""The people directory: what Slack last said of each person, shared by every replica.

One row a person and workspace, replaced whenever Slack says something newer of them (a
users.list page, a user_change or team_join event, a users.info answer). An older word never
overwrites a newer one: a sync's page read before an event cannot undo what the event said.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from storage.db import SessionFactory, autocommit
from storage.driver import prepared
from storage.models import PersonRow

P = cast(sa.Table, PersonRow.__table__)

FIND = prepared(
    sa.select(P.c.facts).where(
        P.c.team_id == sa.bindparam("team", type_=P.c.team_id.type),
        P.c.user_id == sa.bindparam("user", type_=P.c.user_id.type),
        P.c.checked_at >= sa.bindparam("since", type_=P.c.checked_at.type),
    )
)


class PeopleStore:
    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    async def fresh(self, team: str, user: str, *, since: datetime) -> dict[str, Any] | None:
        """What Slack said of `user` to `team`, if it said it at `since` or later."""
        async with autocommit(self._sessions) as db:
            return cast(
                dict[str, Any] | None,
                await db.scalar(FIND, {"team": team, "user": user, "since": since}),
            )

    async def record(self, team: str, people: Mapping[str, dict[str, Any]], at: datetime) -> None:
        """Keep what Slack said at `at` of each of `people` (user id: facts) to `team`, but
        of a person it said something of later: one statement."""
        if not people:
            return
        rows = [
            {"team_id": team, "user_id": user, "facts": facts, "checked_at": at}
            for user, facts in people.items()
        ]
        insert = postgresql.insert(P).values(rows)
        newer = {"facts": insert.excluded.facts, "checked_at": insert.excluded.checked_at}
        stmt = insert.on_conflict_do_update(
            index_elements=[P.c.team_id, P.c.user_id],
            set_=newer,
            where=P.c.checked_at <= insert.excluded.checked_at,
        )
        async with autocommit(self._sessions) as db:
            await db.execute(stmt)
