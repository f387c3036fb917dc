"""Who may decide a request now: its tool's policy for the version it shows, and the trust rules.

A request's policy is read for its current version (rules, quorum, route, approvers and
escalation read that version's input, and where each value came from: what an approver
typed, from a human), then agent/policy.py `refusal` says whether this person may decide.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agent.context import as_provenance
from agent.outcomes import DecisionRefused
from agent.policy import ApproverFacts, Policy, refusal
from storage.domain import Approval

# What the transport knows about the person, or how to look it up once the request and its
# policy are known (then people are looked up only for a request that exists).
Facts = ApproverFacts | Callable[[Approval, Policy], Awaitable[ApproverFacts]]


def for_version(base: Policy, approval: Approval) -> Policy:
    """The tool's policy (`base`) for the request's current version."""
    v = approval.current
    args = v.actual  # rules read the values, redacted or not
    return base.for_call(args, approval.request.requester, as_provenance(args, v.sources))


async def check_eligible(policy: Policy, approval: Approval, person: str, facts: Facts) -> None:
    """DecisionRefused unless `person` may decide this request under `policy` (its tool's,
    for the version in question)."""
    r = approval.request
    if callable(facts):
        facts = await facts(approval, policy)
    why = refusal(
        policy,
        requester=r.requester,
        participants=r.participants,
        approver=person,
        facts=facts,
        escalated=approval.escalated,
    )
    if why is not None:
        raise DecisionRefused(why, approval)
