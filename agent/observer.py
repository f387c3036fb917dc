"""What the agent reports as it happens (decisions, tool executions, turns), for metrics.

The agent knows when these happen but not who counts them: whoever wires it passes an
`Observer` (bot/metrics.py counts them for Prometheus). This one does nothing, so tests and
the demo need none. Each call is made once per event, after the write that makes it true.
"""

from __future__ import annotations

from typing import Literal

# How an approval (or a question) was settled: an approver's Approve or Deny, the deadline,
# or the answer a question got.
DecisionOutcome = Literal["approved", "denied", "expired", "answered"]
# How an approved call ended: its output (`error`: it raised, or answered {"ok": false}), or
# never recorded (the process died running it: storage/lifecycle.py's Started).
ExecutionOutcome = Literal["ok", "error", "unknown"]
# How a turn (a message's, or a resume's) ended.
TurnOutcomeName = Literal["reply", "awaiting_approval", "busy", "failed", "answered"]


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
