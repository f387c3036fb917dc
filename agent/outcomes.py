"""What the agent's work comes to, as transports render it: turns, decisions, follow-ups, refusals.

Values only: the jobs that produce them are agent/turns.py, agent/decisions.py and
agent/follow_ups.py; the approvals inside them are storage/domain.py's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agent.policy import Policy
from storage.domain import Approval, Claim, RefusalReason, Thread
from storage.retention import Purged


@dataclass(frozen=True)
class Progress:
    """A turn running in `thread`: first with no text when it starts (the transport shows
    that it is working), then with the model's text so far each time it grows; `final` once
    the model's answer is the turn's last, whole, while the turn is still being saved (the
    outcome follows: a Reply of the same text, or a failure if the save failed)."""

    thread: Thread
    requester: str
    text: str = ""
    final: bool = False


TextSink = Callable[[Progress], Awaitable[None]]


@dataclass(frozen=True)
class Reply:
    thread: Thread
    text: str
    # The standing approvals that covered calls of the turn, as it left them: their cards
    # count those calls (agent/standing.py).
    standing: tuple[Approval, ...] = ()


@dataclass(frozen=True)
class AwaitingApproval:
    thread: Thread
    approvals: tuple[Approval, ...]
    standing: tuple[Approval, ...] = ()  # as Reply's


@dataclass(frozen=True)
class Busy:
    """The thread already has a turn running or waiting for approval."""

    thread: Thread
    waiting_on: tuple[Approval, ...] = ()


@dataclass(frozen=True)
class Failed:
    thread: Thread
    retrying: bool = False
    model_unavailable: bool = False  # the model failed or never answered, not a tool or us


@dataclass(frozen=True)
class Decided:
    approval: Approval
    turn_ready: bool  # every request of the paused turn is now settled
    # The turn, claimed by the decision's own write for the caller to resume (`resume_here`).
    claim: Claim | None = None

    @property
    def turn_id(self) -> str:
        return self.approval.turn_id


@dataclass(frozen=True)
class AnsweredInThread:
    """The requester's message answered the question their thread waited on."""

    thread: Thread
    decided: Decided


TurnOutcome = Reply | AwaitingApproval | Busy | Failed | AnsweredInThread


@dataclass(frozen=True)
class Resumed:
    """A resumed turn: its outcome, and the approvals it settled (to refresh their cards)."""

    outcome: TurnOutcome
    settled: tuple[Approval, ...]


class InvalidAnswer(ValueError):
    """An answer that does not fit its question's form: what is wrong, by field."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


class EditRefused(InvalidAnswer):
    """An edit whose new version would move the decision (elsewhere, to other people, or to
    more of them): by field, why; nothing changed."""


class DecisionRefused(Exception):
    """A decision that changes nothing; `approval` shows its true state when known."""

    def __init__(self, reason: RefusalReason, approval: Approval | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.approval = approval


@dataclass(frozen=True)
class Due:
    """A follow-up this process now owes: the approval as it is, and its call's policy now
    (whom a reminder names; who may decide once it is escalated)."""

    approval: Approval
    policy: Policy


@dataclass(frozen=True)
class Owed:
    """The follow-ups this process now owes, each already recorded as done (at most once)."""

    reminders: tuple[Due, ...] = ()
    escalations: tuple[Due, ...] = ()


@dataclass(frozen=True)
class SweepReport:
    expired: tuple[Approval, ...] = ()
    resumed: tuple[Resumed, ...] = ()
    # Cards whose post was cut off, now this sweep's to finish (RETRY_CARD): each may be in
    # the channel already, so the transport looks there before it posts.
    uncarded: tuple[Approval, ...] = ()
    purged: Purged = field(default_factory=Purged)  # what retention deleted (every workspace)
    # Escalated cards whose post failed or was cut off, now this sweep's (RETRY_ESCALATION):
    # the transport looks in the escalation channel before it posts, as for `uncarded`.
    unescalated: tuple[Approval, ...] = ()
