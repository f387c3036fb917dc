"""Tool policy: which tools run freely, where approvals go, who may decide, how long they wait.

The rules live here; storage keeps the rows and the Slack layer supplies facts about people.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from storage.policies import PolicyStore, StoredPolicy


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
    def names_approvers(self) -> bool:
        """Whether the policy names who decides; if not, the approver channel's members do."""
        return bool(self.approver_users or self.approver_groups)

    @property
    def why(self) -> str:
        """Why a call of this tool needs a human, shown on the card."""
        if self.names_approvers:
            return f"{self.tool} is not on the allow-list; its policy names its approvers"
        return f"{self.tool} is not on the allow-list (default policy: every tool needs approval)"


@dataclass(frozen=True)
class ApproverFacts:
    """What the transport knows about the person deciding.

    `groups` are the user groups (among those the policy names) the person belongs to;
    `in_channel` says the decision was made in the tool's approver channel;
    `public_channel` that this channel is one anyone in the workspace may join.
    """

    groups: frozenset[str] = field(default_factory=frozenset)
    in_channel: bool = False
    public_channel: bool = False


Refusal = Literal["self_approval", "participant", "not_an_approver", "public_channel"]


def refusal(
    policy: Policy,
    *,
    requester: str,
    participants: Collection[str] = (),
    approver: str,
    facts: ApproverFacts,
) -> Refusal | None:
    """Why `approver` may not decide (None when they may).

    Four eyes over the whole conversation: neither the requester nor anyone else whose
    message led to the call (`participants`) decides it. Then a policy that names approvers
    (users, user groups) is what decides; one that names nobody leaves it to the members of
    the approver channel, which must be private: anyone can join a public channel.
    """
    if approver == requester:
        return "self_approval"
    if approver in participants:
        return "participant"
    if policy.names_approvers:
        if approver in policy.approver_users or facts.groups & set(policy.approver_groups):
            return None
        return "not_an_approver"
    if facts.public_channel:
        return "public_channel"
    return None if facts.in_channel else "not_an_approver"


def _effective(tool: str, stored: StoredPolicy | None, defaults: PolicyDefaults) -> Policy:
    if stored is None:
        return Policy(tool=tool, allowed=False, channel=defaults.channel, timeout=defaults.timeout)
    timeout = stored.timeout_seconds
    return Policy(
        tool=tool,
        allowed=stored.allowed,
        channel=stored.channel or defaults.channel,
        approver_users=stored.approver_users,
        approver_groups=stored.approver_groups,
        timeout=timedelta(seconds=timeout) if timeout else defaults.timeout,
    )


class PolicyService:
    """Reads policy at call time (so changes apply to the next call); changes are audited."""

    def __init__(
        self,
        store: PolicyStore,
        *,
        tools: Callable[[], Sequence[str]],
        defaults: PolicyDefaults,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._tools = tools
        self._defaults = defaults
        self._clock = clock

    def known_tools(self) -> list[str]:
        return sorted(self._tools())

    async def get(self, team_id: str, tool: str) -> Policy:
        """The tool's policy as stored now, defaults applied."""
        return self.of(tool, await self._store.get(team_id, tool))

    def of(self, tool: str, stored: StoredPolicy | None) -> Policy:
        """The policy a stored row (read with something else) gives, defaults applied."""
        return _effective(tool, stored, self._defaults)

    async def all(self, team_id: str) -> list[Policy]:
        stored = {p.tool: p for p in await self._store.all(team_id)}
        return [_effective(t, stored.get(t), self._defaults) for t in self.known_tools()]

    async def change(self, team_id: str, tool: str, *, by: str, **changes: object) -> Policy:
        """Apply an admin's change; unknown tools are refused before anything is written."""
        if tool not in self._tools():
            raise UnknownTool(tool, self._tools())
        stored = await self._store.change(team_id, tool, by=by, now=self._clock(), changes=changes)
        return _effective(tool, stored, self._defaults)
