"""Standing approvals: a later call covered without a card, and a grant revoked by those who may.

A grant is made by an approver's Approve for <duration> (agent/decisions.py, `standing=True`).
While it is live, a call of the same tool, by the same requester, in the same conversation,
that the same rule matches (agent/policy.py `Policy.rule_key`), is approved by it as the
call is made: its own approval row, counted on the grant's card (storage/standing.py USE),
then run behind the execution gate like any approved call. A grant covers nothing once
its approver is a participant of the turn (their words reached the model), once the policy
no longer offers it (a quorum, a note required, `standing` removed), or once it is revoked
or over (by the injected clock).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from agent.eligibility import Facts, check_eligible, for_version
from agent.outcomes import DecisionRefused
from agent.policy import Policy, PolicyService
from agent.scope import TurnScope
from storage.approval_store import ApprovalStore
from storage.domain import Approval, Approved, Request
from storage.lifecycle import IllegalTransition
from storage.standing import Call


@dataclass(frozen=True)
class StandingApprovals:
    """Covers calls with live standing approvals; revokes them."""

    store: ApprovalStore
    policies: PolicyService
    clock: Callable[[], datetime]
    new_id: Callable[[], str]

    async def cover(
        self, scope: TurnScope, ref: str | None, args: Any, raw: Any, policy: Policy
    ) -> Approval | None:
        """The call's own approval, approved by a live standing approval that covers it
        (which counts it), or None: the call needs a card. Asks the database only for a
        tool whose policy offers standing approvals for this call."""
        if policy.standing_offer is None or not ref or scope.conversation_id is None:
            return None
        if scope.thread is None:
            return None
        call = Call(
            policy.tool,
            scope.requester,
            policy.rule_key,
            scope.conversation_id,
            scope.thread,
            scope.participants,
        )
        now = self.clock()
        grant = await self.store.standing.matching(call, now=now)
        if grant is None or not isinstance(grant.decision, Approved):
            return None
        given = args if isinstance(args, dict) else {"value": raw}
        exact = json.dumps(given, sort_keys=True) == json.dumps(raw, sort_keys=True)
        request = Request(
            tool=policy.tool,
            ref=ref,
            input=given,
            asked=None if exact else raw,
            requester=scope.requester,
            why=f"{policy.why}; approved by the standing approval of request {grant.id}",
            requested_at=now,
            expires_at=now,
            participants=scope.participants,
            redact=policy.redact,
        )
        covered = Approval(self.new_id(), self.new_id(), scope.thread, request, under=grant.id)
        if (used := await self.store.standing.use(grant, covered, call, now=now)) is None:
            return None  # revoked, or run out, since it was read: the call gets a card
        scope.covered_by[used.id] = used
        return replace(covered, decision=Approved(grant.decision.by, now))

    async def revoke(
        self,
        team_id: str,
        approval_id: str,
        person: str,
        *,
        facts: Facts,
        is_admin: Callable[[], Awaitable[bool]],
    ) -> Approval:
        """End a live standing approval now (REVOKE), if `person` may: its approver, anyone
        who may decide the request under its tool's policy now (not its requester nor a
        participant), or a workspace admin (`is_admin`, asked last). DecisionRefused,
        nothing changed, otherwise, or when it is not live."""
        found = await self.store.decisions.decidable(team_id, approval_id)
        if found is None:
            raise DecisionRefused("not_found")
        grant, stored = found
        if grant.standing is None or not grant.standing.live(self.clock()):
            raise DecisionRefused("standing_over", grant)
        if not (isinstance(grant.decision, Approved) and grant.decision.by == person):
            policy = for_version(self.policies.of(grant.request.tool, stored), grant)
            try:
                await check_eligible(policy, grant, person, facts)
            except DecisionRefused:
                if not await is_admin():
                    raise
        try:
            return await self.store.standing.revoke(grant, by=person, now=self.clock())
        except IllegalTransition as refused:  # revoked, or over, since it was read
            raise DecisionRefused("standing_over", refused.current or grant) from None
