"""Session-store benchmark: bytes and time per save as a conversation grows.

Simulates a 200-turn conversation (500-character user and model turns, a tool call and its
response every 5th turn) saved the way Genkit's agent runtime saves it: one new snapshot per
turn, parented on the previous one, holding the whole state. Runs it against
`SqlSessionStore` and Genkit's `FileSessionStore` and `InMemorySessionStore`, and, with the
`bench` extra installed, the same messages through LangGraph's `AsyncPostgresSaver` on the same
database: a checkpoint per turn whose `messages` channel (the whole list) gets a new version.

What is timed, per save. For Genkit's stores and ours, `save_snapshot` whole ("ms"), and the
same less the time in Genkit's mutator ("store ms"): the runtime's own work of building the
SessionSnapshot, which revalidates every message (2-3 ms by turn 200). LangGraph's runtime
builds its checkpoint before `aput`, outside the timer, and nothing in `aput` compares; so
like for like is our store ms against LangGraph's ms, and that is what the target compares.
The rest of each store's work is inside the timer: ours reads the row (Genkit's save is a
read-modify-write), serializes and hashes the whole list to prove the inherited prefix, and
writes; LangGraph's serializes the whole list (in a thread) and writes it. LangGraph gets the
messages as plain dicts, its cheapest input (an app's LangChain messages cost more to
serialize), which if anything favours it. And each timed save comes right after measuring
the previous one's bytes (for both SQL stores, a small query): on a small VM a round trip
straight after a burst of CPU work is slower (here by up to 1 ms at turn 200), and the burst
before our save would be Genkit's deep copy of the state, untimed, with no counterpart in
LangGraph's loop. The mutator's own burst, between our read and our write, still counts.

    python -m bench.session_store [--database-url URL]

Without a URL it creates a temporary PostgreSQL database on 127.0.0.1:5432, migrates it and
drops it afterwards. With one, it migrates that database to head and leaves it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from genkit import Part, Role
from genkit.exp import (
    FileSessionStore,
    InMemorySessionStore,
    SessionSnapshot,
    SessionState,
    SessionStore,
    SnapshotStatus,
)
from genkit.model import Message
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.database import temporary_database
from storage.db import make_engine, make_session_factory
from storage.models import MessageRow, SnapshotRow
from storage.session_store import SqlSessionStore

try:  # the `bench` extra: pip install -e '.[bench]'
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
except ImportError:
    AsyncPostgresSaver = None  # type: ignore[assignment,misc,unused-ignore]

RESULTS = Path(__file__).parent / "results-session-store.json"
TURNS, REPS, CHARS, MARKS = 200, 5, 500, (1, 50, 200)
TEAM = {"team_id": "TBENCH"}

Measure = Callable[[str, SessionSnapshot], Awaitable[int]]


def _text(rng: random.Random, n: int) -> str:
    words = ("deploy", "staging", "rollback", "approve", "ledger", "invoice", "status", "ok")
    out = ""
    while len(out) < n:
        out += rng.choice(words) + " "
    return out[:n]


def conversation(seed: int) -> list[list[Message]]:
    """The messages each turn adds: user, [tool request, tool response,] model."""
    rng, turns = random.Random(seed), []
    for t in range(1, TURNS + 1):
        msgs = [Message(role=Role.USER, content=[Part(text=_text(rng, CHARS))])]
        if t % 5 == 0:
            req = {"name": "lookup", "ref": f"call-{t}", "input": {"query": _text(rng, 60)}}
            res = {"name": "lookup", "ref": f"call-{t}", "output": {"rows": _text(rng, 300)}}
            msgs.append(Message(role=Role.MODEL, content=[Part(tool_request=req)]))
            msgs.append(Message(role=Role.TOOL, content=[Part(tool_response=res)]))
        msgs.append(Message(role=Role.MODEL, content=[Part(text=_text(rng, CHARS))]))
        turns.append(msgs)
    return turns


async def simulate(store: SessionStore[Any], measure: Measure, seed: int) -> dict[str, Any]:
    """One conversation: per save its time, the part of it spent in Genkit's mutator, bytes."""
    gc.collect()  # the previous run's garbage is not this run's cost
    session_id, parent, history = str(uuid.uuid4()), "", []
    times, in_fn, sizes, last = [], [], [], None
    for added in conversation(seed):
        history.extend(added)
        # The runtime hands the store a deep copy of the session state (not timed here).
        state = SessionState(session_id=session_id, messages=history).model_copy(deep=True)
        sid, now, spent = str(uuid.uuid4()), datetime.now(UTC).isoformat(), [0.0]

        def make_snap(
            existing: SessionSnapshot | None,
            sid: str = sid,
            parent: str = parent,
            state: SessionState = state,
            now: str = now,
            spent: list[float] = spent,
        ) -> SessionSnapshot:  # as Genkit's runtime builds it (maybe_snapshot)
            start = time.perf_counter()
            snap = SessionSnapshot(
                snapshot_id=existing.snapshot_id if existing else sid,
                parent_id=parent,
                status=SnapshotStatus.COMPLETED,
                state=state,
                created_at=existing.created_at if existing and existing.created_at else now,
            )
            spent[0] += time.perf_counter() - start
            return snap

        if last is not None:  # just before the timed call (see the module docstring)
            sizes.append(await measure(*last))
        start = time.perf_counter()
        saved = await store.save_snapshot(sid, make_snap, context=TEAM)
        times.append(time.perf_counter() - start)
        in_fn.append(spent[0])
        assert saved is not None
        last, parent = (sid, saved), sid
    assert last is not None
    sizes.append(await measure(*last))
    loads = []
    for _ in range(3):
        start = time.perf_counter()
        leaf = await store.get_snapshot(session_id=session_id, context=TEAM)
        loads.append(time.perf_counter() - start)
    assert leaf is not None and leaf.state is not None and leaf.snapshot_id == parent
    assert len(leaf.state.messages or []) == len(history)
    own = [t - f for t, f in zip(times, in_fn, strict=True)]
    return {"times": times, "own": own, "sizes": sizes, "load": statistics.median(loads)}


