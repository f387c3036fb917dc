"""The approval lifecycle: every state, every allowed transition, what each requires and records.

This file is the whole exactly-once design; it needs no database to read. Storage
builds each transition's conditional write from TRANSITIONS (storage/transitions.py) and
runs it (the stores, storage/turns.py, decisions.py, executions.py, follow_ups.py), so the
conditions live here and nowhere else. The states and the values they describe (an
Approval, its Request, Decision, Execution, Version) are storage/domain.py's.

States
    approval   pending -> approved | denied | expired      decided once, never changed
               pending -> withdrawn                         by its requester (WITHDRAW)
               pending -> answered | expired                a question: answered once
               pending -> pending (EDIT)                    a new version: earlier votes reset
    execution  not_started -> started -> finished           of an approved call only
    turn       waiting -> resuming -> done | failed         a turn paused on interrupts
               resuming -> resuming                         lease renewed, or taken over
               resuming -> waiting (LET_GO)                 a stopping process hands it back
    card       posting -> posted | failed                   the approvers' card (an outbox)
               posting -> posting                           a sweep retries a cut-off post
    reminder   scheduled -> sent                            once, while still pending
    escalation scheduled -> escalated                       once: the card goes up a level
    escalation card  posting -> posted | failed             the escalated card's outbox
                     posting -> posting                     a sweep retries a failed post
    standing   none -> granted                              GRANT, with the APPROVE it rides on
               granted -> granted (USE)                     a later call approved by it
               granted -> revoked                           REVOKE, once, while it is live
               granted, past `until`                        expired: no USE or REVOKE takes

Why an approved call runs at most once
    1. A decision leaves only `pending`, as one conditional write: of two clicks (or a
       click and Slack's retry, or two replicas) exactly one finds the row pending. A
       decision after the deadline changes nothing; EXPIRE takes the approval instead.
       A request that needs several approvers counts their VOTEs in the same write: the
       one that completes the quorum APPROVEs, once; nobody approves twice; one DENY ends
       it. A WITHDRAW by the request's requester (and nobody else) ends it too, in
       the same kind of write: an Approve after it finds nothing pending, and the model
       is told "withdrawn by the requester" as it would be told of a denial.
    2. A turn is resumed only by whoever CLAIMs it, and only once no approval of it is
       pending: one resume answers every interrupt (Genkit fails a partial one after
       running the approved tools in it). A claim holds a short lease, RENEWed while the
       resume runs; a process that dies leaves the lease to run out, and then another
       CLAIMs it (recovery); one that stops cleanly LETs GO of the resumes it cut off, so
       the next sweep CLAIMs them at once. Each claim bumps the turn's attempt number;
       RENEW, LET_GO and COMPLETE require the caller's own claim, so a resume that lost
       its lease changes nothing.
    3. The tool runs only after START_EXECUTION (not_started -> started, of an approved
       approval of this very call) is committed; FINISH_EXECUTION records its output. A
       later resume of the same turn (recovery) answers a finished call with its recorded
       output and a started one with "outcome unknown": it never runs a call twice
       (agent/interrupts.py `resume_parts`, agent/gate.py).
    4. A resume's restart parts are built from the stored request, never from a button.
    5. The tool gets the approval id as an idempotency key for the systems it calls.

An approval's card is recorded as being posted (`posting`) before it is posted. A post cut
off (the process died) is retried by one sweep (RETRY_CARD), which first looks for the card
in the channel: a card is never posted twice. A post Slack refuses for good ends `failed`,
and the requester is told. The escalated card (ESCALATE) has an outbox of its own, the
same: `posting` from the ESCALATE that records it, retried by one sweep after a failed or
cut-off post (RETRY_ESCALATION, which looks in the escalation channel first),
`posted` once out (ESCALATION_POSTED), `failed` when Slack refuses it for good. A post that
lost a race to record itself (another attempt recorded its own card first) is deleted:
never two live cards.

A conversation (a Slack thread) is held by one turn at a time: storage claims the thread
for a turn (busy until it ends, or until its time runs out) and keeps it while that turn
waits on approvals, so a second message never forks the agent's session.

A question (an interrupt that asks a person for input, not for approval) is a request too:
it is ANSWERed or expires, never approved, and the turn resumes once every request of it,
question or approval, is settled.

Versions: what is approved is what runs
    A request is one approvable call with a current version (`Approval.current`): the tool,
    its input as the tool's schema validated and coerced it, and a number. Every decision
    names the version its card, Home row or modal showed (`seen`), and each transition that
    decides requires it to be the current one (AS_SEEN), in the same conditional write.

    what                        version          votes                   runs
    REQUEST                     creates 1        none                    -
    VOTE (Approve of v)         names v          + one, for v            -
    APPROVE (Approve of v)      names v          completes v's quorum    v
    APPROVE with changes        creates v+1      the editor's, for v+1   v+1
    EDIT (quorum, changes)      creates v+1      only the editor's, v+1  -
    Edit & approve, no change   names v          a VOTE or APPROVE of v  (as above)
    DENY                        names v          -                       nothing
    WITHDRAW (the requester)    any              -                       nothing
    START_EXECUTION             the approved v   -                       v, once (SAME_VERSION)

    A decision naming an older version matches no row and changes nothing (the approver is
    shown the current one). A vote counts only for the version it named: an EDIT removes
    every other vote. Once approved, a request has no more versions, so the version the
    gate runs is the one approved. Genkit refuses a restart whose input differs from the
    model's, so the workflow runs an edited call itself, behind the same gate; version 1
    restarts with the model's own arguments (`Request.asked`), which the tool's schema
    turns into exactly version 1's input.

    An Approve, a VOTE or an EDIT may carry the approver's note (Approve with note; Edit &
    approve's): written with it (the vote's row, the approval's `reason` once approved) and
    audited as `note`; the model gets it with the result.

Standing approvals: a card's Approve for <duration>, off unless the tool's policy says
`standing:` (storage/domain.py Standing)
    what                  row                           writes, in one statement
    GRANT                 the approval's own            APPROVE of the version seen, and the
                                                        grant: until = now + the offer, the
                                                        rule that matched it; audited
    USE                   the grant's approval          uses + 1, and a new approval row
                                                        (APPROVE_UNDER: born approved, `under`
                                                        the grant, decided by its approver)
                                                        with its own done turn; audited as
                                                        requested and approved
    START/FINISH_EXEC.    the new approval              as for any approved call (the gate)
    REVOKE                the grant's approval          state revoked, who and when; audited
    expiry                (none)                        STANDING_LIVE is false from `until`
                                                        on, by the injected clock

    Only a request one approver decides offers it (STANDING_OFFERED: its policy's offer was
    recorded with it, and it needs one approval); a policy with both `standing` and a quorum
    is refused at start. USE finds the grant by the call's tool, requester, conversation and
    rule (STANDING_MATCHES), and only one whose approver is no participant of the turn (a
    person whose words reached the model approves nothing it asks next). USE is a
    conditional UPDATE of the grant's row, as REVOKE is: of a use and a revoke that race,
    PostgreSQL's row lock orders them, and the second re-checks the row as the first left
    it, so a call is approved before the revoke or not at all. Each call covered is its own
    approval, run once behind START_EXECUTION like any other; a grant never runs anything
    itself.

Adding a state is a change to the enums and TRANSITIONS below, as the quorum, the card's
outbox, reminders, escalation, questions, edits and standing approvals were:
storage derives its writes from them, and a new Requirement needs its SQL in
storage/transitions.py's REQUIREMENTS (a test says so if it is missing).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from storage.domain import (
    Approval,
    ApprovalState,
    CardState,
    EscalationState,
    ExecutionState,
    ReminderState,
    StandingState,
    TurnState,
)

State = (
    ApprovalState
    | ExecutionState
    | TurnState
    | CardState
    | ReminderState
    | EscalationState
    | StandingState
)


class Subject(enum.StrEnum):
    """What a transition moves: an approval's decision, its execution, or a paused turn."""

    APPROVAL = "approval"
    EXECUTION = "execution"
    TURN = "turn"
    CARD = "card"
    REMINDER = "reminder"
    ESCALATION = "escalation"
    ESCALATION_CARD = "escalation card"
    STANDING = "standing"


