"""Recovery in seconds, in one process on the test PostgreSQL: the lease's heartbeat through a
dropped connection, resumes and first turns let go of when shutdown cuts them off, and
approved calls under their own timeout rather than the model-turn timeout.

The crash and shutdown of whole processes, on default settings, are in tests/bot/test_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest
from genkit.model import ModelRequest, ModelResponse
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from agent.assemble import build_workflow
from agent.gate import UNKNOWN_OUTCOME, ToolTimeouts, cut_off
from agent.observer import Observer
from agent.outcomes import AwaitingApproval, Reply, Resumed
from agent.policy import PolicyDefaults
from agent.runtime import AgentConfig
from agent.workflow import Workflow
from storage.db import make_engine, make_session_factory
from storage.domain import Approved, Finished, Started, Thread, TurnState
from storage.models import TurnRow
from tests import ledger_tools
from tests.agent.conftest import IN_CHANNEL, Recorder
from tests.conftest import pg_test_url, poll
from tests.fakes.scripted_model import ScriptedModel, calls, text, tool_responses

pytestmark = pytest.mark.usefixtures("ledger")


def echo(request: ModelRequest[Any]) -> ModelResponse:
    return text("results: " + repr(tool_responses(request)))


@pytest.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    """An engine of its own, so killing its connections touches no other test."""
    engine = make_engine(pg_test_url())
    yield engine
    await engine.dispose()


def workflow(
    engine: AsyncEngine,
    model: ScriptedModel,
    *,
    lease: float = 15,
    turn_timeout: float = 300,
    tool_timeouts: ToolTimeouts | None = None,
    observer: Observer | None = None,
) -> Workflow:
    return build_workflow(
        make_session_factory(engine),
        AgentConfig(model="scripted", tool_modules=("tests.ledger_tools",)),
        defaults=PolicyDefaults(channel="C0APPROVE"),
        setup=model.register,
        lease=timedelta(seconds=lease),
        turn_timeout=timedelta(seconds=turn_timeout),
        tool_timeouts=tool_timeouts or ToolTimeouts(),
        observer=observer,
    )


async def approved_transfer(w: Workflow, team: str, to: str, ts: str = "1.1") -> str:
    """A turn that asks for one transfer to `to`, approved; its turn id."""
    out = await w.turns.start(Thread(team, "D0RECOVER", ts), "U_EMP", f"send 500 to {to}")
    assert isinstance(out, AwaitingApproval), out
    [approval] = out.approvals
    decided = await w.decisions.decide(team, approval.id, "U_BOSS", approve=True, facts=IN_CHANNEL)
    assert decided.turn_ready
    return decided.turn_id


def transfer(to: str) -> ModelResponse:
    return calls(("transferMoney", {"amount": 500, "toAccount": to}))


def ledger(tool: str = "transferMoney") -> list[dict[str, object]]:
    return [e for e in ledger_tools.entries() if e["tool"] == tool]


class SlowModel:
    """A model call that answers only once the test lets it. Genkit finishes a turn whose
    consumer was cancelled in the background, so each test lets it end before it ends."""

    def __init__(self) -> None:
        self.answering = asyncio.Event()
        self.release = asyncio.Event()
        self.done = False

    async def __call__(self, request: ModelRequest[Any]) -> ModelResponse:
        self.answering.set()
        await self.release.wait()
        self.done = True
        return text("too late")

    async def finish(self) -> None:
        self.release.set()
        await poll(lambda: self.done, "the cut-off model call's end", timeout=10)


async def turn_row(engine: AsyncEngine, turn_id: str) -> TurnRow:
    async with make_session_factory(engine)() as db:
        return await db.get_one(TurnRow, turn_id)


def renewals(engine: AsyncEngine, do: Callable[[Any], None], times: int) -> list[str]:
    """Do `do(cursor)` instead of the first `times` lease renewals; the ones it did."""
    done: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _renew(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        changes = statement.upper().split(" WHERE ")[0]
        # RENEW is the one write of a turn that sets its lease and nothing else.
        renew = changes.startswith("UPDATE TURNS SET") and "UPDATED_AT" not in changes
        if renew and len(done) < times:
            done.append(statement)
            do(cursor)

    return done


def kill_connection(cursor: Any) -> None:
    cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


async def test_a_tool_that_runs_longer_than_the_turn_timeout_is_not_cut_off(
    engine: AsyncEngine, team: str
) -> None:
    model = ScriptedModel()
    model.script(transfer("slow-1.5"), echo)
    w = workflow(engine, model, turn_timeout=0.5)  # the model answers at once; the tool won't
    turn_id = await approved_transfer(w, team, "slow-1.5")

    resumed = await w.turns.resume(turn_id)

    assert resumed is not None and isinstance(resumed.outcome, Reply), resumed
    [settled] = resumed.settled
    assert isinstance(settled.execution, Finished)
    assert settled.execution.output == {"success": True, "transactionId": f"txn-{settled.id}"}
    assert len(ledger()) == 1 and len(ledger("transferMoney:finished")) == 1


async def test_a_tool_past_its_own_timeout_is_stopped_and_its_outcome_is_unknown(
    engine: AsyncEngine, team: str
) -> None:
    model = ScriptedModel()
    model.script(transfer("slow-30"), echo)
    limits = ToolTimeouts(timedelta(minutes=15), {"transferMoney": timedelta(seconds=0.5)})
    seen = Recorder()
    w = workflow(engine, model, tool_timeouts=limits, observer=seen)
    turn_id = await approved_transfer(w, team, "slow-30")

    async with asyncio.timeout(10):  # stopped at 0.5 s, not after 30
        resumed = await w.turns.resume(turn_id)

    assert resumed is not None and isinstance(resumed.outcome, Reply), resumed
    [response] = tool_responses(model.requests[-1])
    assert response["output"] == cut_off("transferMoney", 0.5)  # the model is told
    [settled] = resumed.settled
    # It started and never finished: "outcome unknown" on the card, and never run again.
    assert isinstance(settled.decision, Approved) and isinstance(settled.execution, Started)
    assert len(ledger()) == 1 and ledger("transferMoney:finished") == []
    assert seen.executions == [("transferMoney", "unknown")]  # counted once, at the turn's end
    assert await w.turns.resume(turn_id) is None
    assert "outcome is unknown" in str(cut_off("transferMoney", 0.5))
    assert "time limit" in str(UNKNOWN_OUTCOME)  # what a later resume would say of it


async def test_the_heartbeat_survives_dropped_connections_and_the_turn_completes_once(
    engine: AsyncEngine, pg_engine: AsyncEngine, team: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The tool outlives the lease; its first two renewals die with their connection. The
    heartbeat retries, the lease never lapses, and a replica sweeping all along takes nothing
    (had it, the tool still running would have been reported as an unknown outcome)."""
    model = ScriptedModel()
    model.script(transfer("slow-6"), echo)
    w = workflow(engine, model, lease=4.5)  # renewed every 1.5 s; a failed one after 1 s
    turn_id = await approved_transfer(w, team, "slow-6")
    killed = renewals(engine, kill_connection, times=2)

    replica_model = ScriptedModel()
    replica = workflow(pg_engine, replica_model, lease=4.5)
    taken: list[object] = []

    async def sweep_all_along() -> None:
        while True:
            taken.extend((await replica.follow_ups.sweep(team)).resumed)
            await asyncio.sleep(0.2)  # a replica's sweep interval

    caplog.set_level(logging.WARNING, logger="agent.workflow")
    sweeper = asyncio.create_task(sweep_all_along())
    try:
        async with asyncio.timeout(30):
            resumed = await w.turns.resume(turn_id)
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper

    assert len(killed) == 2, "the renewals were never cut off"
    assert caplog.text.count("could not renew the lease") == 2
    assert taken == [] and replica_model.requests == []
    assert resumed is not None and isinstance(resumed.outcome, Reply), resumed
    [response] = tool_responses(model.requests[-1])
    assert response["output"] == {"success": True, "transactionId": f"txn-{resumed.settled[0].id}"}
    assert len(ledger()) == 1
    row = await turn_row(engine, turn_id)
    assert (row.state, row.attempts) == (TurnState.DONE, 1)


