"""Per-tool policy rows: read at every tool call, changed by admins (with their audit row).

A row keeps a `StoredPolicy` (storage/policy_spec.py) in its columns: approvers split into
users and groups, durations in seconds, rules as JSON. `stored_policy` and `_columns` are
the one mapping between the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from storage import audit
from storage.db import SessionFactory, autocommit
from storage.domain import HISTORY_ENDS, History
from storage.driver import prepared
from storage.models import ApprovalRow, PolicyRow
from storage.policy_spec import CHANGEABLE, Rule, StoredPolicy, split_principals

_P = cast(sa.Table, PolicyRow.__table__)
_TEAM = _P.c.team_id == sa.bindparam("team_id")
# Read at every tool call: a prebuilt Core query, not the ORM's identity-map get.
GET = prepared(sa.select(_P).where(_TEAM, _P.c.tool == sa.bindparam("tool")))
ALL = sa.select(_P).where(_TEAM)
# With a call's policy, how the requester's earlier requests of the tool ended (its card
# shows them), in the same statement; not counted where the stored row lets calls run freely.
_A = cast(sa.Table, ApprovalRow.__table__)
_earlier = (
    sa.select(postgresql.array([sa.func.count().filter(_A.c.status == s) for s in HISTORY_ENDS]))
    .where(
        _A.c.team_id == sa.bindparam("team_id"),
        _A.c.requester == sa.bindparam("requester"),
        _A.c.tool == sa.bindparam("tool"),
        _A.c.requested_at >= sa.bindparam("since", type_=_A.c.requested_at.type),
    )
    .scalar_subquery()
)
_one = sa.select(sa.literal(1).label("one")).subquery()  # a row, whether the policy's is there
WITH_HISTORY = prepared(
    sa.select(
        *_P.c, sa.case((_P.c.allowed.is_not(True), _earlier), else_=sa.null()).label("history")
    ).select_from(_one.outerjoin(_P, sa.and_(_TEAM, _P.c.tool == sa.bindparam("tool"))))
)
# The row's columns a StoredPolicy is read from.
POLICY_FIELDS = (
    "tool",
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
    "note",
    "standing_seconds",
    "redact",
)
_SECONDS = {
    "timeout": "timeout_seconds",
    "remind_after": "remind_after_seconds",
    "escalate_after": "escalate_after_seconds",
    "standing": "standing_seconds",
}


def stored_policy(row: Mapping[Any, Any]) -> StoredPolicy:
    """A policy row's POLICY_FIELDS as the value (not checked again: storage wrote it)."""
    return StoredPolicy.model_construct(
        tool=row["tool"],
        allowed=row["allowed"],
        channel=row["channel"],
        approvers=(*row["approver_users"], *row["approver_groups"]),
        approvals=row["approvals"],
        timeout=_delta(row["timeout_seconds"]),
        rules=tuple(_rule(r) for r in row["rules"] or ()),
        remind_after=_delta(row["remind_after_seconds"]),
        escalate_after=_delta(row["escalate_after_seconds"]),
        escalate_to=row["escalate_to"],
        escalate_approvers=tuple(row["escalate_approvers"] or ()),
        note=row["note"],
        standing=_delta(row["standing_seconds"]),
        redact=tuple(row["redact"] or ()),
    )


def _columns(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A StoredPolicy's changed fields as the row's columns (JSON-ready)."""
    columns: dict[str, Any] = {}
    for field, value in changes.items():
        if field == "approvers":
            users, groups = split_principals(value)
            columns |= {"approver_users": list(users), "approver_groups": list(groups)}
        elif field in _SECONDS:
            columns[_SECONDS[field]] = None if value is None else int(value.total_seconds())
        elif field == "rules":
            columns["rules"] = [_rule_json(r) for r in value]
        else:
            columns[field] = list(value) if isinstance(value, tuple) else value
    return columns


def _rule_json(rule: Rule) -> dict[str, Any]:
    """A rule as a row keeps it: its fields, the timeout in seconds."""
    kept = rule.model_dump(mode="json", exclude_none=True, exclude={"timeout"})
    if rule.timeout is not None:
        kept["timeout_seconds"] = int(rule.timeout.total_seconds())
    return kept


def _rule(kept: Mapping[str, Any]) -> Rule:
    fields = {k: v for k, v in kept.items() if k != "timeout_seconds"}
    if (seconds := kept.get("timeout_seconds")) is not None:
        fields["timeout"] = timedelta(seconds=seconds)
    return Rule.model_validate(fields)


def _delta(seconds: int | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


class PolicyStore:
    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    async def get(self, team_id: str, tool: str) -> StoredPolicy | None:
        async with autocommit(self._sessions) as db:
            row = (await db.execute(GET, {"team_id": team_id, "tool": tool})).first()
        return None if row is None else stored_policy(row._mapping)

    async def with_history(
        self, team_id: str, tool: str, requester: str, *, since: datetime, days: int
    ) -> tuple[StoredPolicy | None, History | None]:
        """`get`, and how `requester`'s requests of `tool` since `since` ended (None where
        the stored row lets calls run freely: no card will show it), in one statement."""
        params = {"team_id": team_id, "tool": tool, "requester": requester, "since": since}
        async with autocommit(self._sessions) as db:
            row = (await db.execute(WITH_HISTORY, params)).one()
        policy = None if row.tool is None else stored_policy(row._mapping)
        if row.history is None:
            return policy, None
        approved, denied, expired = row.history  # in HISTORY_ENDS' order
        return policy, History(approved, denied, expired, days=days)

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
        time (allowed or not as the tool's default is), and audit them (as the row's
        columns): one transaction."""
        if unknown := set(changes) - set(CHANGEABLE):
            raise ValueError(f"not policy fields: {sorted(unknown)}")
        columns = _columns(changes)
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
            for key, value in columns.items():
                setattr(row, key, value)
            row.updated_at = now
            row.updated_by = by
            event = audit.entry(
                team_id=team_id,
                at=now,
                actor=by,
                action="policy_changed",
                tool=tool,
                changes=columns,
            )
            await db.execute(audit.INSERT, event)
            return stored_policy({f: getattr(row, f) for f in POLICY_FIELDS})