class Requirement(enum.StrEnum):
    """A condition besides the state; storage holds each one's SQL (and tests that it does)."""

    BEFORE_DEADLINE = "the approval's deadline has not passed"
    PAST_DEADLINE = "the approval's deadline has passed"
    APPROVED = "the approval is approved"
    SAME_CALL = "the call's tool and ref are the approval's"
    ALL_DECIDED = "no approval of the turn is pending"
    LEASE_RAN_OUT = "the resume's lease has run out"
    OWN_CLAIM = "nobody has claimed the turn since the caller did"
    NEW_VOTER = "the approver has not approved this request already"
    QUORUM_MET = "this approval completes the approvals needed"
    QUORUM_SHORT = "more approvals are needed after this one"
    STILL_PENDING = "the approval is still pending"
    BY_REQUESTER = "the person is the request's requester"
    REMINDER_DUE = "the reminder's time has come"
    ESCALATION_DUE = "the escalation's time has come"
    POST_RAN_OUT = "the last attempt to post the card is older than its grace"
    ESCALATION_POST_RAN_OUT = "the last attempt to post the escalated card is older than its grace"
    ASKS_APPROVAL = "the request asks for an approval"
    ASKS_ANSWER = "the request asks a question"
    SEVERAL_NEEDED = "the request needs several approvers"
    AS_SEEN = "the version the approver saw is the request's current version"
    SAME_VERSION = "the version to run is the request's current (approved) version"
    STANDING_OFFERED = "the request offers a standing approval and needs one approver"
    STANDING_LIVE = "the standing approval's time has not run out"
    STANDING_MATCHES = (
        "the call's tool, requester, conversation and rule are the standing approval's, "
        "and its approver is no participant of the call"
    )


