"""Per-tool policy rows: read at every tool call, changed by admins (with their audit row)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa

from storage import audit
from storage.db import SessionFactory, autocommit
from storage.models import PolicyRow

_P = cast(sa.Table, PolicyRow.__table__)
_TEAM = _P.c.team_id == sa.bindparam("team_id")
# Read at every tool call: a prebuilt Core query, not the ORM's identity-map get.
GET = sa.select(_P).where(_TEAM, _P.c.tool == sa.bindparam("tool"))
ALL = sa.select(_P).where(_TEAM)
CHANGEABLE = (
    "allowed",
    "channel",
    "approver_users",
    "approver_groups",
    "timeout_seconds",
    "approvals",
    "rules",
    "remind_after_seconds",
    "escalate_after_seconds",
    "escalate_to",
    "escalate_approvers",
)
POLICY_FIELDS = ("tool", *CHANGEABLE)


@dataclass(frozen=True)
class StoredPolicy:
    """What an admin set for one tool; None and () mean "the configured default"."""

    tool: str
    allowed: bool = False
    channel: str | None = None
    approver_users: tuple[str, ...] = ()
    approver_groups: tuple[str, ...] = ()
    timeout_seconds: int | None = None
    approvals: int | None = None
    rules: tuple[dict[str, Any], ...] = ()  # as POLICY_FILE writes them (agent/policy.py)
    remind_after_seconds: int | None = None
    escalate_after_seconds: int | None = None
    escalate_to: str | None = None
    escalate_approvers: tuple[str, ...] = ()


def stored_policy(row: Mapping[Any, Any]) -> StoredPolicy:
    """A policy row's POLICY_FIELDS as the value."""
    return StoredPolicy(
        tool=row["tool"],
        allowed=row["allowed"],
        channel=row["channel"],
        approver_users=tuple(row["approver_users"]),
        approver_groups=tuple(row["approver_groups"]),
        timeout_seconds=row["timeout_seconds"],
        approvals=row["approvals"],
        rules=tuple(row["rules"] or ()),
        remind_after_seconds=row["remind_after_seconds"],
        escalate_after_seconds=row["escalate_after_seconds"],
        escalate_to=row["escalate_to"],
        escalate_approvers=tuple(row["escalate_approvers"] or ()),
    )


class PolicyStore:
    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    async def get(self, team_id: str, tool: str) -> StoredPolicy | None:
        async with autocommit(self._sessions) as db:
            row = (await db.execute(GET, {"team_id": team_id, "tool": tool})).first()
        return None if row is None else stored_policy(row._mapping)

    async def all(self, team_id: str) -> list[StoredPolicy]:
        async with autocommit(self._sessions) as db:
            return [
                stored_policy(row._mapping) for row in await db.execute(ALL, {"team_id": team_id})
            ]

    async def change(
        self,
        team_id: str,
        tool: str,
        *,
        by: str,
        now: datetime,
        changes: Mapping[str, Any],
        allowed_when_new: bool = False,
    ) -> StoredPolicy:
        """Apply `changes` (fields of CHANGEABLE) to the tool's row, creating it the first
        time (allowed or not as the tool's default is), and audit them: one transaction."""
        if unknown := set(changes) - set(CHANGEABLE):
            raise ValueError(f"not policy fields: {sorted(unknown)}")
        async with self._sessions.begin() as db:
            row = await db.get(PolicyRow, (team_id, tool), with_for_update=True)
            if row is None:
                row = PolicyRow(
                    team_id=team_id,
                    tool=tool,
                    allowed=allowed_when_new,
                    approver_users=[],
                    approver_groups=[],
                    rules=[],
                    escalate_approvers=[],
                )
                db.add(row)
            for key, value in changes.items():
                setattr(row, key, list(value) if isinstance(value, tuple) else value)
            row.updated_at = now
            row.updated_by = by
            event = audit.entry(
                team_id=team_id,
                at=now,
                actor=by,
                action="policy_changed",
                tool=tool,
                changes={k: list(v) if isinstance(v, tuple) else v for k, v in changes.items()},
            )
            await db.execute(audit.INSERT, event)
            return stored_policy({f: getattr(row, f) for f in POLICY_FIELDS})
