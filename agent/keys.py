"""API keys of the gateway: made, checked, listed and revoked, for Slack and the CLI alike.

A key acts as the Slack user who owns it, in one workspace: that person is the requester of
whatever their agents ask through it, so four eyes holds. The token is shown once, when it is
made; Greenlight keeps only its SHA-256 (storage/api_keys.py).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from storage.api_keys import ApiKey as ApiKey, ApiKeyStore, NameTaken as NameTaken
from storage.db import SessionFactory

PREFIX = "glk_"
TOKEN = re.compile(r"^glk_[A-Za-z0-9_-]{20,200}$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class BadName(ValueError):
    """A key name that is not 1-64 letters, digits, `_`, `.` or `-`."""


@dataclass(frozen=True)
class NewKey:
    """A key just made: the token and the callback signing secret, shown this once."""

    key: ApiKey
    token: str
    callback_secret: str


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ApiKeys:
    def __init__(
        self,
        sessions: SessionFactory,
        *,
        clock: Callable[[], datetime],
        new_id: Callable[[], str],
    ) -> None:
        self._store = ApiKeyStore(sessions)
        self._clock = clock
        self._new_id = new_id

    async def create(self, team_id: str, user_id: str, name: str) -> NewKey:
        """A new key for `user_id`; BadName, or NameTaken when they have a live one so named."""
        if not NAME.match(name):
            raise BadName(name)
        token = PREFIX + secrets.token_urlsafe(32)
        secret = "glcs_" + secrets.token_urlsafe(32)
        key = await self._store.create(
            id=self._new_id(),
            team_id=team_id,
            user_id=user_id,
            name=name,
            digest=digest(token),
            callback_secret=secret,
            now=self._clock(),
        )
        return NewKey(key, token, secret)

    async def authenticate(self, token: str | None) -> ApiKey | None:
        """The live key a caller presents, or None (missing, malformed, unknown, revoked)."""
        if not token or not TOKEN.match(token):
            return None
        return await self._store.find(digest(token), now=self._clock())

    async def live(self, team_id: str, user_id: str | None = None) -> list[ApiKey]:
        return await self._store.live(team_id, user_id)

    async def revoke(self, team_id: str, user_id: str, name: str) -> bool:
        return await self._store.revoke(team_id, user_id, name, now=self._clock())