@dataclass(frozen=True)
class Audit:
    """The audit row a transition appends, atomically with the change.

    `actor`: who the row names (the approval's decider or requester, or Greenlight itself);
    `detail`: the approval's fields it copies (input, why, reason, output).
    """

    action: str
    actor: Literal["decider", "editor", "requester", "revoker", "greenlight"]
    detail: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)  # each transition is one object: compared by identity
class Transition:
    """One allowed change: the states it may leave (each with what else it requires from
    there), the state it enters, what it requires from any state, what it records."""

    name: str
    subject: Subject
    leaves: Mapping[State | None, tuple[Requirement, ...]]  # None: the row is created
    enters: State
    requires: tuple[Requirement, ...] = ()
    audit: Audit | None = None

    def requirements(self, state: State | None) -> tuple[Requirement, ...]:
        return (*self.requires, *self.leaves.get(state, ()))

    def check(self, state: State | None, holds: Mapping[Requirement, bool]) -> State:
        """The state this transition enters from `state`, given which requirements hold;
        IllegalTransition when it may not happen."""
        if state not in self.leaves:
            raise IllegalTransition(self, state)
        unmet = tuple(r for r in self.requirements(state) if not holds.get(r, False))
        if unmet:
            raise IllegalTransition(self, state, unmet)
        return self.enters


A, E, T = ApprovalState, ExecutionState, TurnState
R = Requirement

