"""The approvals' storage, one store per job, built together from one session factory.

Turns (threads, pause, claim, lease, end: storage/turns.py), decisions (storage/decisions.py),
the execution gate (storage/executions.py), follow-ups and the card's outbox
(storage/follow_ups.py), reads (storage/reads.py), and standing approvals
(storage/standing.py). Each transition is one conditional write built from
storage/lifecycle.py by storage/transitions.py.
"""

from __future__ import annotations

from storage.db import SessionFactory
from storage.decisions import DecisionStore
from storage.executions import ExecutionStore
from storage.follow_ups import FollowUpStore
from storage.reads import ReadStore
from storage.standing import StandingStore
from storage.turns import TurnStore


class ApprovalStore:
    """Every store of approvals, paused turns and conversations, on one session factory."""

    def __init__(self, sessions: SessionFactory) -> None:
        self.turns = TurnStore(sessions)
        self.decisions = DecisionStore(sessions)
        self.executions = ExecutionStore(sessions)
        self.follow_ups = FollowUpStore(sessions)
        self.reads = ReadStore(sessions)
        self.standing = StandingStore(sessions)
