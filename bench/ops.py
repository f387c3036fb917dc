"""Where the bot's CPU goes, measured directly: each workflow step, in process, on its own.

    python -m bench.ops [--database-url URL] [--n 200]

Profilers mislead here: cProfile loses track across SQLAlchemy's greenlet switches, and
py-spy counts a thread preempted right after waking PostgreSQL as busy. So instead each
step the bot takes per conversation is timed in a loop by process CPU time
(`time.process_time`, this process only: PostgreSQL's own CPU is not in it) against a real
PostgreSQL, with a model that answers in-process (no HTTP) and no Slack at all:

- the storage reads and writes the listeners and the workflow make, one by one;
- a new connection against a pooled one, with PostgreSQL's CPU for it (read from /proc when
  the server runs on this machine): what a pool that overflows under load pays each time;
- the agent's two turns through Workflow (start_turn + decide + continue_turn), and the
  same two turns through a bare Genkit agent (InMemorySessionStore, stock ToolApproval),
  so the difference is what the database work costs;
- two of the places storage runs its fast form, each against the plain form of it, which
  is what the README's Performance section quotes: a read on the driver, on a Core
  connection or in a transaction, a new Genkit snapshot as one statement or in the locked
  transaction. (The third, an Atomic as one statement or as a transaction, was measured
  while SQLite still ran the transaction; storage has only the one statement now.)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from genkit.exp import (
    AgentFinishReason,
    Genkit,
    InMemorySessionStore,
    SessionSnapshot,
    SessionState,
    SnapshotStatus,
)
from genkit.model import ModelRequest, ModelResponse
from genkit_middleware import ToolApproval
from sqlalchemy.pool import NullPool

from agent.assemble import build_workflow
from agent.clock import utc_now
from agent.limits import MessageLimits
from agent.outcomes import AwaitingApproval
from agent.policy import ApproverFacts, PolicyDefaults
from agent.runtime import AgentConfig
from bench.database import temporary_database
from bench.harness import postgres_cpu
from storage import rows, turns
from storage.db import SessionFactory, autocommit, make_engine, make_session_factory
from storage.domain import Approval, Card, PausedTurn, Request, Thread
from storage.session_store import SqlSessionStore
from tests.fakes import scripted_model as sm

RESULTS = Path(__file__).parent / "results-ops.json"
TEAM = f"TOPS{uuid.uuid4().hex[:6].upper()}"
CHANNEL = "C0OPSAPPR"


def reply(request: ModelRequest[Any]) -> ModelResponse:
    """transferMoney for a user message, text after the tool's response."""
    if sm.tool_responses(request):
        return sm.text("Done.")
    return sm.calls(("transferMoney", {"amount": 5, "toAccount": "12345"}))


def scripted(ai: Genkit) -> None:
    async def model_fn(request: ModelRequest[Any], ctx: Any) -> ModelResponse:
        return reply(request)

    ai.define_model(name="bench", fn=model_fn)


# Each fast form and the plain form it is compared with.
FORMS = {
    "approval read": ("autocommit (on the driver)", "a Core connection in autocommit"),
    "new snapshot (10 messages)": ("one statement", "the locked transaction"),
}


