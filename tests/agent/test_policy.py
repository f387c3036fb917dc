"""Who may decide: `refusal`, the four-eyes and approver rules, without a database."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.policy import ApproverFacts, Policy, refusal

CHANNEL = Policy(tool="transferMoney", allowed=False, channel="C0APPROVE")
NAMED = Policy(
    tool="transferMoney",
    allowed=False,
    channel="C0APPROVE",
    approver_users=("UCFO",),
    approver_groups=("SFINANCE",),
)
IN_CHANNEL = ApproverFacts(in_channel=True)
IN_FINANCE = ApproverFacts(groups=frozenset({"SFINANCE"}))


@pytest.mark.parametrize(
    ("policy", "approver", "facts", "expected"),
    [
        # The requester never decides their own request, whatever else holds.
        (CHANNEL, "UASK", IN_CHANNEL, "self_approval"),
        (NAMED, "UASK", IN_FINANCE, "self_approval"),
        # Default policy: anyone who clicks in the tool's approver channel, if private.
        (CHANNEL, "UBOSS", IN_CHANNEL, None),
        (CHANNEL, "UBOSS", ApproverFacts(in_channel=True, public_channel=True), "public_channel"),
        (CHANNEL, "UBOSS", ApproverFacts(), "not_an_approver"),
        (CHANNEL, "UBOSS", IN_FINANCE, "not_an_approver"),
        # Named approvers: the users listed and members of the groups listed, anywhere.
        (NAMED, "UCFO", ApproverFacts(), None),
        (NAMED, "UFIN", IN_FINANCE, None),
        (NAMED, "UBOSS", IN_CHANNEL, "not_an_approver"),  # the channel alone is not enough
        (NAMED, "UBOSS", ApproverFacts(groups=frozenset({"SOTHER"})), "not_an_approver"),
    ],
)
def test_refusal(policy: Policy, approver: str, facts: ApproverFacts, expected: str | None) -> None:
    assert refusal(policy, requester="UASK", approver=approver, facts=facts) == expected


@pytest.mark.parametrize("policy", [CHANNEL, NAMED])
def test_nobody_whose_message_led_to_the_call_decides_it(policy: Policy) -> None:
    everyone = ApproverFacts(in_channel=True, groups=frozenset({"SFINANCE"}))
    people = ("UASK", "UPLANTED")
    for approver, expected in (("UASK", "self_approval"), ("UPLANTED", "participant")):
        why = refusal(
            policy, requester="UASK", participants=people, approver=approver, facts=everyone
        )
        assert why == expected
    third = refusal(policy, requester="UASK", participants=people, approver="UCFO", facts=everyone)
    assert third is None


ESCALATING = Policy(
    tool="transferMoney",
    allowed=False,
    channel="C0APPROVE",
    approver_users=("UCFO",),
    escalate_to="C0LEADS",
)


def test_once_escalated_the_escalation_channel_may_decide_too() -> None:
    in_leads = ApproverFacts(in_escalation_channel=True)
    before = refusal(ESCALATING, requester="UASK", approver="ULEAD", facts=in_leads)
    assert before == "not_an_approver"
    after = refusal(ESCALATING, requester="UASK", approver="ULEAD", facts=in_leads, escalated=True)
    assert after is None
    public = ApproverFacts(in_escalation_channel=True, public_escalation_channel=True)
    refused = refusal(ESCALATING, requester="UASK", approver="ULEAD", facts=public, escalated=True)
    assert (
        refused == "not_an_approver"
    )  # the first refusal stands: a public channel decides nothing
    named = replace(ESCALATING, escalate_users=("UONCALL",))
    assert (
        refusal(named, requester="UASK", approver="UONCALL", facts=ApproverFacts(), escalated=True)
        is None
    )
    assert refusal(named, requester="UASK", approver="ULEAD", facts=in_leads, escalated=True)
    assert refusal(named, requester="UONCALL", approver="UONCALL", facts=in_leads, escalated=True)