# What one LangGraph save wrote: the checkpoint row's JSON, the channel's new blob, any writes.
LG_BYTES = """
SELECT (SELECT octet_length(checkpoint::text) + octet_length(metadata::text) FROM checkpoints
        WHERE thread_id = %(t)s AND checkpoint_ns = '' AND checkpoint_id = %(c)s)
     + (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_blobs
        WHERE thread_id = %(t)s AND checkpoint_ns = '' AND channel = 'messages' AND version = %(v)s)
     + (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_writes
        WHERE thread_id = %(t)s AND checkpoint_ns = '' AND checkpoint_id = %(c)s) AS n
"""


async def _langgraph_bytes(saver: Any, params: dict[str, Any]) -> int:
    return int((await (await saver.conn.execute(LG_BYTES, params)).fetchone())["n"])


async def simulate_langgraph(saver: Any, seed: int) -> dict[str, Any]:
    """The same conversation as a LangGraph app checkpoints it: add_messages hands the loop a
    new list each turn, the `messages` channel gets a new version, and `aput` stores it whole."""
    gc.collect()
    thread = {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}
    config: dict[str, Any] = {"configurable": thread}
    base, version, history = empty_checkpoint(), None, list[dict[str, Any]]()
    times, sizes, last = [], [], None
    for step, added in enumerate(conversation(seed)):
        dumped = [m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in added]
        history = [*history, *dumped]
        version = saver.get_next_version(version, None)
        base["channel_values"] = {"messages": history}
        base["channel_versions"] = {"messages": version}
        checkpoint = create_checkpoint(base, None, step)
        metadata = {"source": "loop", "step": step, "parents": {}}
        if last is not None:  # just before the timed call, as for the other stores
            sizes.append(await _langgraph_bytes(saver, last))
        start = time.perf_counter()
        config = await saver.aput(config, checkpoint, metadata, {"messages": version})
        times.append(time.perf_counter() - start)
        last = {"t": thread["thread_id"], "c": checkpoint["id"], "v": version}
    assert last is not None
    sizes.append(await _langgraph_bytes(saver, last))
    loads = []
    for _ in range(3):
        start = time.perf_counter()
        got = await saver.aget_tuple({"configurable": thread})  # no checkpoint_id: the latest
        loads.append(time.perf_counter() - start)
    assert got is not None and got.checkpoint["id"] == config["configurable"]["checkpoint_id"]
    assert got.checkpoint["channel_values"]["messages"] == history
    return {"times": times, "own": times, "sizes": sizes, "load": statistics.median(loads)}