PAUSE = Transition("pause", Subject.TURN, {None: ()}, T.WAITING)
REQUEST = Transition(
    "request",
    Subject.APPROVAL,
    {None: ()},
    A.PENDING,
    audit=Audit("requested", "requester", ("input", "why")),
)
# An Approve is one of two transitions, whichever applies, in one write: VOTE while more
# approvals are needed (a quorum), APPROVE for the one that completes it.
VOTE = Transition(
    "vote",
    Subject.APPROVAL,
    {A.PENDING: ()},
    A.PENDING,
    requires=(R.ASKS_APPROVAL, R.AS_SEEN, R.BEFORE_DEADLINE, R.NEW_VOTER, R.QUORUM_SHORT),
    audit=Audit("approved", "decider", ("input", "note")),
)
APPROVE = Transition(
    "approve",
    Subject.APPROVAL,
    {A.PENDING: ()},
    A.APPROVED,
    requires=(R.ASKS_APPROVAL, R.AS_SEEN, R.BEFORE_DEADLINE, R.NEW_VOTER, R.QUORUM_MET),
    audit=Audit("approved", "decider", ("input", "edited", "note")),
)
# Approve with changes, of a request that needs several approvers: a new version, which
# stands with the editor's vote alone (whether they had voted or not); the others vote again.
EDIT = Transition(
    "edit",
    Subject.APPROVAL,
    {A.PENDING: ()},
    A.PENDING,
    requires=(R.ASKS_APPROVAL, R.AS_SEEN, R.BEFORE_DEADLINE, R.SEVERAL_NEEDED),
    audit=Audit("edited", "editor", ("input", "edited", "note")),
)
DENY = Transition(
    "deny",
    Subject.APPROVAL,
    {A.PENDING: ()},
    A.DENIED,
    requires=(R.ASKS_APPROVAL, R.AS_SEEN, R.BEFORE_DEADLINE),
    audit=Audit("denied", "decider", ("input", "edited", "reason")),
)
# The requester takes back a request that waits (Withdraw, or the approvals API's DELETE):
# it ends there, nothing runs, and the model is told so. Nobody else may; a click after the
# deadline changes nothing (EXPIRE takes it), as for a decision.
WITHDRAW = Transition(
    "withdraw",
    Subject.APPROVAL,
    {A.PENDING: ()},
    A.WITHDRAWN,
    requires=(R.ASKS_APPROVAL, R.BY_REQUESTER, R.BEFORE_DEADLINE),
    audit=Audit("withdrawn", "requester", ("input", "edited")),
)
# A question is answered, once, by a person it asks (the requester, or an approver).
ANSWER = Transition(
    "answer",
    Subject.APPROVAL,
    {A.PENDING: ()},
    A.ANSWERED,
    requires=(R.ASKS_ANSWER, R.BEFORE_DEADLINE),
    audit=Audit("answered", "decider", ("input", "answer")),
)
EXPIRE = Transition(
    "expire",
    Subject.APPROVAL,
    {A.PENDING: ()},
    A.EXPIRED,
    requires=(R.PAST_DEADLINE,),
    audit=Audit("expired", "greenlight", ("input",)),
)
START_EXECUTION = Transition(
    "start execution",
    Subject.EXECUTION,
    {E.NOT_STARTED: ()},
    E.STARTED,
    requires=(R.APPROVED, R.SAME_CALL, R.SAME_VERSION),
    audit=Audit("execution_started", "decider", ("input", "edited")),
)
FINISH_EXECUTION = Transition(
    "finish execution",
    Subject.EXECUTION,
    {E.STARTED: ()},
    E.FINISHED,
    audit=Audit("executed", "greenlight", ("output",)),
)
CLAIM = Transition(
    "claim",
    Subject.TURN,
    {T.WAITING: (), T.RESUMING: (R.LEASE_RAN_OUT,)},
    T.RESUMING,
    requires=(R.ALL_DECIDED,),
)
RETRY_CARD = Transition(
    "retry card",
    Subject.CARD,
    {CardState.POSTING: (R.POST_RAN_OUT,)},
    CardState.POSTING,
    requires=(R.STILL_PENDING,),
)
CARD_POSTED = Transition("card posted", Subject.CARD, {CardState.POSTING: ()}, CardState.POSTED)
CARD_FAILED = Transition(
    "card failed",
    Subject.CARD,
    {CardState.POSTING: ()},
    CardState.FAILED,
    audit=Audit("card_failed", "greenlight"),
)
# Follow-ups: recorded when they are done, before the transport does them (at most once).
REMIND = Transition(
    "remind",
    Subject.REMINDER,
    {ReminderState.SCHEDULED: ()},
    ReminderState.SENT,
    requires=(R.STILL_PENDING, R.REMINDER_DUE),
    audit=Audit("reminded", "greenlight"),
)
ESCALATE = Transition(
    "escalate",
    Subject.ESCALATION,
    {EscalationState.SCHEDULED: ()},
    EscalationState.ESCALATED,
    requires=(R.STILL_PENDING, R.ESCALATION_DUE),
    audit=Audit("escalated", "greenlight"),
)
# The escalated card's outbox: ESCALATE leaves it `posting` (storage/follow_ups.py).
RETRY_ESCALATION = Transition(
    "retry escalation",
    Subject.ESCALATION_CARD,
    {CardState.POSTING: (R.ESCALATION_POST_RAN_OUT,)},
    CardState.POSTING,
    requires=(R.STILL_PENDING,),
)
ESCALATION_POSTED = Transition(
    "escalation posted", Subject.ESCALATION_CARD, {CardState.POSTING: ()}, CardState.POSTED
)
ESCALATION_FAILED = Transition(
    "escalation failed",
    Subject.ESCALATION_CARD,
    {CardState.POSTING: ()},
    CardState.FAILED,
    audit=Audit("escalation_failed", "greenlight"),
)
# Standing approvals (see the docstring's table). GRANT is written with the APPROVE it rides
# on, in the same statement; USE with the APPROVE_UNDER of the call it covers.
GRANT = Transition(
    "grant",
    Subject.STANDING,
    {StandingState.NONE: ()},
    StandingState.GRANTED,
    requires=(R.STANDING_OFFERED,),
    audit=Audit("standing_granted", "decider", ("standing",)),
)
USE = Transition(
    "use standing",
    Subject.STANDING,
    {StandingState.GRANTED: ()},
    StandingState.GRANTED,
    requires=(R.STANDING_LIVE, R.STANDING_MATCHES),
)
APPROVE_UNDER = Transition(
    "approve under standing",
    Subject.APPROVAL,
    {None: ()},
    A.APPROVED,
    audit=Audit("approved", "decider", ("input", "under")),
)
REVOKE = Transition(
    "revoke",
    Subject.STANDING,
    {StandingState.GRANTED: ()},
    StandingState.REVOKED,
    requires=(R.STANDING_LIVE,),
    audit=Audit("standing_revoked", "revoker", ("standing",)),
)
RENEW = Transition("renew", Subject.TURN, {T.RESUMING: ()}, T.RESUMING, requires=(R.OWN_CLAIM,))
# A resume cut off by a clean shutdown: back to waiting, so a sweep claims it without waiting
# for the lease to run out. A call it started stays started (its outcome is unknown).
LET_GO = Transition("let go", Subject.TURN, {T.RESUMING: ()}, T.WAITING, requires=(R.OWN_CLAIM,))
COMPLETE = Transition("complete", Subject.TURN, {T.RESUMING: ()}, T.DONE, requires=(R.OWN_CLAIM,))
GIVE_UP = Transition("give up", Subject.TURN, {T.RESUMING: ()}, T.FAILED, requires=(R.OWN_CLAIM,))

