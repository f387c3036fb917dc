"""What an approval is, as every layer sees it: requests, decisions, executions, versions, states.

A leaf: it imports nothing of the project but storage/redaction.py (a leaf too), so storage,
the agent and both transports import these values from here directly (storage/lifecycle.py
says how they may change; storage reads and writes them; the transports render them).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace as _replace
from datetime import datetime, timedelta
from typing import Any, Literal, overload

from storage.redaction import Secret, hide, reveal, scrub


class ApprovalState(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    ANSWERED = "answered"  # a question's (an interrupt that asks a person for input)
    WITHDRAWN = "withdrawn"  # by its requester, while it waited


class ExecutionState(enum.StrEnum):
    NOT_STARTED = "not_started"
    STARTED = "started"
    FINISHED = "finished"


class CardState(enum.StrEnum):
    POSTING = "posting"  # recorded before the post; a sweep retries it once it is stale
    POSTED = "posted"
    FAILED = "failed"  # Slack refused it for good; the requester was told


class StandingState(enum.StrEnum):
    NONE = "none"  # no standing approval was granted with this approval
    GRANTED = "granted"  # later calls like it run without a card until its `until`
    REVOKED = "revoked"  # ended early by a person; one past its `until` is simply over


class ReminderState(enum.StrEnum):
    NONE = "none"  # its policy asks for no reminder
    SCHEDULED = "scheduled"
    SENT = "sent"


class EscalationState(enum.StrEnum):
    NONE = "none"
    SCHEDULED = "scheduled"
    ESCALATED = "escalated"  # the card is in the escalation channel too; more may decide


class TurnState(enum.StrEnum):
    WAITING = "waiting"  # interrupts await decisions
    RESUMING = "resuming"  # claimed by one process until its lease runs out
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class Thread:
    """Where a conversation lives; the transport maps it to a Slack thread."""

    team_id: str
    channel_id: str
    thread_ts: str


@dataclass(frozen=True)
class Vote:
    """One person's approval of a request that needs several."""

    by: str
    at: datetime
    note: str | None = None  # the approver's words to the agent (Approve with note)


Origin = Literal["human", "tool", "model"]
Asked = Literal["requester", "approvers"]


@dataclass(frozen=True)
class Said:
    """A human's message of the conversation, as an approver is shown it."""

    text: str  # the first SAID_MAX characters (agent/context.py)
    length: int  # of the whole message
    by: str | None = None  # who wrote it (a Slack user id), when known
    at: datetime | None = None


@dataclass(frozen=True)
class Source:
    """Where an argument's value was found: in a human's message, in a tool's result
    (`tool` names which), or nowhere before the call (the model's own)."""

    origin: Origin
    tool: str | None = None


@dataclass(frozen=True)
class History:
    """The requester's earlier requests for the same tool, by how they ended."""

    approved: int = 0
    denied: int = 0
    expired: int = 0
    days: int = 30


# The ends a History counts, in its fields' order (an answer or a withdrawal is none).
HISTORY_ENDS = (ApprovalState.APPROVED, ApprovalState.DENIED, ApprovalState.EXPIRED)


@dataclass(frozen=True)
class Via:
    """A request that came through the gateway (gateway/), not from the agent's own turn:
    the door (`mcp`, `api`), the API key's name, the MCP client that asked (name and
    version), and whether the caller went away while it waited (then nothing runs)."""

    door: str
    key: str
    client: str | None = None
    gone: bool = False


@dataclass(frozen=True)
class Context:
    """What led to a call, recorded with its request (an approver decides on this)."""

    first: Said | None = None  # the message that started the conversation
    latest: Said | None = None  # the last human message before the call, if another
    agent: Said | None = None  # the agent's own words just before the call
    # Per argument value (by path: "toAccount", "items.0.sku"), where it came from.
    sources: Mapping[str, Source] = field(default_factory=dict)
    history: History | None = None
    via: Via | None = None  # through the gateway: which door, key and client


