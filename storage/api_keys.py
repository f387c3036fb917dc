"""API keys: stored as their SHA-256 only, per workspace and owner; created, listed, revoked,
and looked up by the token a caller presents.

A key is a random token of 256 bits, so a plain SHA-256 is as good as a slow hash here: no
dictionary reaches it. The last-used time is written at most once a minute per key, so an
agent calling often costs one lookup per call, not a write.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from storage.db import SessionFactory, autocommit
from storage.models import ApiKeyRow

K = cast(sa.Table, ApiKeyRow.__table__)
TOUCH_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class ApiKey:
    """A key as Greenlight knows it (never the token itself)."""

    id: str
    team_id: str
    user_id: str
    name: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    callback_secret: str = ""


class NameTaken(ValueError):
    """The owner already has a live key of this name."""


def _key(row: sa.Row[object]) -> ApiKey:
    m = row._mapping
    return ApiKey(
        id=m["id"],
        team_id=m["team_id"],
        user_id=m["user_id"],
        name=m["name"],
        created_at=m["created_at"],
        last_used_at=m["last_used_at"],
        revoked_at=m["revoked_at"],
        callback_secret=m["callback_secret"],
    )


LIVE = K.c.revoked_at.is_(None)
FIND = sa.select(K).where(K.c.digest == sa.bindparam("digest"), LIVE)
TOUCH = (
    sa.update(K)
    .where(
        K.c.id == sa.bindparam("key_id"),
        sa.or_(K.c.last_used_at.is_(None), K.c.last_used_at < sa.bindparam("stale")),
    )
    .values(last_used_at=sa.bindparam("now"))
)


class ApiKeyStore:
    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    async def create(
        self,
        *,
        id: str,
        team_id: str,
        user_id: str,
        name: str,
        digest: str,
        callback_secret: str,
        now: datetime,
    ) -> ApiKey:
        """A new live key; NameTaken when its owner has a live one of that name."""
        row = {
            "id": id,
            "team_id": team_id,
            "user_id": user_id,
            "name": name,
            "digest": digest,
            "callback_secret": callback_secret,
            "created_at": now,
            "last_used_at": None,
            "revoked_at": None,
        }
        try:
            async with autocommit(self._sessions) as db:
                await db.execute(sa.insert(K).values(row))
        except IntegrityError:
            raise NameTaken(name) from None
        return ApiKey(id, team_id, user_id, name, now, None, None, callback_secret)

    async def find(self, digest: str, *, now: datetime) -> ApiKey | None:
        """The live key with this digest, its use noted (at most once a minute)."""
        async with autocommit(self._sessions) as db:
            row = (await db.execute(FIND, {"digest": digest})).first()
            if row is None:
                return None
            key = _key(row)
            if key.last_used_at is None or key.last_used_at < now - TOUCH_EVERY:
                params = {"key_id": key.id, "stale": now - TOUCH_EVERY, "now": now}
                await db.execute(TOUCH, params)
        return key

    async def live(self, team_id: str, user_id: str | None = None) -> list[ApiKey]:
        """The live keys of one owner (None: of everyone in the workspace), by owner, name."""
        query = sa.select(K).where(K.c.team_id == team_id, LIVE)
        if user_id is not None:
            query = query.where(K.c.user_id == user_id)
        async with autocommit(self._sessions) as db:
            rows = await db.execute(query.order_by(K.c.user_id, K.c.name))
        return [_key(r) for r in rows]

    async def revoke(self, team_id: str, user_id: str, name: str, *, now: datetime) -> bool:
        """Revoke the owner's live key of this name; False when there is none."""
        stmt = (
            sa.update(K)
            .where(K.c.team_id == team_id, K.c.user_id == user_id, K.c.name == name, LIVE)
            .values(revoked_at=now)
        )
        async with autocommit(self._sessions) as db:
            done = await db.execute(stmt)
        return int(cast(sa.CursorResult[object], done).rowcount) > 0
