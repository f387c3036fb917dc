"""The people directory: what Slack last said of each person, shared by every replica.

One row a person and workspace, replaced whenever Slack says something newer of them (a
users.list page, a user_change or team_join event, a users.info answer). An older word never
overwrites a newer one: a sync's page read before an event cannot undo what the event said.
One replica syncs a workspace when its sync is due (`claim_sync`), for all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from storage.db import SessionFactory, autocommit
from storage.driver import prepared
from storage.models import PeopleSyncRow, PersonRow

P = cast(sa.Table, PersonRow.__table__)
SYNCS = cast(sa.Table, PeopleSyncRow.__table__)
_TEAM = sa.bindparam("team", type_=SYNCS.c.team_id.type)
_due = postgresql.insert(SYNCS).values(team_id=_TEAM, due_at=sa.bindparam("next"))
# The workspace's sync, claimed by whoever asks first once it is due: the next one set due.
# A due time further off than the asker's next (PEOPLE_SYNC_MINUTES lowered) is due now.
CLAIM_SYNC = prepared(
    _due.on_conflict_do_update(
        index_elements=[SYNCS.c.team_id],
        set_={"due_at": _due.excluded.due_at},
        where=sa.or_(SYNCS.c.due_at <= sa.bindparam("now"), SYNCS.c.due_at > _due.excluded.due_at),
    ).returning(SYNCS.c.team_id)
)
# A claimed sync that failed: due again at once (unless another claimed it since).
RELEASE_SYNC = prepared(
    sa.update(SYNCS)
    .where(SYNCS.c.team_id == _TEAM, SYNCS.c.due_at == sa.bindparam("next"))
    .values(due_at=sa.bindparam("now"))
)

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

    async def claim_sync(self, team: str, *, now: datetime, next_due: datetime) -> bool:
        """Whether the caller syncs `team` now: the first to ask once it is due does, and
        the next is due at `next_due` (one statement); the others leave it to that one."""
        async with autocommit(self._sessions) as db:
            values = {"team": team, "now": now, "next": next_due}
            return (await db.execute(CLAIM_SYNC, values)).first() is not None

    async def release_sync(self, team: str, *, now: datetime, next_due: datetime) -> None:
        """The sync claimed until `next_due` did not finish: due again at `now`, for the
        next to ask (here or another replica), unless it was claimed again meanwhile."""
        async with autocommit(self._sessions) as db:
            await db.execute(RELEASE_SYNC, {"team": team, "now": now, "next": next_due})

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