@dataclass(frozen=True)
class Request:
    """What the agent asked to run, for whom, why, and until when a human may decide."""

    tool: str
    ref: str  # Genkit matches a resume's answers to tool requests by (tool, ref)
    input: dict[str, Any]
    requester: str
    why: str
    requested_at: datetime
    expires_at: datetime
    # Everyone whose message led to the call (the requester among them): none may decide.
    participants: tuple[str, ...] = ()
    # What the tool's own preview said the call would do; "" when it failed or took too
    # long, None when the tool has none.
    preview: str | None = None
    approvals_needed: int = 1  # distinct approvers (a quorum)
    context: Context = Context()
    # A question (an interrupt that asks for input) asks the requester or the approvers; an
    # approval asks nobody in particular (None).
    asks: Asked | None = None
    # The model's own arguments, when they differ from `input`: the tool's schema coerced
    # them ("250000" into 250000), or they are not an object (`input` shows 5 as
    # {"value": 5}). A restart carries them exactly, and the schema coerces them again.
    # Read by the resume alone: with redacted fields, they hold the values whole.
    asked: Any = field(default=None, repr=False)
    # What its tool's policy asked of an approval when it was made: a note with it
    # (`note: required`), and the standing approval a card may offer (`standing: 1h`; None
    # when the policy allows none or the call needs several approvers).
    note_required: bool = False
    standing: timedelta | None = None
    # Redacted fields (storage/redaction.py): the keys its policy hid when it was made. Made
    # with them, a request keeps their values apart (`secrets`) and its `input`, preview and
    # quotes show only `•••• (N characters)`: whatever reads a request reads it so, and
    # only the call that runs puts the values back (`actual`).
    redact: tuple[str, ...] = ()
    secrets: tuple[Secret, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.redact:
            return
        shown, secrets = hide(self.input, self.redact, self.secrets)
        object.__setattr__(self, "input", shown)
        object.__setattr__(self, "secrets", secrets)
        if secrets:
            object.__setattr__(self, "preview", self.scrub(self.preview))
            c = self.context
            said = {k: getattr(c, k) for k in ("first", "latest", "agent")}
            quotes = {k: _replace(v, text=self.scrub(v.text)) for k, v in said.items() if v}
            object.__setattr__(self, "context", _replace(c, **quotes))

    @overload
    def scrub(self, text: str) -> str: ...
    @overload
    def scrub(self, text: None) -> None: ...
    @overload
    def scrub(self, text: str | None) -> str | None: ...
    def scrub(self, text: str | None) -> str | None:
        """Free text with this request's hidden values in it shown as their masks."""
        return text if text is None or not self.secrets else scrub(text, self.secrets)

    @property
    def actual(self) -> dict[str, Any]:
        """The input as the tool takes it: its hidden values back in place."""
        return dict(reveal(self.input, self.secrets))

    @property
    def question(self) -> bool:
        return self.asks is not None


@dataclass(frozen=True)
class Approved:
    by: str
    at: datetime
    # The approver's note (Approve with note), which the model gets with the call's result;
    # for a call the gateway's policy allowed, why.
    reason: str | None = None


@dataclass(frozen=True)
class Denied:
    by: str
    at: datetime
    reason: str | None = None


@dataclass(frozen=True)
class Expired:
    at: datetime


@dataclass(frozen=True)
class Answered:
    by: str
    at: datetime
    answer: Any  # free text, or an object of the form the question's tool gives


@dataclass(frozen=True)
class Withdrawn:
    """The requester took the request back while it waited (Withdraw; the approvals API's
    DELETE): nothing runs, and the agent is told."""

    by: str  # the requester: nobody else may withdraw it
    at: datetime


Decision = Approved | Denied | Expired | Answered | Withdrawn


@dataclass(frozen=True)
class Edit:
    """An approver's changes to a request's input: the call runs with `input` instead."""

    input: dict[str, Any]
    by: str
    at: datetime
    preview: str | None = None  # the tool's preview of the edited call (as Request.preview)

    def changes(self, original: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Each changed field, `{"from": old, "to": new}` (None for a field added or
        removed), for the model and the card."""
        keys = dict.fromkeys([*original, *self.input])
        return {
            k: {"from": original.get(k), "to": self.input.get(k)}
            for k in keys
            if original.get(k) != self.input.get(k) or (k in original) != (k in self.input)
        }


@dataclass(frozen=True)
class Version:
    """One version of an approvable call: what a card shows, a vote names and the gate runs."""

    number: int
    tool: str
    input: dict[str, Any]  # as the tool's schema validated it
    preview: str | None
    # Where each value came from: as recorded with the request, except that a value an
    # approver changed is a human's (they typed it).
    sources: Mapping[str, Source] = field(default_factory=dict)
    edit: Edit | None = None  # who made it, when a person did (None: as the agent asked)
    # Its redacted fields' values (`input` shows their masks, as every version does).
    secrets: tuple[Secret, ...] = field(default=(), repr=False)

    @property
    def actual(self) -> dict[str, Any]:
        """The input the tool runs with: the redacted fields' values back in place."""
        return dict(reveal(self.input, self.secrets))


@dataclass(frozen=True)
class NotStarted:
    pass


@dataclass(frozen=True)
class Started:
    """The call began and its end was never recorded: its outcome is unknown."""


@dataclass(frozen=True)
class Finished:
    output: Any  # the tool's output as JSON, replayed to the model by a later resume


Execution = NotStarted | Started | Finished


@dataclass(frozen=True)
class Card:
    """Where the approvers' card goes (chosen at request time), where its post got to, and
    once posted its ts."""

    channel: str
    ts: str | None = None
    state: CardState = CardState.POSTING


@dataclass(frozen=True)
class FollowUp:
    """A reminder or an escalation: when it is due and whether it happened. An escalation
    names its channel, and once escalated where its card's post got to (its outbox, as a
    card's) and, once posted there, the card's ts."""

    at: datetime
    state: ReminderState | EscalationState
    channel: str | None = None
    ts: str | None = None
    card: CardState | None = None


@dataclass(frozen=True)
class Standing:
    """A standing approval, granted with an Approve for <duration> (storage/lifecycle.py
    GRANT): until `until`, later calls of the same tool, by the same requester, in the same
    conversation, that the same rule (`rule`, agent/policy.py `Policy.rule_key`) matches,
    are approved without a card, each its own approval (`Approval.under`); `uses` counts
    them. Its approver is the approval's (`Approved.by`)."""

    until: datetime
    rule: str
    uses: int = 0
    state: StandingState = StandingState.GRANTED
    revoked_by: str | None = None
    revoked_at: datetime | None = None

    def live(self, now: datetime) -> bool:
        """Whether it still approves calls: granted, not revoked, its time not run out."""
        return self.state == StandingState.GRANTED and now < self.until


@dataclass(frozen=True)
class Approval:
    """One interrupted tool call: the request, its single decision, its execution, its card."""

    id: str
    turn_id: str
    thread: Thread
    request: Request
    decision: Decision | None = None
    execution: Execution = field(default_factory=NotStarted)
    card: Card | None = None
    votes: tuple[Vote, ...] = ()  # of a quorum: who approved so far, in order
    edit: Edit | None = None  # the latest edit: the call runs with its input instead
    reminder: FollowUp | None = None
    escalation: FollowUp | None = None
    version: int = 1  # the current version's number (1: as asked; one more per edit)
    standing: Standing | None = None  # the standing approval granted with it, if any
    under: str | None = None  # the standing approval (its approval's id) that approved it

    def notes(self) -> tuple[tuple[str, str], ...]:
        """The approvers' notes, (who, note), in order: each vote's under a quorum, else
        the approval's own."""
        if self.votes:
            return tuple((v.by, v.note) for v in self.votes if v.note)
        match self.decision:
            case Approved(by=by, reason=note) if note and self.under is None:
                return ((by, note),)
        return ()

    @property
    def current(self) -> Version:
        """The call as it stands: what approvers are shown and what runs once approved."""
        r, e = self.request, self.edit
        if e is None:
            return Version(
                self.version, r.tool, r.input, r.preview, r.context.sources, None, r.secrets
            )
        changed = e.changes(r.input)
        kept = {p: s for p, s in r.context.sources.items() if p.split(".")[0] not in changed}
        sources = kept | dict.fromkeys(changed, Source("human"))
        return Version(self.version, r.tool, e.input, r.scrub(e.preview), sources, e, r.secrets)

    @property
    def escalated(self) -> bool:
        return self.escalation is not None and self.escalation.state == EscalationState.ESCALATED

    @property
    def state(self) -> ApprovalState:
        match self.decision:
            case None:
                return ApprovalState.PENDING
            case Approved():
                return ApprovalState.APPROVED
            case Denied():
                return ApprovalState.DENIED
            case Expired():
                return ApprovalState.EXPIRED
            case Answered():
                return ApprovalState.ANSWERED
            case Withdrawn():
                return ApprovalState.WITHDRAWN

    @property
    def execution_state(self) -> ExecutionState:
        match self.execution:
            case NotStarted():
                return ExecutionState.NOT_STARTED
            case Started():
                return ExecutionState.STARTED
            case Finished():
                return ExecutionState.FINISHED


@dataclass(frozen=True)
class PausedTurn:
    """A turn stopped on interrupts: the Genkit snapshot a resume continues from."""

    id: str
    conversation_id: str
    thread: Thread
    session_id: str
    snapshot_id: str
    at: datetime


@dataclass(frozen=True)
class Claim:
    """The right to resume one turn: held by whoever CLAIMed it, until its lease runs out or
    a later claim (attempt) replaces it."""

    turn_id: str
    conversation_id: str
    thread: Thread
    snapshot_id: str
    attempt: int
    approvals: tuple[Approval, ...]
    lease_until: datetime | None = None  # as claimed (renewals move it on)
    # The snapshot row's version as the claim read it: a copy of that version kept in this
    # process may stand in for loading it (storage/turn_snapshots.py `resuming`).
    snapshot_version: int | None = None


@dataclass(frozen=True)
class AuditEntry:
    """One row of the append-only audit trail."""

    at: datetime
    actor: str
    action: str
    tool: str | None
    approval_id: str | None
    detail: dict[str, Any]


# Why a decision (or an answer, or a look at the conversation) changed nothing.
# Who may decide, by the tool's policy (agent/policy.py `refusal`):
Refusal = Literal["self_approval", "participant", "outsider", "not_an_approver", "public_channel"]
RefusalReason = (
    Refusal
    | Literal["not_found", "already_decided", "already_voted"]
    # The approver saw another version than the current one.
    | Literal["changed"]
    # A question answers no Approve or Deny; only the requester answers what asks them.
    | Literal["a_question", "not_a_question", "not_the_requester"]
    # Approve with no note where the tool's policy needs one; Approve for <duration> where
    # its policy (now) offers no standing approval; a Revoke of one that is over.
    | Literal["note_required", "no_standing", "standing_over"]
    # A Withdraw by anyone but the request's requester.
    | Literal["not_theirs"]
)