TRANSITIONS = (
    PAUSE,
    REQUEST,
    VOTE,
    APPROVE,
    EDIT,
    DENY,
    WITHDRAW,
    ANSWER,
    EXPIRE,
    START_EXECUTION,
    FINISH_EXECUTION,
    RETRY_CARD,
    CARD_POSTED,
    CARD_FAILED,
    REMIND,
    ESCALATE,
    RETRY_ESCALATION,
    ESCALATION_POSTED,
    ESCALATION_FAILED,
    GRANT,
    USE,
    APPROVE_UNDER,
    REVOKE,
    CLAIM,
    RENEW,
    LET_GO,
    COMPLETE,
    GIVE_UP,
)
# A turn not yet ended holds its conversation: no other turn starts in that thread.
OPEN_TURN = (T.WAITING, T.RESUMING)
STATES: Mapping[Subject, type[State]] = {
    Subject.APPROVAL: ApprovalState,
    Subject.EXECUTION: ExecutionState,
    Subject.TURN: TurnState,
    Subject.CARD: CardState,
    Subject.REMINDER: ReminderState,
    Subject.ESCALATION: EscalationState,
    Subject.ESCALATION_CARD: CardState,
    Subject.STANDING: StandingState,
}


class IllegalTransition(Exception):
    """A transition its subject's state (or a requirement) does not allow; nothing changed.

    `current`: the approval as it is now, when storage read it to explain the refusal.
    """

    def __init__(
        self,
        transition: Transition,
        state: State | None,
        unmet: tuple[Requirement, ...] = (),
        *,
        current: Approval | None = None,
    ) -> None:
        why = "; ".join(unmet) if unmet else f"the {transition.subject} is {state or 'absent'}"
        super().__init__(f"{transition.name} refused: {why}")
        self.transition = transition
        self.state = state
        self.unmet = unmet
        self.current = current
