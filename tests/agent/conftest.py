"""A real workflow on the test PostgreSQL with a scripted model and ledger-keeping tools."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.assemble import build_workflow
from agent.clock import new_uuid
from agent.models import Credentials, Resilience
from agent.observer import DecisionOutcome, ExecutionOutcome, Observer, TurnOutcomeName
from agent.policy import ApproverFacts, PolicyDefaults
from agent.runtime import AgentConfig
from agent.workflow import Workflow
from storage.db import SessionFactory
from storage.domain import Thread
from tests import ledger_tools
from tests.fakes.gemini import FakeGemini
from tests.fakes.scripted_model import ScriptedModel

IN_CHANNEL = ApproverFacts(in_channel=True)
NO_RETRY = Resilience(retries=0)  # a model error fails the turn
NO_BACKOFF = Resilience(delay_seconds=0)  # retried as in production, at once


@dataclass
class Clock:
    """A clock the test moves by hand (expiry, leases)."""

    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@dataclass
class Recorder(Observer):
    """What the workflow told its observer, in order."""

    decisions: list[tuple[str, DecisionOutcome, float]] = field(default_factory=list)
    executions: list[tuple[str, ExecutionOutcome]] = field(default_factory=list)
    turns: list[tuple[TurnOutcomeName, float | None]] = field(default_factory=list)

    def decided(self, tool: str, outcome: DecisionOutcome, seconds: float) -> None:
        self.decisions.append((tool, outcome, seconds))

    def executed(self, tool: str, outcome: ExecutionOutcome) -> None:
        self.executions.append((tool, outcome))

    def turn_ended(self, outcome: TurnOutcomeName, seconds: float | None) -> None:
        self.turns.append((outcome, seconds))


@dataclass
class Harness:
    workflow: Workflow
    model: ScriptedModel
    clock: Clock
    team: str
    make: Callable[[], Workflow]

    def thread(self, ts: str = "1700000000.000100") -> Thread:
        return Thread(self.team, "D0TEST", ts)

    @staticmethod
    def ledger() -> list[dict[str, object]]:
        return ledger_tools.entries()


def gemini_workflow(
    sessions: SessionFactory,
    gemini: FakeGemini,
    timeout: float = 300,
    resilience: Resilience = NO_RETRY,
) -> Workflow:
    """A workflow on the real Gemini plugin, talking to the fake Gemini server; a model
    error fails the turn unless `resilience` retries it or falls back."""
    return build_workflow(
        sessions,
        AgentConfig(
            model="googleai/gemini-flash-latest",
            credentials=Credentials(gemini_api_key="k", gemini_api_url=gemini.base_url),
            tool_modules=("tests.ledger_tools",),
            resilience=resilience,
        ),
        defaults=PolicyDefaults(channel="C0APPROVE"),
        turn_timeout=timedelta(seconds=timeout),
    )


def harness(sessions: SessionFactory, team: str, resilience: Resilience = NO_BACKOFF) -> Harness:
    """Model calls are retried as in production, without the backoff's wait."""
    model = ScriptedModel()
    clock = Clock()

    def make() -> Workflow:
        return build_workflow(
            sessions,
            AgentConfig(
                model="scripted", tool_modules=("tests.ledger_tools",), resilience=resilience
            ),
            defaults=PolicyDefaults(channel="C0APPROVE"),
            clock=clock,
            new_id=new_uuid,
            setup=model.register,
        )

    return Harness(workflow=make(), model=model, clock=clock, team=team, make=make)


@pytest.fixture
def h(pg_sessions: SessionFactory, team: str, ledger: Path) -> Harness:
    return harness(pg_sessions, team)