async def test_a_hanging_renewal_times_out_and_is_retried_before_the_lease_lapses(
    engine: AsyncEngine, pg_engine: AsyncEngine, team: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The first renewal hangs (a stalled connection) far past the lease. It is given up
    after a third of the lease and retried, the lease never lapses, and a replica sweeping
    all along takes nothing."""
    model = ScriptedModel()
    model.script(transfer("slow-6"), echo)
    w = workflow(engine, model, lease=4.5)  # renewed every 1.5 s; a failed one after 1 s
    turn_id = await approved_transfer(w, team, "slow-6")
    hung = renewals(engine, lambda cursor: cursor.execute("SELECT pg_sleep(20)"), times=1)
    replica_model = ScriptedModel()
    replica = workflow(pg_engine, replica_model, lease=4.5)
    taken: list[object] = []

    async def sweep_all_along() -> None:
        while True:
            taken.extend((await replica.follow_ups.sweep(team)).resumed)
            await asyncio.sleep(0.2)

    caplog.set_level(logging.WARNING, logger="agent.workflow")
    sweeper = asyncio.create_task(sweep_all_along())
    try:
        async with asyncio.timeout(30):
            resumed = await w.turns.resume(turn_id)
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper

    assert len(hung) == 1, "no renewal hung"
    assert "could not renew the lease" in caplog.text
    assert taken == [] and replica_model.requests == []
    assert resumed is not None and isinstance(resumed.outcome, Reply), resumed
    assert len(ledger()) == 1
    row = await turn_row(engine, turn_id)
    assert (row.state, row.attempts) == (TurnState.DONE, 1)


async def test_a_resume_that_loses_its_lease_stops(
    engine: AsyncEngine, pg_engine: AsyncEngine, team: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every renewal fails, the lease runs out and a replica takes the turn over. The first
    resume stops there (cancelled), rather than running on beside the replica's."""
    slow = SlowModel()
    model = ScriptedModel()
    model.script(transfer("12345"), slow)
    w = workflow(engine, model, lease=1.5)  # renewed every 0.5 s
    turn_id = await approved_transfer(w, team, "12345")
    renewals(engine, kill_connection, times=100)
    caplog.set_level(logging.ERROR, logger="agent.workflow")
    resume = asyncio.create_task(w.turns.resume(turn_id))
    try:
        async with asyncio.timeout(10):
            await slow.answering.wait()  # the tool ran; the model is answering
        replica_model = ScriptedModel()
        replica_model.script(echo)
        replica = workflow(pg_engine, replica_model, lease=1.5)
        taken: list[object] = []
        async with asyncio.timeout(10):
            while not taken:  # a replica's sweeps, until the lease has run out
                await asyncio.sleep(0.1)
                taken.extend((await replica.follow_ups.sweep(team)).resumed)
            # It stops by itself: the model it waits on never answers.
            assert await resume is None
    finally:
        await slow.finish()
    assert "lost its lease; its resume stopped" in caplog.text
    [resumed] = taken
    assert isinstance(resumed, Resumed) and isinstance(resumed.outcome, Reply)
    assert len(ledger()) == 1
    row = await turn_row(engine, turn_id)
    assert (row.state, row.attempts) == (TurnState.DONE, 2)


async def test_a_resume_cut_off_by_shutdown_is_let_go_and_the_next_sweep_takes_it_at_once(
    pg_engine: AsyncEngine, team: str
) -> None:
    engine = pg_engine  # alive for as long as the cut-off turn's background may write
    slow = SlowModel()

    model = ScriptedModel()
    model.script(transfer("12345"), slow)
    w = workflow(engine, model)  # the default lease: 15 s
    turn_id = await approved_transfer(w, team, "12345")
    resume = asyncio.create_task(w.turns.resume(turn_id))
    async with asyncio.timeout(10):
        await slow.answering.wait()  # the tool ran; the model is answering
    resume.cancel()  # what Background.drain does once the shutdown grace is over
    with pytest.raises(asyncio.CancelledError):
        await resume
    row = await turn_row(engine, turn_id)
    assert (row.state, row.lease_until) == (TurnState.WAITING, None)

    replica_model = ScriptedModel()
    replica_model.script(echo)
    report = await workflow(pg_engine, replica_model).follow_ups.sweep(team)  # no lease to wait out
    [resumed] = report.resumed
    assert isinstance(resumed.outcome, Reply)
    [response] = tool_responses(replica_model.requests[-1])
    assert response["output"] == {"success": True, "transactionId": f"txn-{resumed.settled[0].id}"}
    assert len(ledger()) == 1
    row = await turn_row(engine, turn_id)
    assert (row.state, row.attempts) == (TurnState.DONE, 2)
    await slow.finish()


async def test_a_first_turn_cut_off_by_shutdown_frees_its_thread(
    pg_engine: AsyncEngine, team: str
) -> None:
    engine = pg_engine
    slow = SlowModel()

    model = ScriptedModel()
    model.script(slow, text("here now"))
    w = workflow(engine, model)
    thread = Thread(team, "D0RECOVER", "2.1")
    turn = asyncio.create_task(w.turns.start(thread, "U_EMP", "hello"))
    async with asyncio.timeout(10):
        await slow.answering.wait()
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    # Not "busy" for the turn timeout: the next message runs at once.
    assert await w.turns.start(thread, "U_EMP", "hello?") == Reply(thread, "here now")
    assert len(model.requests) == 2
    await slow.finish()
