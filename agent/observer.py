"""What the agent reports as it happens (decisions, executions, turns), for metrics, in one place.

The agent knows when these happen but not who counts them: whoever wires it passes an
`Observer` (bot/metrics.py counts them for Prometheus). This one does nothing, so tests and
the demo need none. `Watch` is the one place the agent tells it, read off the outcomes
themselves, each once, after the write that makes it true: a request settled, a turn
ended, and with a turn that ended for good, how each of its approved calls ended; a call a
standing approval covered, when its approval is made and when it ends (the gate tells).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar, assert_never

from agent.outcomes import AnsweredInThread, AwaitingApproval, Busy, Failed, Reply, Resumed
from storage.domain import (
    Answered,
    Approval,
    Approved,
    Denied,
    Expired,
    Finished,
    Started,
    Withdrawn,
)

# How an approval (or a question) was settled: an approver's Approve or Deny, the deadline,
# the answer a question got, the requester's Withdraw, or a standing approval that approved
# the call as it was made (agent/standing.py: no card, no wait).
DecisionOutcome = Literal["approved", "denied", "expired", "answered", "withdrawn", "standing"]
# How an approved call ended: its output (`error`: it raised, or answered {"ok": false}), or
# never recorded (the process died running it, or it ran past its time: storage/domain.py's
# Started).
ExecutionOutcome = Literal["ok", "error", "unknown"]
# How a turn (a message's, or a resume's) ended.
TurnOutcomeName = Literal["reply", "awaiting_approval", "busy", "failed", "answered"]

T = TypeVar("T")


class Observer:
    """Does nothing; subclass it to count what happens."""

    def decided(self, tool: str, outcome: DecisionOutcome, seconds: float) -> None:
        """A request was settled, `seconds` after it was asked."""

    def executed(self, tool: str, outcome: ExecutionOutcome) -> None:
        """An approved call of `tool` ended."""

    def turn_ended(self, outcome: TurnOutcomeName, seconds: float | None) -> None:
        """A turn ended; `seconds` it ran the agent for (None: it did not run it)."""

    def gateway_call(self, door: str, outcome: str) -> None:
        """A call through the gateway's `door` (mcp, api) ended as `outcome`."""


def execution_outcome(output: Any) -> ExecutionOutcome:
    """A recorded output's outcome: a tool that raised (or said so) answered {"ok": false}."""
    return "error" if isinstance(output, dict) and output.get("ok") is False else "ok"


@dataclass(frozen=True)
class Watch:
    """Tells the observer what the agent's outcomes say happened."""

    observer: Observer
    clock: Callable[[], datetime]

    async def turn(self, run: Awaitable[T]) -> T:
        """Run a turn (a message's or a resume's; None: not resumed here) and tell how it
        ended and how long it took."""
        started = self.clock()
        try:
            result = await run
        except Exception:
            self.observer.turn_ended("failed", (self.clock() - started).total_seconds())
            raise
        self._turn_ended(result, (self.clock() - started).total_seconds())
        return result

    def settled(self, approval: Approval) -> None:
        """A request was settled (a vote towards a quorum settles none)."""
        if (decision := approval.decision) is None:
            return
        outcome: DecisionOutcome
        match decision:
            case Approved():
                outcome = "approved"
            case Denied():
                outcome = "denied"
            case Expired():
                outcome = "expired"
            case Answered():
                outcome = "answered"
            case Withdrawn():
                outcome = "withdrawn"
            case unreachable:
                assert_never(unreachable)
        r = approval.request
        self.observer.decided(r.tool, outcome, (decision.at - r.requested_at).total_seconds())

    def covered(self, approval: Approval) -> None:
        """A call a standing approval approved as it was made (its USE): a decision of its
        own, `standing`, taken the moment it was asked."""
        self.observer.decided(approval.request.tool, "standing", 0.0)

    def covered_ended(self, approval: Approval) -> None:
        """A call a standing approval covered ended (`approval` as it ended: Finished, or
        Started when it ran past its time). Counted as any approved call's execution, here,
        since no resume settles it: the gate tells this (agent/gate.py)."""
        self._executed((approval,))

    def _turn_ended(self, result: object, seconds: float) -> None:
        if result is None:  # not resumed here: nothing ran
            return
        if isinstance(result, Resumed):
            if not (isinstance(result.outcome, Failed) and result.outcome.retrying):
                self._executed(result.settled)
            result = result.outcome
        name: TurnOutcomeName
        ran: float | None = seconds
        match result:
            case Reply():
                name = "reply"
            case AwaitingApproval():
                name = "awaiting_approval"
            case Failed():
                name = "failed"
            case Busy():
                name, ran = "busy", None
            case AnsweredInThread():
                name, ran = "answered", None
            case _:
                raise TypeError(f"not a turn's outcome: {result!r}")
        self.observer.turn_ended(name, ran)

    def _executed(self, settled: tuple[Approval, ...]) -> None:
        """How each approved call of a turn that ended for good ended, once: by its recorded
        output, or "unknown" for one only started (it died running, or ran past its time),
        which never will end."""
        for a in settled:
            if not isinstance(a.decision, Approved):
                continue
            match a.execution:
                case Finished(output=output):
                    self.observer.executed(a.request.tool, execution_outcome(output))
                case Started():
                    self.observer.executed(a.request.tool, "unknown")
