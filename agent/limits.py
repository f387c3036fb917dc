"""Fair use: how many messages a person, and a whole workspace, may send per minute.

Counted in the database (storage/message_counts.py), so the limits hold however many
replicas share the work. A message over a limit runs nothing; its sender is told once a
minute, and the rest of that minute's refused messages pass in silence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from storage.db import SessionFactory
from storage.message_counts import MessageCounts

KEPT = timedelta(minutes=2)  # counters of the current and the previous minute


@dataclass(frozen=True)
class Admission:
    """Whether a message may run; if not, whose limit it is over and whether to say so."""

    run: bool
    over: Literal["user", "team"] | None = None
    tell: bool = False


RUN = Admission(run=True)
RETRIED = Admission(run=False)  # Slack's retry of an event already handled


class MessageLimits:
    def __init__(
        self,
        sessions: SessionFactory,
        *,
        clock: Callable[[], datetime],
        per_user: int,
        per_team: int,
        events: SessionFactory | None = None,
    ) -> None:
        """`sessions` for the counters; `events` (default: the same) for Slack's event ids,
        recorded with a count (storage/message_counts.py)."""
        self._counts = MessageCounts(sessions, events=events)
        self._clock = clock
        self._per_user = per_user
        self._per_team = per_team

    async def admit(self, team: str, user: str, *, event_id: str | None = None) -> Admission:
        """Count one message (one statement); a second one only for a refused message.
        `event_id`: the Slack event that brought it, recorded in that same statement; a
        retried delivery of it is not counted again, and runs nothing, in silence."""
        now = self._clock()
        minute = now.replace(second=0, microsecond=0)
        if event_id is None:
            team_count = await self._counts.count(
                team, user, minute=minute, per_user=self._per_user
            )
        else:
            first, team_count = await self._counts.count_event(
                team, user, event_id, now=now, per_user=self._per_user
            )
            if not first:
                return RETRIED
        if team_count is not None and team_count <= self._per_team:
            return RUN
        over: Literal["user", "team"] = "user" if team_count is None else "team"
        tell = await self._counts.first_refusal(team, user, minute=minute)
        return Admission(run=False, over=over, tell=tell)

    async def sweep(self) -> None:
        """Drop the counters of minutes that are over."""
        await self._counts.forget(before=self._clock() - KEPT)
