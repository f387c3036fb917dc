"""Faults at the edges of a turn: the database connection dies mid-write, Gemini errors or
never answers. The user is told, nothing is half-written, the thread stays usable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agent.assemble import build_workflow
from agent.outcomes import AwaitingApproval, Failed, Reply
from agent.policy import PolicyDefaults
from agent.runtime import AgentConfig
from agent.workflow import Workflow
from storage.db import make_engine, make_session_factory
from storage.domain import Thread
from storage.models import ApprovalRow, ConversationRow, MessageRow, SnapshotRow
from tests import ledger_tools
from tests.agent.conftest import IN_CHANNEL, gemini_workflow
from tests.conftest import pg_test_url
from tests.fakes.gemini import FakeGemini, error, text
from tests.fakes.scripted_model import ScriptedModel, calls as scripted_calls, text as scripted_text


@pytest.fixture
async def fault_engine() -> AsyncIterator[AsyncEngine]:
    """An engine of its own, so killing its connections touches no other test."""
    engine = make_engine(pg_test_url())
    yield engine
    await engine.dispose()


def kill_connection_on(engine: AsyncEngine, fragment: str, *, every: bool = False) -> list[str]:
    """Terminate the connection, from the server side, as it runs the first statement that
    contains `fragment` (alone, or inside a larger one, e.g. a CTE); `every`: each one."""
    killed: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _kill(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if (every or not killed) and fragment in " ".join(statement.upper().split()):
            killed.append(statement)
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    return killed


def scripted_workflow(engine: AsyncEngine) -> tuple[Workflow, ScriptedModel]:
    """A workflow on `engine` whose model answers from a script."""
    model = ScriptedModel()
    workflow = build_workflow(
        make_session_factory(engine),
        AgentConfig(model="scripted", tool_modules=("tests.ledger_tools",)),
        defaults=PolicyDefaults(channel="C0APPROVE"),
        setup=model.register,
    )
    return workflow, model


async def count(engine: AsyncEngine, model: Any, team: str) -> int:
    async with make_session_factory(engine)() as db:
        query = select(func.count()).select_from(model).where(model.team_id == team)
        return int((await db.execute(query)).scalar_one())


async def snapshots(engine: AsyncEngine, team: str) -> dict[str, int]:
    async with make_session_factory(engine)() as db:
        rows = (await db.execute(select(SnapshotRow).where(SnapshotRow.team_id == team))).scalars()
        statuses = [str(r.meta.get("status")) for r in rows]
    return {s: statuses.count(s) for s in set(statuses)}


async def assert_every_snapshot_whole(engine: AsyncEngine, team: str) -> None:
    """Each snapshot has exactly the message rows its header promises."""
    async with make_session_factory(engine)() as db:
        for row in (
            await db.execute(select(SnapshotRow).where(SnapshotRow.team_id == team))
        ).scalars():
            query = select(func.count()).where(
                MessageRow.team_id == team, MessageRow.snapshot_id == row.snapshot_id
            )
            stored = (await db.execute(query)).scalar_one()
            assert stored == (row.message_count or 0) - row.inherited, row.snapshot_id


async def test_connection_killed_mid_save_fails_cleanly_and_next_message_works(
    fault_engine: AsyncEngine, pg_engine: AsyncEngine, team: str
) -> None:
    """The snapshot of a turn that pauses goes in with the pause (storage/held_saves.py):
    killed there, neither is written, and the thread continues from before the turn."""
    workflow, model = scripted_workflow(fault_engine)
    thread = Thread(team, "D0FAULT", "1.0")
    model.script(scripted_calls(("transferMoney", {"amount": 5, "toAccount": "12345"})))
    killed = kill_connection_on(fault_engine, "INSERT INTO AGENT_MESSAGES")

    outcome = await workflow.turns.start(thread, "U_EMP", "hello")

    assert killed, "the fault was never injected"
    assert "INSERT INTO APPROVALS" in " ".join(killed[0].upper().split())  # the pause's own
    assert outcome == Failed(thread)
    assert await snapshots(pg_engine, team) == {}  # nothing half-written
    assert await count(pg_engine, ApprovalRow, team) == 0

    model.script(scripted_text("second answer"))
    second = await workflow.turns.start(thread, "U_EMP", "hello again")
    assert second == Reply(thread, "second answer")
    assert await snapshots(pg_engine, team) == {"completed": 1}
    await assert_every_snapshot_whole(pg_engine, team)
    assert await count(pg_engine, ConversationRow, team) == 1
    # The next turn continued from before the failed one, not from its wreckage.
    [request] = model.requests[-1:]
    assert [m.content[0].text for m in request.messages if m.role == "user"] == ["hello again"]


async def test_connection_killed_as_a_reply_is_saved_writes_it_whole_on_the_retry(
    fault_engine: AsyncEngine, pg_engine: AsyncEngine, team: str
) -> None:
    """A reply's snapshot goes in with the thread's release, which is tried again after a
    lost connection: the turn's reply stands, its snapshot whole, and the thread goes on
    from it."""
    workflow, model = scripted_workflow(fault_engine)
    thread = Thread(team, "D0FAULT", "1.5")
    model.script(scripted_text("first answer"))
    killed = kill_connection_on(fault_engine, "INSERT INTO AGENT_MESSAGES")

    assert await workflow.turns.start(thread, "U_EMP", "hello") == Reply(thread, "first answer")

    assert killed and "UPDATE CONVERSATIONS" in " ".join(killed[0].upper().split())
    assert await snapshots(pg_engine, team) == {"completed": 1}
    await assert_every_snapshot_whole(pg_engine, team)
    model.script(scripted_text("second answer"))
    assert await workflow.turns.start(thread, "U_EMP", "again") == Reply(thread, "second answer")
    [request] = model.requests[-1:]
    said = [m.content[0].text for m in request.messages if m.role == "user"]
    assert said == ["hello", "again"]


async def test_a_reply_whose_turn_cannot_be_saved_is_a_failure(
    fault_engine: AsyncEngine, pg_engine: AsyncEngine, team: str
) -> None:
    """The database stays down through every try to free the thread with the reply's
    snapshot: the turn is reported failed (its apology goes under the reply), as a save
    that failed inside Genkit was, and nothing of it was written."""
    workflow, model = scripted_workflow(fault_engine)
    thread = Thread(team, "D0FAULT", "1.6")
    model.script(scripted_text("first answer"))
    killed = kill_connection_on(fault_engine, "INSERT INTO AGENT_MESSAGES", every=True)

    assert await workflow.turns.start(thread, "U_EMP", "hello") == Failed(thread)
    assert len(killed) >= 3
    assert await snapshots(pg_engine, team) == {}


async def test_connection_killed_as_a_resumed_turn_is_saved_leaves_it_for_a_retry(
    fault_engine: AsyncEngine, team: str, ledger: Path
) -> None:
    """The resumed turn's snapshot goes in with its COMPLETE: a connection lost there is a
    failed resume, retried later (the requester told so), as a failed save was before."""
    workflow, model = scripted_workflow(fault_engine)
    thread = Thread(team, "D0FAULT", "1.7")
    model.script(scripted_calls(("transferMoney", {"amount": 5, "toAccount": "12345"})))
    out = await workflow.turns.start(thread, "U_EMP", "send 5")
    assert isinstance(out, AwaitingApproval)
    [approval] = out.approvals
    decided = await workflow.decisions.decide(
        team, approval.id, "U_BOSS", approve=True, facts=IN_CHANNEL
    )
    killed = kill_connection_on(fault_engine, "INSERT INTO AGENT_MESSAGES")
    model.script(scripted_text("sent"))

    resumed = await workflow.turns.resume(decided.turn_id)

    assert killed and "UPDATE TURNS" in " ".join(killed[0].upper().split())
    assert resumed is not None and resumed.outcome == Failed(thread, retrying=True)
    assert len(ledger_tools.entries()) == 1  # the call ran once; a retry answers from its record


async def test_gemini_error_is_reported_and_the_session_stays_usable(
    pg_sessions: Any, team: str
) -> None:
    async with FakeGemini() as gemini:
        workflow = gemini_workflow(pg_sessions, gemini)
        thread = Thread(team, "D0FAULT", "2.0")
        gemini.script(text("hi there"), error(503, "overloaded"), text("back again"))
        assert await workflow.turns.start(thread, "U_EMP", "hi") == Reply(thread, "hi there")
        failed = await workflow.turns.start(thread, "U_EMP", "still there?")
        assert failed == Failed(thread, model_unavailable=True)
        assert await workflow.turns.start(thread, "U_EMP", "now?") == Reply(thread, "back again")
        # The failed turn left no trace in what the model sees next.
        last = gemini.generate_requests()[-1].json
        assert last is not None
        contents = last["contents"]
        assert [c["parts"][0]["text"] for c in contents if c["role"] == "user"] == ["hi", "now?"]


async def test_a_model_that_never_answers_times_out_and_frees_the_thread(
    pg_sessions: Any, team: str
) -> None:
    async with FakeGemini() as gemini:
        workflow = gemini_workflow(pg_sessions, gemini, timeout=0.5)
        thread = Thread(team, "D0FAULT", "3.0")
        gemini.script(text("too late", delay=5), text("on time"))
        failed = await workflow.turns.start(thread, "U_EMP", "slow?")
        assert failed == Failed(thread, model_unavailable=True)  # it never answered
        assert await workflow.turns.start(thread, "U_EMP", "again") == Reply(thread, "on time")


async def test_pooled_connections_killed_while_idle_are_replaced_before_the_next_turn(
    fault_engine: AsyncEngine, pg_engine: AsyncEngine, team: str
) -> None:
    """A database restart or pg_terminate_backend between turns costs no turn."""
    workflow, model = scripted_workflow(fault_engine)
    thread = Thread(team, "D0FAULT", "4.0")
    model.script(scripted_text("first answer"), scripted_text("second answer"))
    assert await workflow.turns.start(thread, "U_EMP", "hello") == Reply(thread, "first answer")
    async with fault_engine.connect() as conn:
        pid = (await conn.execute(select(func.pg_backend_pid()))).scalar_one()
        hung_up = asyncio.Event()
        pooled = (await conn.get_raw_connection()).driver_connection
        assert pooled is not None
        pooled.add_termination_listener(lambda _conn: hung_up.set())
    async with pg_engine.connect() as admin:
        assert (await admin.execute(select(func.pg_terminate_backend(pid)))).scalar_one()
    async with asyncio.timeout(5):  # until this process has seen the server hang up
        await hung_up.wait()

    assert await workflow.turns.start(thread, "U_EMP", "again") == Reply(thread, "second answer")
