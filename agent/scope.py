"""A turn's facts, carried to the middleware in a ContextVar: who asked, what it claimed, its clock.

Genkit calls the middleware with no handle of ours, so whoever runs a turn sets its
`TurnScope` for the turn's duration (`scoped`), and the middleware reads it
(`current_scope`): the workspace, the requester, the approvals a resume claimed, each
call's policy as read when it was made, and the conversation as the model last saw it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from genkit import Message

from agent.context import Index
from agent.policy import Policy
from storage.domain import Approval, Context, History, Thread
from storage.session_store import current_team

# Entered around each wait on the model or a tool, so whoever runs the turn
# (bot/background.py) can give the turn's place to other work meanwhile.
Outside = Callable[[], AbstractAsyncContextManager[None]]


@dataclass
class ModelCalls:
    """Whether the turn's last model call went unanswered: it failed (after Retry and
    Fallback) or was still out when the turn's time ran out. A turn that fails then failed
    on the model (an outage), not on a tool or on us."""

    unanswered: bool = False


class ModelTime:
    """The model-turn timeout of one turn, stopped while approved calls run (each has its own,
    ToolTimeouts): the turn's limit is on the time spent outside them."""

    def __init__(self) -> None:
        self._timeout: asyncio.Timeout | None = None
        self._running = 0  # approved calls running now (Genkit may run them in parallel)
        self._left: float | None = None

    @contextlib.asynccontextmanager
    async def limit(self, seconds: float) -> AsyncIterator[None]:
        async with asyncio.timeout(seconds) as self._timeout:
            yield

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        timeout = self._timeout
        if timeout is None or timeout.expired():  # no limit, or it already fired
            yield
            return
        loop = asyncio.get_running_loop()
        if self._running == 0:
            when = timeout.when()
            self._left = None if when is None else max(when - loop.time(), 0.0)
            timeout.reschedule(None)
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            if self._running == 0 and self._left is not None and not timeout.expired():
                timeout.reschedule(loop.time() + self._left)


@dataclass(frozen=True)
class TurnScope:
    team_id: str
    requester: str
    # Everyone whose message led to this turn (the requester among them).
    participants: tuple[str, ...] = ()
    # A resume's approvals, as claimed: the only ones a restart of this turn may carry.
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    # Each call this turn made (by its ref): its policy, rules applied, as read when the
    # call was made, and what led to it. Pausing needs no second read.
    calls: dict[str, Called] = field(default_factory=dict)
    # The conversation as the model last saw it, its answer included.
    conversation: list[Message] = field(default_factory=list)
    model: ModelCalls = field(default_factory=ModelCalls)
    model_time: ModelTime = field(default_factory=ModelTime)
    # The conversation's provenance index, built once per model answer (agent/context.py).
    indexes: dict[tuple[int, int], Index] = field(default_factory=dict)
    # Where the turn runs (a standing approval covers calls of its own conversation only).
    conversation_id: str | None = None
    thread: Thread | None = None
    # The standing approvals that covered calls of this turn, as each use left them (by
    # id): their cards count the calls (agent/standing.py).
    covered_by: dict[str, Approval] = field(default_factory=dict)
    # Told of each approved call of the turn as soon as its output is recorded, with the
    # approval as it is then (a card can say it ran before the model has answered).
    ran: Callable[[Approval], None] | None = None
    # Told the model's answer as soon as it is the turn's last (it asks for no tool), before
    # the turn is saved: the transport shows it meanwhile rather than after two writes.
    answered: Callable[[str], Awaitable[None]] | None = None


@dataclass(frozen=True)
class Called:
    policy: Policy
    context: Context
    input: dict[str, Any] | None = None  # as the tool's schema validated it (version 1)
    history: History | None = None  # the requester's earlier requests, read with the policy


current_scope: ContextVar[TurnScope | None] = ContextVar("greenlight_turn", default=None)


@contextlib.contextmanager
def scoped(scope: TurnScope) -> Iterator[None]:
    """Run a turn in `scope`: the middleware sees it, and the session store its workspace."""
    token = current_scope.set(scope)
    team_token = current_team.set(scope.team_id)
    try:
        yield
    finally:
        current_team.reset(team_token)
        current_scope.reset(token)
