"""Reads for the transports: inbox, pending, own requests, revocable standing approvals,
audit pages, a request's conversation.

None of them changes a request; a look at the conversation behind one is audited.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from agent.context import Line, conversation_lines
from agent.eligibility import Facts, check_eligible, for_version
from agent.outcomes import DecisionRefused
from agent.policy import PolicyService
from agent.runtime import AgentRuntime
from storage.approval_store import ApprovalStore
from storage.domain import Approval, Approved, AuditEntry
from storage.redaction import scrubbed


@dataclass(frozen=True)
class Reads:
    """Requests as pages and people see them."""

    runtime: AgentRuntime
    store: ApprovalStore
    policies: PolicyService
    clock: Callable[[], datetime]

    async def approval(self, team_id: str, approval_id: str) -> Approval | None:
        return await self.store.reads.get(team_id, approval_id)

    async def pending(
        self, team_id: str, *, limit: int = 20, offset: int = 0
    ) -> tuple[Approval, ...]:
        return await self.store.reads.pending(team_id, limit=limit, offset=offset)

    async def inbox(
        self, team_id: str, person: str, facts: Facts, *, scan: int
    ) -> tuple[Approval, ...]:
        """The open requests `person` may decide (or answer) now, oldest first, among the
        `scan` oldest pending ones of others: not past their deadline, not voted on by them,
        and allowed by the trust rules with `facts` (the click checks again)."""
        may_decide = await self._deciding(team_id, person, facts)
        now, mine = self.clock(), []
        for approval in await self.store.reads.inbox(team_id, person, limit=scan):
            r = approval.request
            if r.asks == "requester" or r.expires_at <= now:
                continue
            if any(v.by == person for v in approval.votes):
                continue
            if await may_decide(approval):
                mine.append(approval)
        return tuple(mine)

    async def revocable(
        self, team_id: str, person: str, facts: Facts, *, scan: int
    ) -> tuple[Approval, ...]:
        """The live standing approvals `person` may revoke, soonest over first, among the
        `scan` soonest over: those they granted, and those of requests they may decide under
        their tool's policy now (agent/standing.py `revoke`, which checks again; an admin who
        is neither revokes from the card)."""
        may_decide = await self._deciding(team_id, person, facts)
        mine = []
        for grant in await self.store.reads.live_grants(team_id, now=self.clock(), limit=scan):
            granted = isinstance(grant.decision, Approved) and grant.decision.by == person
            if granted or await may_decide(grant):
                mine.append(grant)
        return tuple(mine)

    async def _deciding(
        self, team_id: str, person: str, facts: Facts
    ) -> Callable[[Approval], Awaitable[bool]]:
        """Whether `person` may decide a request under its tool's policy now (for its
        current version) and the trust rules with `facts`; the workspace's policies read
        once for all the requests asked about."""
        policies = {p.tool: p for p in await self.policies.all(team_id)}

        async def may_decide(approval: Approval) -> bool:
            tool = approval.request.tool
            policy = policies.get(tool) or self.policies.of(tool, None)
            try:
                await check_eligible(for_version(policy, approval), approval, person, facts)
            except DecisionRefused:
                return False
            return True

        return may_decide

    async def requested_by(self, team_id: str, person: str, *, limit: int) -> tuple[Approval, ...]:
        """`person`'s requests still waiting, or decided with their turn still going."""
        return await self.store.reads.requested_by(team_id, person, limit=limit)

    async def pending_by_tool(self) -> dict[str, int]:
        """Requests waiting for a decision, by tool, in every workspace (for metrics)."""
        return await self.store.reads.pending_by_tool()

    async def audit_trail(
        self, team_id: str, tool: str | None = None, *, limit: int = 20, offset: int = 0
    ) -> list[AuditEntry]:
        return await self.store.reads.audit_trail(team_id, tool=tool, limit=limit, offset=offset)

    async def conversation(
        self, team_id: str, approval_id: str, viewer: str, facts: Facts
    ) -> tuple[Approval, list[Line]]:
        """The conversation that led to a request, as the agent had it when the turn paused,
        for someone who may decide it (before or after it was decided); audited."""
        found = await self.store.decisions.decidable(team_id, approval_id)
        if found is None:
            raise DecisionRefused("not_found")
        approval, stored = found
        policy = for_version(self.policies.of(approval.request.tool, stored), approval)
        await check_eligible(policy, approval, viewer, facts)
        messages = []
        if snapshot_id := await self.store.reads.paused_snapshot(approval):
            snapshot = await self.runtime.sessions.get_snapshot(
                snapshot_id=snapshot_id, context={"team_id": team_id}
            )
            if snapshot is not None and snapshot.state is not None:
                messages = snapshot.state.messages or []
        await self.store.reads.note_viewed(approval, by=viewer, now=self.clock())
        r = approval.request
        return approval, conversation_lines(
            messages, shown=lambda value: scrubbed(value, r.redact, r.secrets)
        )
