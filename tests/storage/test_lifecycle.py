"""The lifecycle table on its own: every allowed and every illegal transition, no database."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from storage.domain import (
    Answered,
    Approval,
    ApprovalState,
    Approved,
    CardState,
    Denied,
    Edit,
    EscalationState,
    ExecutionState,
    Expired,
    Finished,
    NotStarted,
    ReminderState,
    Request,
    StandingState,
    Started,
    Thread,
    TurnState,
    Withdrawn,
)
from storage.lifecycle import (
    ANSWER,
    APPROVE,
    APPROVE_UNDER,
    CARD_FAILED,
    CARD_POSTED,
    CLAIM,
    COMPLETE,
    DENY,
    EDIT,
    ESCALATE,
    ESCALATION_FAILED,
    ESCALATION_POSTED,
    EXPIRE,
    FINISH_EXECUTION,
    GIVE_UP,
    GRANT,
    LET_GO,
    PAUSE,
    REMIND,
    RENEW,
    REQUEST,
    RETRY_CARD,
    RETRY_ESCALATION,
    REVOKE,
    START_EXECUTION,
    STATES,
    TRANSITIONS,
    USE,
    VOTE,
    WITHDRAW,
    IllegalTransition,
    Requirement,
    State,
    Transition,
)

A, E, T, C, R = ApprovalState, ExecutionState, TurnState, CardState, Requirement
NOW = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)

# What the design allows, written out by hand: (transition, from) -> (enters, requirements).
ALLOWED: dict[tuple[Transition, State | None], tuple[State, set[Requirement]]] = {
    (PAUSE, None): (T.WAITING, set()),
    (REQUEST, None): (A.PENDING, set()),
    (VOTE, A.PENDING): (
        A.PENDING,
        {R.ASKS_APPROVAL, R.AS_SEEN, R.BEFORE_DEADLINE, R.NEW_VOTER, R.QUORUM_SHORT},
    ),
    (APPROVE, A.PENDING): (
        A.APPROVED,
        {R.ASKS_APPROVAL, R.AS_SEEN, R.BEFORE_DEADLINE, R.NEW_VOTER, R.QUORUM_MET},
    ),
    (EDIT, A.PENDING): (
        A.PENDING,
        {R.ASKS_APPROVAL, R.AS_SEEN, R.BEFORE_DEADLINE, R.SEVERAL_NEEDED},
    ),
    (DENY, A.PENDING): (A.DENIED, {R.ASKS_APPROVAL, R.AS_SEEN, R.BEFORE_DEADLINE}),
    (WITHDRAW, A.PENDING): (A.WITHDRAWN, {R.ASKS_APPROVAL, R.BY_REQUESTER, R.BEFORE_DEADLINE}),
    (ANSWER, A.PENDING): (A.ANSWERED, {R.ASKS_ANSWER, R.BEFORE_DEADLINE}),
    (EXPIRE, A.PENDING): (A.EXPIRED, {R.PAST_DEADLINE}),
    (START_EXECUTION, E.NOT_STARTED): (E.STARTED, {R.APPROVED, R.SAME_CALL, R.SAME_VERSION}),
    (FINISH_EXECUTION, E.STARTED): (E.FINISHED, set()),
    (RETRY_CARD, C.POSTING): (C.POSTING, {R.STILL_PENDING, R.POST_RAN_OUT}),
    (CARD_POSTED, C.POSTING): (C.POSTED, set()),
    (CARD_FAILED, C.POSTING): (C.FAILED, set()),
    (REMIND, ReminderState.SCHEDULED): (ReminderState.SENT, {R.STILL_PENDING, R.REMINDER_DUE}),
    (ESCALATE, EscalationState.SCHEDULED): (
        EscalationState.ESCALATED,
        {R.STILL_PENDING, R.ESCALATION_DUE},
    ),
    # The escalated card's outbox, as the card's.
    (RETRY_ESCALATION, C.POSTING): (C.POSTING, {R.STILL_PENDING, R.ESCALATION_POST_RAN_OUT}),
    (ESCALATION_POSTED, C.POSTING): (C.POSTED, set()),
    (ESCALATION_FAILED, C.POSTING): (C.FAILED, set()),
    (GRANT, StandingState.NONE): (StandingState.GRANTED, {R.STANDING_OFFERED}),
    (USE, StandingState.GRANTED): (
        StandingState.GRANTED,
        {R.STANDING_LIVE, R.STANDING_MATCHES},
    ),
    (APPROVE_UNDER, None): (A.APPROVED, set()),
    (REVOKE, StandingState.GRANTED): (StandingState.REVOKED, {R.STANDING_LIVE}),
    (CLAIM, T.WAITING): (T.RESUMING, {R.ALL_DECIDED}),
    (CLAIM, T.RESUMING): (T.RESUMING, {R.ALL_DECIDED, R.LEASE_RAN_OUT}),
    (RENEW, T.RESUMING): (T.RESUMING, {R.OWN_CLAIM}),
    (LET_GO, T.RESUMING): (T.WAITING, {R.OWN_CLAIM}),
    (COMPLETE, T.RESUMING): (T.DONE, {R.OWN_CLAIM}),
    (GIVE_UP, T.RESUMING): (T.FAILED, {R.OWN_CLAIM}),
}
EVERY = [(t, s) for t in TRANSITIONS for s in (None, *STATES[t.subject])]


def everything_holds() -> dict[Requirement, bool]:
    return dict.fromkeys(Requirement, True)


def test_the_table_is_the_design() -> None:
    allowed = {(t, s) for t, s in EVERY if s in t.leaves}
    assert allowed == set(ALLOWED)
    assert len({t.name for t in TRANSITIONS}) == len(TRANSITIONS)
    used = {r for t in TRANSITIONS for s in t.leaves for r in t.requirements(s)}
    assert used == set(Requirement)  # no requirement is dead weight


@pytest.mark.parametrize(("transition", "state"), EVERY, ids=lambda v: getattr(v, "name", v))
def test_every_transition_from_every_state(transition: Transition, state: State | None) -> None:
    if (transition, state) not in ALLOWED:
        with pytest.raises(IllegalTransition) as refused:
            transition.check(state, everything_holds())
        assert refused.value.unmet == () and refused.value.state == state
        assert transition.name in str(refused.value)
        return
    enters, required = ALLOWED[(transition, state)]
    assert transition.check(state, everything_holds()) == enters
    assert set(transition.requirements(state)) == required
    for r in required:  # each requirement alone can stop it
        with pytest.raises(IllegalTransition) as refused:
            transition.check(state, everything_holds() | {r: False})
        assert refused.value.unmet == (r,) and str(r) in str(refused.value)
    for subset in itertools.chain.from_iterable(
        itertools.combinations(sorted(required), k) for k in range(len(required) + 1)
    ):
        holds = dict.fromkeys(subset, True)
        if set(subset) == required:
            assert transition.check(state, holds) == enters
        else:
            with pytest.raises(IllegalTransition):
                transition.check(state, holds)


def test_audited_transitions_name_fields_an_approval_has() -> None:
    audited = {t.name: t.audit for t in TRANSITIONS if t.audit is not None}
    assert {name: spec.action for name, spec in audited.items()} == {
        "request": "requested",
        "vote": "approved",
        "approve": "approved",
        "edit": "edited",
        "deny": "denied",
        "withdraw": "withdrawn",
        "answer": "answered",
        "expire": "expired",
        "start execution": "execution_started",
        "finish execution": "executed",
        "card failed": "card_failed",
        "remind": "reminded",
        "escalate": "escalated",
        "escalation failed": "escalation_failed",
        "grant": "standing_granted",
        "approve under standing": "approved",
        "revoke": "standing_revoked",
    }
    fields = {"input", "why", "reason", "note", "answer", "edited", "output", "under", "standing"}
    for spec in audited.values():
        assert set(spec.detail) <= fields


def approval(**over: object) -> Approval:
    request = Request("transferMoney", "r1", {"amount": 5}, "U1", "why", NOW, NOW)
    values: dict[str, object] = {
        "id": "a1",
        "turn_id": "t1",
        "thread": Thread("T1", "D1", "1.1"),
        "request": request,
    }
    return Approval(**(values | over))  # type: ignore[arg-type]


def test_an_approvals_state_follows_its_typed_values() -> None:
    assert (approval().state, approval().execution_state) == (A.PENDING, E.NOT_STARTED)
    assert approval(decision=Approved("U2", NOW)).state == A.APPROVED
    assert approval(decision=Denied("U2", NOW, "no")).state == A.DENIED
    assert approval(decision=Expired(NOW)).state == A.EXPIRED
    assert approval(decision=Answered("U2", NOW, "42")).state == A.ANSWERED
    assert approval(decision=Withdrawn("U1", NOW)).state == A.WITHDRAWN
    assert approval(execution=Started()).execution_state == E.STARTED
    assert approval(execution=Finished({"ok": True})).execution_state == E.FINISHED
    assert approval(execution=NotStarted()).execution_state == E.NOT_STARTED


def test_an_edit_says_what_changed() -> None:
    original = {"amount": 500, "toAccount": "12345", "memo": "rent"}
    edit = Edit({"amount": 300, "toAccount": "12345", "note": "x"}, "U2", NOW)
    assert edit.changes(original) == {
        "amount": {"from": 500, "to": 300},
        "memo": {"from": "rent", "to": None},
        "note": {"from": None, "to": "x"},
    }
    assert Edit(dict(original), "U2", NOW).changes(original) == {}
