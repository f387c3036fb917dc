"""Tool policy: which tools run freely, where approvals go, who may decide, how long they wait.

The rules live here; storage keeps the rows and the Slack layer supplies facts about people.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from storage import audit, policies
from storage.db import SessionFactory, autocommit
from storage.models import ToolPolicy


class UnknownTool(ValueError):
    """A policy command named a tool the agent does not have."""

    def __init__(self, tool: str, known: Collection[str]) -> None:
        super().__init__(f"unknown tool {tool!r}; known tools: {', '.join(sorted(known))}")
        self.tool = tool
        self.known = sorted(known)


@dataclass(frozen=True)
class PolicyDefaults:
    """Configuration-level defaults for tools an admin has not configured."""

    channel: str | None = None
    timeout: timedelta = timedelta(hours=24)


@dataclass(frozen=True)
class Policy:
    tool: str
    allowed: bool
    channel: str | None
    approver_users: tuple[str, ...] = ()
    approver_groups: tuple[str, ...] = ()
    timeout: timedelta = timedelta(hours=24)

    @property
    def why(self) -> str:
        """Why a call of this tool needs a human, shown on the card."""
        if self.approver_users or self.approver_groups:
            return f"{self.tool} is not on the allow-list; its policy names its approvers"
        return f"{self.tool} is not on the allow-list (default policy: every tool needs approval)"


@dataclass(frozen=True)
class ApproverFacts:
    """What the transport knows about the person deciding.

    `groups` are the user groups (among those the policy names) the person belongs to;
    `in_channel` says the decision was made in the tool's approver channel.
    """

    groups: frozenset[str] = field(default_factory=frozenset)
    in_channel: bool = False


def refusal(
    policy: Policy, *, requester: str, approver: str, facts: ApproverFacts
) -> Literal["self_approval", "not_an_approver"] | None:
    """Why `approver` may not decide (None when they may)."""
    if approver == requester:
        return "self_approval"
    if policy.approver_users or policy.approver_groups:
        if approver in policy.approver_users or facts.groups & set(policy.approver_groups):
            return None
        return "not_an_approver"
    return None if facts.in_channel else "not_an_approver"


def _from_row(tool: str, row: ToolPolicy | None, defaults: PolicyDefaults) -> Policy:
    if row is None:
        return Policy(tool=tool, allowed=False, channel=defaults.channel, timeout=defaults.timeout)
    return Policy(
        tool=tool,
        allowed=row.allowed,
        channel=row.channel or defaults.channel,
        approver_users=tuple(row.approver_users),
        approver_groups=tuple(row.approver_groups),
        timeout=timedelta(seconds=row.timeout_seconds) if row.timeout_seconds else defaults.timeout,
    )


class PolicyService:
    """Reads policy at call time (so changes apply to the next call) and audits every change."""

    def __init__(
        self,
        sessions: SessionFactory,
        *,
        tools: Callable[[], Sequence[str]],
        defaults: PolicyDefaults,
        clock: Callable[[], datetime],
    ) -> None:
        self._sessions = sessions
        self._tools = tools
        self._defaults = defaults
        self._clock = clock

    def known_tools(self) -> list[str]:
        return sorted(self._tools())

    async def get(self, team_id: str, tool: str) -> Policy:
        """The tool's policy as stored now."""
        async with autocommit(self._sessions) as db:
            return self.of(tool, await policies.get_policy(db, team_id, tool))

    def of(self, tool: str, row: ToolPolicy | None) -> Policy:
        """The policy a stored row (read with something else) gives, defaults applied."""
        return _from_row(tool, row, self._defaults)

    async def all(self, team_id: str) -> list[Policy]:
        async with autocommit(self._sessions) as db:
            rows = {row.tool: row for row in await policies.team_policies(db, team_id)}
        return [_from_row(t, rows.get(t), self._defaults) for t in self.known_tools()]

    async def change(self, team_id: str, tool: str, *, by: str, **changes: object) -> Policy:
        """Apply an admin's change; unknown tools are refused before anything is written."""
        if tool not in self._tools():
            raise UnknownTool(tool, self._tools())
        now = self._clock()
        async with self._sessions.begin() as db:
            row = await policies.update_policy(db, team_id, tool, by=by, now=now, **changes)
            await audit.record(
                db,
                audit.entry(
                    team_id=team_id,
                    at=now,
                    actor=by,
                    action="policy_changed",
                    tool=tool,
                    changes={k: _jsonable(v) for k, v in changes.items()},
                ),
            )
            return _from_row(tool, row, self._defaults)


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple | list | set | frozenset) else value