def sql_measure(engine: AsyncEngine) -> Measure:
    """Bytes of the JSON payloads the save wrote: the snapshot's meta and its new messages."""
    sessions = make_session_factory(engine)

    async def measure(sid: str, _: SessionSnapshot) -> int:
        async with sessions() as s:
            key = (SnapshotRow.team_id == TEAM["team_id"], SnapshotRow.snapshot_id == sid)
            meta = await s.scalar(select(SnapshotRow.meta).where(*key))
            mkey = (MessageRow.team_id == TEAM["team_id"], MessageRow.snapshot_id == sid)
            data = (await s.scalars(select(MessageRow.data).where(*mkey))).all()
        return sum(len(json.dumps(d).encode()) for d in [meta, *data])

    return measure


def file_measure(store: FileSessionStore[Any]) -> Measure:
    async def measure(sid: str, _: SessionSnapshot) -> int:
        return (await asyncio.to_thread(os.stat, store.path(sid))).st_size

    return measure


async def memory_measure(_: str, snap: SessionSnapshot) -> int:
    return len(snap.model_dump_json().encode())


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repetitions, at the marked turns."""

    def at(key: str, turn: int) -> float:
        return float(statistics.median(r[key][turn - 1] for r in runs))

    return {
        "bytes": {t: int(at("sizes", t)) for t in MARKS},
        "time_ms": {t: round(at("times", t) * 1000, 3) for t in MARKS},
        # The same minus the time spent in Genkit's mutator (building the SessionSnapshot
        # revalidates every message): what the store itself costs.
        "store_time_ms": {t: round(at("own", t) * 1000, 3) for t in MARKS},
        "total_bytes": int(statistics.median(sum(r["sizes"]) for r in runs)),
        "mean_time_ms": round(
            statistics.median(statistics.mean(r["times"]) for r in runs) * 1e3, 3
        ),
        "load_ms": round(statistics.median(r["load"] for r in runs) * 1000, 3),
    }


Setup = Callable[[], tuple[SessionStore[Any], Measure]]


async def _repeat(sim: Callable[[int], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """A warm-up conversation (connections, caches), then REPS measured ones."""
    await sim(-1)
    return summarize([await sim(i) for i in range(REPS)])


async def _bench(setup: Setup) -> dict[str, Any]:
    return await _repeat(lambda seed: simulate(*setup(), seed=seed))


async def _langgraph(database_url: str) -> dict[str, Any] | None:
    """AsyncPostgresSaver on the same database, in its own tables; None without the extra."""
    if AsyncPostgresSaver is None:
        print("note: langgraph-checkpoint-postgres is not installed (pip install -e '.[bench]'):")
        print("      skipping the LangGraph PostgresSaver row.\n")
        return None
    dsn = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        await saver.setup()
        return await _repeat(lambda seed: simulate_langgraph(saver, seed))


async def run(database_url: str | None) -> dict[str, Any]:
    """Run the benchmark, print a table, write bench/results-session-store.json."""
    async with temporary_database(database_url) as url:
        engine = make_engine(url)
        try:
            stores: dict[str, dict[str, Any]] = {}
            sql = SqlSessionStore(make_session_factory(engine))
            stores["sql"] = await _bench(lambda: (sql, sql_measure(engine)))
            if (langgraph := await _langgraph(url)) is not None:
                stores["langgraph"] = langgraph
            with tempfile.TemporaryDirectory() as tmp:

                def files() -> tuple[SessionStore[Any], Measure]:
                    # A directory per conversation: a session lookup reads every file in it.
                    store: FileSessionStore[Any] = FileSessionStore(tempfile.mkdtemp(dir=tmp))
                    return store, file_measure(store)

                stores["file"] = await _bench(files)
            stores["memory"] = await _bench(lambda: (InMemorySessionStore(), memory_measure))
        finally:
            await engine.dispose()

    s = stores["sql"]
    ratios = {
        "sql_bytes_turn200_over_turn1": round(s["bytes"][200] / s["bytes"][1], 2),
        "sql_time_turn200_over_turn1": round(s["time_ms"][200] / s["time_ms"][1], 2),
        "sql_store_time_turn200_over_turn1": round(
            s["store_time_ms"][200] / s["store_time_ms"][1], 2
        ),
        "sql_total_bytes_over_file": round(s["total_bytes"] / stores["file"]["total_bytes"], 4),
    }
    targets = {
        "bytes_turn200_le_2x_turn1": ratios["sql_bytes_turn200_over_turn1"] <= 2,
        "store_time_turn200_le_2x_turn1": ratios["sql_store_time_turn200_over_turn1"] <= 2,
        "total_le_tenth_of_file": ratios["sql_total_bytes_over_file"] <= 0.1,
    }
    if (lg := stores.get("langgraph")) is not None:  # LangGraph's own time is all store
        ratios["sql_total_bytes_over_langgraph"] = round(s["total_bytes"] / lg["total_bytes"], 4)
        ratios["sql_time_turn200_over_langgraph"] = round(s["time_ms"][200] / lg["time_ms"][200], 2)
        ratios["sql_store_time_turn200_over_langgraph"] = round(
            s["store_time_ms"][200] / lg["time_ms"][200], 2
        )
        targets["store_time_turn200_lt_langgraph"] = (
            ratios["sql_store_time_turn200_over_langgraph"] < 1
        )
    result = {
        "config": {
            "turns": TURNS,
            "repetitions": REPS,
            "chars_per_turn": CHARS,
            "tool_call_every": 5,
            "database": "postgresql",
            "statistic": "median over repetitions, after one warm-up conversation",
        },
        "stores": stores,
        "ratios": ratios,
        "targets": targets,
    }
    print(_table(stores, ratios, targets))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _table(stores: dict[str, Any], ratios: dict[str, float], targets: dict[str, bool]) -> str:
    cols = [f"bytes@{t}" for t in MARKS] + [f"ms@{t}" for t in MARKS]
    cols += [f"store ms@{t}" for t in MARKS]
    cols += ["mean ms", "total bytes", "load ms"]
    lines = [f"{'store':<10}" + "".join(f"{c:>13}" for c in cols)]
    for name, r in stores.items():
        cells = [r["bytes"][t] for t in MARKS] + [r["time_ms"][t] for t in MARKS]
        cells += [r["store_time_ms"][t] for t in MARKS]
        cells += [r["mean_time_ms"], r["total_bytes"], r["load_ms"]]
        lines.append(f"{name:<10}" + "".join(f"{c:>13,}" for c in cells))
    lines.append("")
    lines += [f"{k}: {v}" for k, v in ratios.items()]
    lines += [f"target {k}: {'met' if ok else 'MISSED'}" for k, ok in targets.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="an existing database (migrated to head)")
    asyncio.run(run(parser.parse_args().database_url))


if __name__ == "__main__":
    main()
