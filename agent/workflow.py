"""What the transports receive: the agent's jobs, one object each (built by agent/assemble.py).

`turns` runs messages and resumes (agent/turns.py); `decisions` records Approve, Deny,
edits and answers (agent/decisions.py); `follow_ups` sweeps, reminds, escalates and keeps
the card's outbox (agent/follow_ups.py); `reads` serves requests to pages and people
(agent/reads.py); `standing` revokes standing approvals (agent/standing.py: the middleware
covers calls with them). `runtime` says what each tool is (its description, form, whether it
asks), `policies` reads and changes policy. When each transition of storage/lifecycle.py
happens is decided in those jobs; that it happens at most once is storage's conditional
write; a tool runs only behind the execution gate (agent/gate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.decisions import Decisions
from agent.follow_ups import FollowUps
from agent.gate import ToolTimeouts
from agent.policy import PolicyService
from agent.reads import Reads
from agent.runtime import AgentRuntime
from agent.standing import StandingApprovals
from agent.turns import Turns


@dataclass(frozen=True)
class Workflow:
    runtime: AgentRuntime
    policies: PolicyService
    turns: Turns
    decisions: Decisions
    follow_ups: FollowUps
    reads: Reads
    standing: StandingApprovals
    tool_timeouts: ToolTimeouts
