"""Decisions: Approve (a vote, or the approval), Deny, Edit & approve, answers, the
requester's Withdraw; each once.

Each checks who may decide (agent/eligibility.py) and that the request is still open, then
is one conditional write (storage/decisions.py): of two clicks exactly one takes, and the
other is told why (DecisionRefused, with the request as it is now). A decision names the
version its person was shown; one on a version no longer current changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from agent.approval import preview_of
from agent.eligibility import Facts, check_eligible, for_version
from agent.inputs import coerced, same_value
from agent.observer import Watch
from agent.outcomes import Decided, DecisionRefused, EditRefused, InvalidAnswer
from agent.policy import ApproverFacts, Policy, PolicyService
from agent.prompt_edits import is_prompt, prompt_edited
from agent.questions import form_errors
from agent.runtime import AgentRuntime
from storage.approval_store import ApprovalStore
from storage.domain import Answered, Approval, Approved, Denied, Edit, Withdrawn
from storage.lifecycle import IllegalTransition, Requirement
from storage.policy_spec import StoredPolicy
from storage.redaction import hide, reveal, tampered

REDACTED = "hidden by the tool's policy (redacted): it cannot be changed"


@dataclass(frozen=True)
class Decisions:
    """Records decisions and answers, each once, by a person who may make it."""

    runtime: AgentRuntime
    store: ApprovalStore
    policies: PolicyService
    watch: Watch
    clock: Callable[[], datetime]
    lease: timedelta  # a resume's, for a turn a decision claims (`resume_here`)

    async def check_decider(
        self, team_id: str, approval_id: str, approver: str, facts: Facts
    ) -> Approval:
        """The approval, if `approver` may decide it now; else DecisionRefused saying why.

        `facts` may be a callback: the transport then looks people up only for a request
        that exists and is pending, knowing its tool's policy.
        """
        return (await self._decider(team_id, approval_id, approver, facts))[0]

    async def _decider(
        self, team_id: str, approval_id: str, approver: str, facts: Facts
    ) -> tuple[Approval, Policy]:
        """`check_decider`, and the request's policy (for its current version)."""
        approval, stored = await self._open(team_id, approval_id)
        if approval.request.question:
            raise DecisionRefused("a_question", approval)
        if approval.decision is not None:
            raise DecisionRefused("already_decided", approval)
        return approval, await self._check(approval, stored, approver, facts)

    async def check_answerer(
        self, team_id: str, approval_id: str, person: str, facts: Facts
    ) -> Approval:
        """The question, if `person` may answer it now; else DecisionRefused saying why. A
        question to the requester is theirs alone; one to the approvers, any approver's."""
        approval, stored = await self._open(team_id, approval_id)
        r = approval.request
        if not r.question:
            raise DecisionRefused("not_a_question", approval)
        if approval.decision is not None:
            raise DecisionRefused("already_decided", approval)
        if r.asks == "requester":
            if person != r.requester:
                raise DecisionRefused("not_the_requester", approval)
        else:
            await self._check(approval, stored, person, facts)
        return approval

    async def answer(
        self,
        team_id: str,
        approval_id: str,
        person: str,
        answer: Any,
        *,
        facts: Facts | None = None,
    ) -> Decided:
        """Record the answer to a question, once. DecisionRefused (nothing changes) when the
        person may not answer it or it is settled; InvalidAnswer when it does not fit the
        question's form."""
        approval = await self.check_answerer(team_id, approval_id, person, facts or ApproverFacts())
        if (form := self.runtime.question_form(approval.request.tool)) is not None:
            if errors := form_errors(form, answer):
                raise InvalidAnswer(errors)
        elif not isinstance(answer, str) or not answer.strip():
            raise InvalidAnswer({"answer": "an answer is needed"})
        try:
            done, others_pending = await self.store.decisions.answer(
                approval, Answered(person, self.clock(), answer)
            )
        except IllegalTransition as refused:  # answered first by someone, or time ran out
            current = await self._expire_if_overdue(refused.current or approval)
            raise DecisionRefused("already_decided", current) from None
        self.watch.settled(done)
        return Decided(done, turn_ready=others_pending == 0)

    async def decide(
        self,
        team_id: str,
        approval_id: str,
        approver: str,
        *,
        approve: bool,
        reason: str | None = None,
        facts: Facts | None = None,
        seen: int | None = None,
        standing: bool = False,
        resume_here: bool = False,
    ) -> Decided:
        """Record one decision on version `seen` of the request (the one the approver was
        shown; None: the current one), atomically; raises DecisionRefused and changes nothing
        else. A decision on a version that is no longer current is refused ("changed").
        `resume_here`: the caller resumes the turn the decision readies at once, so a
        decision that settles its turn's only request claims the turn in the same write
        (`Decided.claim`, for `Turns.resume`; one round trip fewer before the call runs).
        An Approve's `reason` is the approver's note, refused missing where the tool's
        policy needs one ("note_required"); `standing`: Approve for <duration>, which
        grants a standing approval too (refused, "no_standing", where the policy now
        offers none)."""
        approval, policy = await self._decider(
            team_id, approval_id, approver, facts or ApproverFacts()
        )
        now = self.clock()  # after the look-ups: the deadline holds at the write
        if approve and standing:  # a standing approval takes no note (agent/standing.py)
            return await self._grant(approval, policy, Approved(approver, now), seen=seen)
        if approve and policy.note_required and not reason:
            raise DecisionRefused("note_required", approval)
        decision = Approved(approver, now, reason) if approve else Denied(approver, now, reason)
        claim_until = now + self.lease if resume_here else None
        return await self._record(approval, decision, seen=seen, claim_until=claim_until)

    async def withdraw(self, team_id: str, approval_id: str, person: str) -> Decided:
        """The requester takes back a request that waits (Withdraw, or the approvals API's
        DELETE): it ends withdrawn, nothing runs, and once its turn resumes the model is
        told so. DecisionRefused (nothing changes) for anyone else ("not_theirs"), for a
        question, and for a request already settled (or past its deadline: it expires)."""
        approval, _ = await self._open(team_id, approval_id)
        if approval.request.question:
            raise DecisionRefused("a_question", approval)
        if person != approval.request.requester:
            raise DecisionRefused("not_theirs", approval)
        if approval.decision is not None:
            raise DecisionRefused("already_decided", approval)
        try:
            done, others_pending = await self.store.decisions.withdraw(
                approval, Withdrawn(person, self.clock())
            )
        except IllegalTransition as refused:
            raise await self._refused(refused, approval) from None
        self.watch.settled(done)
        return Decided(done, turn_ready=others_pending == 0)

    async def approve_with_changes(
        self,
        team_id: str,
        approval_id: str,
        approver: str,
        changed: dict[str, Any],
        *,
        facts: Facts | None = None,
        seen: int | None = None,
        note: str | None = None,
    ) -> Decided:
        """Edit & approve of version `seen`: `changed`, as the tool's schema validates it
        (InvalidAnswer by field), compared with the current version. Equal, it is a plain
        Approve of that version; different, it makes the next version, approved by this
        approver alone (with several approvers needed, the others approve again). The new
        version's policy is evaluated afresh: one that would route the decision elsewhere,
        to other approvers or escalation, or need more approvals, is refused by field
        (EditRefused); the approver must be one under it too. `note`: the approver's, as
        with an Approve."""
        facts = facts or ApproverFacts()
        approval, policy = await self._decider(team_id, approval_id, approver, facts)
        if seen is not None and seen != approval.version:
            raise DecisionRefused("changed", approval)
        if policy.note_required and not note:
            raise DecisionRefused("note_required", approval)
        r = approval.request
        new, shown = self._edited(approval, changed)
        if same_value(shown, approval.current.input):  # nothing changed: a vote for what it is
            decision = Approved(approver, self.clock(), note)
            return await self._record(approval, decision, seen=approval.version)
        await self._check_edit(approval, shown, approver, facts)
        preview = await preview_of(self.runtime.previews, r.tool, new)
        # The decision's time, after the look-ups and the preview, as an Approve takes it.
        edit = Edit(shown, approver, self.clock(), preview)
        if r.approvals_needed > 1:
            try:
                done = await self.store.decisions.edit(
                    approval, edit, seen=approval.version, note=note
                )
            except IllegalTransition as refused:
                raise await self._refused(refused, approval) from None
            return Decided(done, turn_ready=False)
        decision = Approved(approver, edit.at, note)
        return await self._record(approval, decision, seen=approval.version, edit=edit)

    def _edited(
        self, approval: Approval, changed: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """An Edit & approve's input (in the form's shown form: redacted fields as their
        masks), as the tool's schema validates it: (the input the tool would get, the same
        as every reader is shown it). InvalidAnswer by field when it does not fit, or when
        it changes a redacted field: nobody edits what nobody may see."""
        r = approval.request
        if hidden := tampered(changed, r.redact, r.secrets):
            raise InvalidAnswer(dict.fromkeys(hidden, REDACTED))
        given = reveal(changed, r.secrets)
        tool = self.runtime.tools.get(r.tool)
        if is_prompt(r.tool):
            new, errors = prompt_edited(approval.current.actual, given)
        elif tool is None:
            raise InvalidAnswer({"input": "no such tool"})
        else:
            new, errors = coerced(tool.action(), given)
        if errors or not isinstance(new, dict):
            raise InvalidAnswer(errors or {"input": "an object is needed"})
        return new, hide(new, r.redact, r.secrets)[0]

    async def _expire_if_overdue(self, approval: Approval) -> Approval:
        """A pending approval past its deadline is expired, whoever touches it first (a click,
        the sweep); returns it as it is now."""
        if approval.decision is not None or approval.request.expires_at > self.clock():
            return approval
        try:
            expired = await self.store.decisions.expire(approval, now=self.clock())
        except IllegalTransition as refused:
            return refused.current or approval
        self.watch.settled(expired)
        return expired

    async def _open(self, team_id: str, approval_id: str) -> tuple[Approval, StoredPolicy | None]:
        """The request (expired first if its deadline passed) and its tool's stored policy."""
        found = await self.store.decisions.decidable(team_id, approval_id)
        if found is None:
            raise DecisionRefused("not_found")
        return await self._expire_if_overdue(found[0]), found[1]

    async def _check(
        self, approval: Approval, stored: StoredPolicy | None, person: str, facts: Facts
    ) -> Policy:
        policy = for_version(self.policies.of(approval.request.tool, stored), approval)
        await check_eligible(policy, approval, person, facts)
        return policy

    async def _check_edit(
        self, approval: Approval, new: dict[str, Any], approver: str, facts: Facts
    ) -> None:
        """EditRefused when the new version would move the decision; DecisionRefused unless
        the approver may decide that version too."""
        base = await self.policies.get(approval.thread.team_id, approval.request.tool)
        candidate = replace(
            approval, edit=Edit(new, approver, self.clock()), version=approval.version + 1
        )
        new_policy = for_version(base, candidate)
        now_policy = for_version(base, approval)
        if moved := _moves(now_policy, new_policy, approval.request.approvals_needed):
            raise EditRefused(self._moved_fields(base, approval, new, moved))
        await check_eligible(new_policy, candidate, approver, facts)

    async def _record(
        self,
        approval: Approval,
        decision: Approved | Denied,
        *,
        seen: int | None,
        edit: Edit | None = None,
        claim_until: datetime | None = None,
    ) -> Decided:
        """One decision on version `seen`, as storage's conditional write takes it (`edit`:
        with the new version it makes, of a request one approver decides; `claim_until`:
        claiming the turn it settles, leased until then)."""
        if seen is not None and seen != approval.version:
            raise DecisionRefused("changed", approval)
        try:
            decided, others_pending, claim = await self.store.decisions.decide(
                approval, decision, edited=edit, seen=seen, claim_until=claim_until
            )
        except IllegalTransition as refused:
            raise await self._refused(refused, approval) from None
        self.watch.settled(decided)
        # A vote towards a quorum leaves the approval pending: nothing to resume yet.
        ready = decided.decision is not None and others_pending == 0
        return Decided(decided, turn_ready=ready, claim=claim)

    async def _grant(
        self, approval: Approval, policy: Policy, decision: Approved, *, seen: int | None
    ) -> Decided:
        """Approve for <duration>: APPROVE version `seen` and GRANT a standing approval for
        as long as the card offered, or the policy now offers if less, for calls the rule
        that matched this one matches (storage/standing.py)."""
        offer, shown = policy.standing_offer, approval.request.standing
        if offer is None or shown is None or approval.request.approvals_needed > 1:
            raise DecisionRefused("no_standing", approval)
        seen = approval.version if seen is None else seen
        if seen != approval.version:
            raise DecisionRefused("changed", approval)
        until = decision.at + min(offer, shown)
        try:
            granted, others_pending = await self.store.standing.grant(
                approval, decision, seen=seen, until=until, rule=policy.rule_key
            )
        except IllegalTransition as refused:
            raise await self._refused(refused, approval) from None
        self.watch.settled(granted)
        return Decided(granted, turn_ready=others_pending == 0)

    def _moved_fields(
        self, base: Policy, approval: Approval, new: dict[str, Any], why: str
    ) -> dict[str, str]:
        """Which changed fields move the decision, each by itself (all changed fields when
        only together they do), with why."""
        current = approval.current.input
        changed = [k for k in dict.fromkeys([*current, *new]) if not _same_field(current, new, k)]
        blamed = []
        for key in changed:
            alone = {k: v for k, v in current.items() if k != key}
            if key in new:
                alone[key] = new[key]
            one = replace(approval, edit=Edit(alone, "", self.clock()), version=0)
            if _moves(
                for_version(base, approval),
                for_version(base, one),
                approval.request.approvals_needed,
            ):
                blamed.append(key)
        return dict.fromkeys(blamed or changed, why)

    async def _refused(self, refused: IllegalTransition, approval: Approval) -> DecisionRefused:
        """Why an Approve, a Deny or an edit changed nothing, for the person who tried."""
        current = await self._expire_if_overdue(refused.current or approval)
        if current.decision is None and Requirement.AS_SEEN in refused.unmet:
            return DecisionRefused("changed", current)
        if current.decision is None and Requirement.NEW_VOTER in refused.unmet:
            return DecisionRefused("already_voted", current)
        if current.decision is None and Requirement.STANDING_OFFERED in refused.unmet:
            return DecisionRefused("no_standing", current)
        return DecisionRefused("already_decided", current)


def _moves(now: Policy, new: Policy, approvals: int) -> str | None:
    """Why a new version's policy would move the decision from the people who may make it
    now; None when it does not (a version that needs no approval moves nothing)."""
    if new.allowed:
        return None
    end = "; deny it instead and let the agent ask again"
    if new.approvals > approvals:
        return f"with this value the call needs {new.approvals} approvals, not {approvals}{end}"
    if new.channel != now.channel:
        return f"with this value the request goes to another approver channel{end}"
    if set(new.approver_users) != set(now.approver_users) or set(new.approver_groups) != set(
        now.approver_groups
    ):
        return f"with this value other people decide the request{end}"
    if (new.escalate_to, set(new.escalate_users), set(new.escalate_groups)) != (
        now.escalate_to,
        set(now.escalate_users),
        set(now.escalate_groups),
    ) or (new.escalate_after != now.escalate_after):
        return f"with this value the request escalates elsewhere{end}"
    return None


def _same_field(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    return (key in a) == (key in b) and same_value(a.get(key), b.get(key))