async def cpu_ms(step: Callable[[int], Awaitable[Any]], n: int) -> dict[str, float]:
    """Median of 5 batches of CPU ms per call, after a warm-up batch."""
    for i in range(max(3, n // 10)):
        await step(-1 - i)
    batches = []
    size = max(1, n // 5)
    for b in range(5):
        gc.collect()
        t0, w0 = time.process_time(), time.perf_counter()
        for i in range(size):
            await step(b * size + i)
        batches.append(((time.process_time() - t0) / size, (time.perf_counter() - w0) / size))
    return {
        "cpu_ms": round(statistics.median(c for c, _ in batches) * 1000, 3),
        "wall_ms": round(statistics.median(w for _, w in batches) * 1000, 3),
    }


async def run(database_url: str | None = None, n: int = 200) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with temporary_database(database_url) as url:
        engine = make_engine(url)
        sessions = make_session_factory(engine)
        config = AgentConfig(model="bench", tool_modules=("agent.example_tools",))
        workflow = build_workflow(
            sessions,
            config,
            defaults=PolicyDefaults(channel=CHANNEL, timeout=timedelta(hours=1)),
            setup=scripted,
        )
        run_id = uuid.uuid4().hex[:8]

        def thread(i: int) -> Thread:
            return Thread(TEAM, "D0OPS", f"{run_id}.{i + 10_000_000}")

        async def paused(i: int) -> AwaitingApproval:
            out = await workflow.turns.start(thread(i), "UEMP", "send 5 to 12345")
            assert isinstance(out, AwaitingApproval), out
            return out

        # One approval to read over and over.
        sample = (await paused(-100)).approvals[0]

        limits = MessageLimits(sessions, clock=utc_now, per_user=10**9, per_team=10**9)

        async def seen_event(i: int) -> None:
            await limits.admit(TEAM, "UEMP", event_id=f"Ev{run_id}{i}")

        async def approval(i: int) -> None:
            await workflow.reads.approval(TEAM, sample.id)

        async def policy(i: int) -> None:
            await workflow.policies.get(TEAM, "transferMoney")

        async def select_1(i: int) -> None:
            async with engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")

        fresh = make_engine(url, poolclass=NullPool)

        async def new_connection(i: int) -> None:
            async with fresh.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")

        steps: dict[str, Callable[[int], Awaitable[Any]]] = {
            "engine.connect + SELECT 1 (the floor)": select_1,
            "a new connection + SELECT 1 (what a pool's overflow costs)": new_connection,
            "limits.admit of an event (dedup insert + count)": seen_event,
            "workflow.approval (approval + turn + conversation)": approval,
            "policies.get": policy,
        }
        for name, step in steps.items():
            results[name] = await cpu_ms(step, n)
        pg_before = postgres_cpu()  # None unless PostgreSQL runs on this machine
        for i in range(n):
            await new_connection(i)
        if pg_before is not None and (pg_after := postgres_cpu()) is not None:
            results["a new connection + SELECT 1 (what a pool's overflow costs)"][
                "postgres_cpu_ms"
            ] = round((pg_after - pg_before) * 1000 / n, 3)
        await fresh.dispose()

        start_ids: dict[int, AwaitingApproval] = {}

        async def start_turn(i: int) -> None:
            start_ids[i] = await paused(i)

        results["workflow.start_turn → interrupt (turn 1)"] = await cpu_ms(start_turn, n)

        async def decide(i: int) -> None:
            await workflow.decisions.decide(
                TEAM,
                start_ids[i].approvals[0].id,
                "UBOSS",
                approve=True,
                facts=ApproverFacts(in_channel=True),
            )

        results["workflow.decide"] = await cpu_ms(decide, n)

        async def resume(i: int) -> None:
            resumed = await workflow.turns.resume(start_ids[i].approvals[0].turn_id)
            assert resumed is not None

        results["workflow.continue_turn → reply (turn 2)"] = await cpu_ms(resume, n)
        results |= await postgres_forms(sessions, sample, n)
        await engine.dispose()

    # The same two turns with no database: Genkit alone.
    ai = Genkit()
    scripted(ai)
    from agent.example_tools import register

    agent = ai.define_agent(
        name="bare",
        model="bench",
        system="s",
        tools=register(ai),
        use=[ToolApproval()],
        store=InMemorySessionStore(),
    )

    async def bare(i: int) -> None:
        out = await agent.chat().send("send 5 to 12345")
        assert out.finish_reason == AgentFinishReason.INTERRUPTED
        chat = agent.chat(snapshot_id=out.snapshot_id)
        meta = {"toolApproved": True}
        done = await chat.resume(restart=[out.interrupts[0].restart(resumed_metadata=meta)])
        assert done.text

    results["bare Genkit: both turns, InMemorySessionStore"] = await cpu_ms(bare, n)

    two = ("workflow.start_turn → interrupt (turn 1)", "workflow.continue_turn → reply (turn 2)")
    ours = sum(results[k]["cpu_ms"] for k in (*two, "workflow.decide"))
    summary: dict[str, float] = {
        "workflow_cpu_ms_per_conversation": round(ours, 2),
        "bare_genkit_cpu_ms_per_conversation": results[
            "bare Genkit: both turns, InMemorySessionStore"
        ]["cpu_ms"],
    }
    for form in ("approval read", "new snapshot (10 messages)"):
        fast, plain = (results[f"{form}: {how}"] for how in FORMS[form])
        summary[f"{form}: saved by the fast form, wall ms"] = round(
            plain["wall_ms"] - fast["wall_ms"], 2
        )
    out = {"n": n, "steps": results, "summary": summary}
    width = max(len(k) for k in results) + 2
    print(f"{'step (in process, sequential)':<{width}}{'CPU ms':>9}{'wall ms':>9}{'PG CPU':>9}")
    for name, r in results.items():
        pg = f"{r['postgres_cpu_ms']:>9.2f}" if "postgres_cpu_ms" in r else ""
        print(f"{name:<{width}}{r['cpu_ms']:>9.2f}{r['wall_ms']:>9.2f}{pg}")
    print(json.dumps(summary))
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    return out


async def postgres_forms(
    sessions: SessionFactory, sample: Approval, n: int
) -> dict[str, dict[str, float]]:
    """Storage's fast forms against the plain ones (and a pause, as the one statement)."""
    out: dict[str, dict[str, float]] = {}
    thread = sample.thread
    held = await turns.TurnStore(sessions).hold_thread(
        Thread(TEAM, "D0FORMS", "1.1"),
        author="UEMP",
        new_id=str(uuid.uuid4()),
        now=utc_now(),
        until=utc_now(),
    )
    assert held is not None

    def pause() -> Callable[[int], Awaitable[Any]]:
        async def step(i: int) -> None:
            now = utc_now()
            turn = PausedTurn(str(uuid.uuid4()), held.conversation_id, thread, "s", "p", now)
            request = Request("transferMoney", "r", {"amount": 5}, "UEMP", "why", now, now)
            approval = Approval(str(uuid.uuid4()), turn.id, thread, request, card=Card(CHANNEL))
            params = turns.pause_params(turn, [approval])
            await turns.paused_turn(1).run(sessions, params)

        return step

    out["pause (turn, approval, audit row): one statement"] = await cpu_ms(pause(), n)

    key = {"team": TEAM, "row_id": sample.id}

    async def read_alone(i: int) -> None:
        async with autocommit(sessions) as db:
            await db.execute(rows.GET, key)

    async def read_on_core(i: int) -> None:
        async with sessions.kw["bind"].connect() as conn:
            alone = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await alone.execute(rows.GET, key)

    async def read_in_transaction(i: int) -> None:
        async with sessions.begin() as db:
            await db.execute(rows.GET, key)

    out["approval read: autocommit (on the driver)"] = await cpu_ms(read_alone, n)
    out["approval read: a Core connection in autocommit"] = await cpu_ms(read_on_core, n)
    out["approval read: a transaction"] = await cpu_ms(read_in_transaction, n)
    out["approval read: the same SQL on asyncpg's own pool"] = await on_asyncpg(
        sessions, rows.GET, key, n
    )

    store = SqlSessionStore(sessions)
    history = [sm.text(f"message {i} " + "x" * 400).message for i in range(10)]

    def snapshot(locked: bool) -> Callable[[int], Awaitable[Any]]:
        async def step(i: int) -> None:
            sid = str(uuid.uuid4())
            state = SessionState(session_id=sid, messages=history)
            snap = SessionSnapshot(
                snapshot_id=sid,
                parent_id="",
                status=SnapshotStatus.COMPLETED,
                state=state,
                created_at=utc_now().isoformat(),
            )
            if locked:  # the transaction an existing row takes (the store's private path)
                await store._save_locked(TEAM, sid, lambda _: snap)
            else:
                await store.save_snapshot(sid, lambda _: snap, context={"team_id": TEAM})

        return step

    out["new snapshot (10 messages): one statement"] = await cpu_ms(snapshot(False), n)
    out["new snapshot (10 messages): the locked transaction"] = await cpu_ms(snapshot(True), n)
    return out


async def on_asyncpg(
    sessions: SessionFactory, statement: Any, params: dict[str, Any], n: int
) -> dict[str, float]:
    """`statement` as SQLAlchemy compiles it, run by asyncpg itself from its own pool: the
    floor for a statement on the driver (storage/driver.py runs it on SQLAlchemy's pool)."""
    import asyncpg  # type: ignore[import-untyped]

    engine = sessions.kw["bind"]
    compiled = statement.compile(dialect=engine.dialect)
    sql, names = compiled.string, list(compiled.positiontup or ())
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    async with asyncpg.create_pool(url, min_size=1, max_size=2) as pool:

        async def step(i: int) -> None:
            async with pool.acquire() as conn:
                await conn.fetch(sql, *(params[name] for name in names))

        return await cpu_ms(step, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(run(args.database_url, args.n))


if __name__ == "__main__":
    main()
