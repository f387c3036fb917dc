"""One contract for session stores: Genkit's own (in memory, files) and ours (PostgreSQL).

Every test asserts the same results on every backend, so wherever `SqlSessionStore` differs
from Genkit's stores it shows up here. The agent-driven tests run a real Genkit agent on a
scripted model; the SQL-only tests at the end cover tenancy, races and the storage layout.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from genkit import ActionRunContext, Part, Role
from genkit._ai._tools import Interrupt
from genkit._core._error import GenkitError
from genkit.exp import (
    AgentError,
    AgentFinishReason,
    FileSessionStore,
    Genkit,
    InMemorySessionStore,
    SessionSnapshot,
    SessionState,
    SessionStore,
    SnapshotStatus,
)
from genkit.exp.agent import AgentInterrupt
from genkit.middleware import BaseMiddleware
from genkit.model import Message, ModelRequest, ModelResponse
from sqlalchemy import delete, event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from storage import session_store
from storage.db import make_engine, make_session_factory
from storage.models import MessageRow, SnapshotRow
from storage.session_store import SqlSessionStore, current_team
from storage.turn_snapshots import starting
from tests.conftest import pg_test_url

KINDS = ["memory", "file", "postgresql"]
DUMP: dict[str, Any] = {"mode": "json", "by_alias": True, "exclude_none": True}


# --- backends ------------------------------------------------------------------------------


@dataclass
class Backend:
    kind: str
    team: str
    url: str | None = None  # SQL backends
    directory: str = ""  # the file backend
    engines: list[AsyncEngine] = field(default_factory=list)
    memory: InMemorySessionStore[Any] = field(default_factory=InMemorySessionStore)

    def __post_init__(self) -> None:
        self.store = self.reopen()

    @property
    def ctx(self) -> dict[str, Any]:
        return {"team_id": self.team}

    def reopen(self) -> SessionStore[Any]:
        """The same storage opened again, as another process would: new engine, new store.

        In memory there is no other process, so the same store comes back.
        """
        if self.kind == "memory":
            return self.memory
        if self.kind == "file":
            return FileSessionStore(self.directory)
        return self.sql_store()

    def engine(self) -> AsyncEngine:
        """A new engine on the same database (disposed after the test)."""
        assert self.url is not None
        engine = make_engine(self.url)
        self.engines.append(engine)
        return engine

    def sql_store(self) -> SqlSessionStore:
        return SqlSessionStore(make_session_factory(self.engine()))


async def _backend(kind: str, tmp: Path, team: str) -> AsyncIterator[Backend]:
    b = Backend(kind, team, pg_test_url() if kind == "postgresql" else None, str(tmp / "snapshots"))
    yield b
    for engine in b.engines:
        await engine.dispose()


@pytest.fixture(params=KINDS)
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, team: str
) -> AsyncIterator[Backend]:
    async for b in _backend(request.param, tmp_path, team):
        yield b


@pytest.fixture
async def sql(tmp_path: Path, team: str) -> AsyncIterator[Backend]:
    async for b in _backend("postgresql", tmp_path, team):
        yield b


@contextmanager
def as_team(team: str) -> Iterator[None]:
    """What the application does around a turn: Genkit's runtime passes no team itself."""
    token = current_team.set(team)
    try:
        yield
    finally:
        current_team.reset(token)


class Recording:
    """Passes through to a store and keeps what each save wrote, to compare with reads."""

    def __init__(self, inner: SessionStore[Any]) -> None:
        self.inner = inner
        self.saved: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, bool]] = []  # (snapshot id, fn saw an existing row)

    async def get_snapshot(self, **kw: Any) -> SessionSnapshot | None:
        return await self.inner.get_snapshot(**kw)

    async def save_snapshot(
        self,
        snapshot_id: str,
        fn: Callable[[SessionSnapshot | None], SessionSnapshot | None],
        *,
        context: dict[str, Any] | None = None,
    ) -> SessionSnapshot | None:
        def spy(existing: SessionSnapshot | None) -> SessionSnapshot | None:
            self.calls.append((snapshot_id, existing is not None))
            return fn(existing)

        snap = await self.inner.save_snapshot(snapshot_id, spy, context=context)
        if snap is not None:
            self.saved[snapshot_id] = snap.model_dump(**DUMP)
        return snap


# --- a real agent on a scripted model -----------------------------------------------------


class App:
    """Genkit app with a `deploy` tool that needs approval (an interrupt) before it runs."""

    def __init__(self, store: Any) -> None:
        self.ai = Genkit()
        self.tool_runs = 0
        self.tool_fails = False

        async def model(request: ModelRequest[Any], ctx: ActionRunContext) -> ModelResponse:
            last = request.messages[-1]
            if last.role == Role.USER and "deploy" in (last.text or ""):
                part = Part(tool_request={"name": "deploy", "input": {"env": "prod"}})
                return ModelResponse(message=Message(role=Role.MODEL, content=[part]))
            users = sum(1 for m in request.messages if m.role == Role.USER)
            reply = f"answer {users} after {last.role}"
            return ModelResponse(message=Message(role=Role.MODEL, content=[Part(text=reply)]))

        self.ai.define_model(name="scripted", fn=model)

        @self.ai.tool(name="deploy", description="Deploy the service.")
        async def deploy(input: dict[str, Any]) -> str:
            if self.tool_fails:
                raise RuntimeError("deploy target unreachable")
            self.tool_runs += 1
            return f"deployed to {input['env']}"

        class NeedsApproval(BaseMiddleware[Any]):
            async def wrap_tool(self, params: Any, ctx: Any, next_fn: Any) -> Any:
                resumed = (params.tool_request_part.metadata or {}).get("resumed") or {}
                if not resumed.get("tool_approved"):
                    raise Interrupt({"why": "needs approval"})
                return await next_fn(params, ctx)

        self.agent = self.ai.define_agent(
            name="ops", model="scripted", tools=["deploy"], use=[NeedsApproval()], store=store
        )


def approvals(snap: SessionSnapshot) -> list[Part]:
    """Restarts built from the stored request, as a process that did not see the turn must."""
    assert snap.state is not None and snap.state.messages
    parts = snap.state.messages[-1].interrupts
    assert parts
    return [
        AgentInterrupt(p.tool_request.name, p.tool_request.ref, p.tool_request.input).restart(
            resumed_metadata={"tool_approved": True}
        )
        for p in parts
        if p.tool_request is not None
    ]


def texts(snap: SessionSnapshot | None) -> list[tuple[str, str]]:
    assert snap is not None and snap.state is not None
    return [(str(m.role), m.text) for m in snap.state.messages or []]


async def assert_reads_back(store: Recording, ctx: dict[str, Any]) -> None:
    """Every snapshot Genkit saved reads back exactly (equal model_dump)."""
    assert store.saved
    for snapshot_id, saved in store.saved.items():
        got = await store.get_snapshot(snapshot_id=snapshot_id, context=ctx)
        assert got is not None and got.model_dump(**DUMP) == saved


def snap(
    snapshot_id: str,
    *,
    parent: str = "",
    session: str = "S",
    texts: tuple[str, ...] = (),
    status: SnapshotStatus | None = SnapshotStatus.COMPLETED,
    created_at: str = "",
    custom: Any = None,
) -> Callable[[SessionSnapshot | None], SessionSnapshot]:
    """A save mutator writing a snapshot with these user messages."""
    msgs = [Message(role=Role.USER, content=[Part(text=t)]) for t in texts]
    state = SessionState(session_id=session, messages=msgs, custom=custom)

    def fn(existing: SessionSnapshot | None) -> SessionSnapshot:
        return SessionSnapshot(
            snapshot_id=snapshot_id,
            parent_id=parent,
            status=status,
            state=state,
            created_at=created_at or (existing.created_at if existing else ""),
        )

    return fn


# --- the contract ------------------------------------------------------------------------


async def test_new_session(backend: Backend) -> None:
    store = Recording(backend.store)
    with as_team(backend.team):
        assert await store.get_snapshot(session_id="never-seen", context=backend.ctx) is None
        out = await App(store).agent.chat().send("hello")

    assert out.session_id and out.snapshot_id
    leaf = await store.get_snapshot(session_id=out.session_id, context=backend.ctx)
    assert leaf is not None
    assert (leaf.snapshot_id, leaf.parent_id, leaf.status) == (out.snapshot_id, "", "completed")
    assert leaf.session_id == out.session_id and leaf.created_at
    assert texts(leaf) == [("user", "hello"), ("model", "answer 1 after user")]
    assert store.calls == [(out.snapshot_id, False)]  # one write, never read back first
    await assert_reads_back(store, backend.ctx)


async def test_many_turns(backend: Backend) -> None:
    store = Recording(backend.store)
    with as_team(backend.team):
        app = App(store)
        chat = app.agent.chat()
        for i in range(6):
            await chat.send(f"turn {i}")
        for i in range(6, 12):  # a new chat each turn: load the session's leaf every time
            out = await app.agent.chat(session_id=chat.session_id).send(f"turn {i}")

    leaf = await backend.reopen().get_snapshot(session_id=out.session_id, context=backend.ctx)
    assert texts(leaf) == [
        pair
        for i in range(12)
        for pair in [("user", f"turn {i}"), ("model", f"answer {i + 1} after user")]
    ]
    # The parent chain runs back through all twelve turns, each one turn shorter.
    sizes, cur = [], leaf
    while cur is not None:
        sizes.append(len(cur.state.messages or []) if cur.state else 0)
        cur = (
            await store.get_snapshot(snapshot_id=cur.parent_id, context=backend.ctx)
            if cur.parent_id
            else None
        )
    assert sizes == list(range(24, 0, -2))
    assert all(not existing for _, existing in store.calls)  # each turn a new row
    await assert_reads_back(store, backend.ctx)


async def test_interrupted_turn_resumed_by_another_process(backend: Backend) -> None:
    first = Recording(backend.store)
    with as_team(backend.team):
        chat = App(first).agent.chat()
        await chat.send("hello")
        out = await chat.send("please deploy")
    assert out.finish_reason == AgentFinishReason.INTERRUPTED
    assert [(i.name, i.input) for i in out.interrupts] == [("deploy", {"env": "prod"})]
    paused = await first.get_snapshot(session_id=out.session_id, context=backend.ctx)
    assert paused is not None and paused.status == "completed"
    assert paused.finish_reason == AgentFinishReason.INTERRUPTED

    # Another process: new engine, new store, new app; it knows only the session id.
    second = Recording(backend.reopen())
    with as_team(backend.team):
        app = App(second)
        stored = await second.get_snapshot(session_id=out.session_id, context=backend.ctx)
        assert stored is not None and stored.model_dump(**DUMP) == paused.model_dump(**DUMP)
        done = await app.agent.chat(session_id=out.session_id).resume(restart=approvals(stored))
    assert done.finish_reason != AgentFinishReason.INTERRUPTED and app.tool_runs == 1
    leaf = await second.get_snapshot(session_id=out.session_id, context=backend.ctx)
    assert leaf is not None and leaf.parent_id == paused.snapshot_id
    assert texts(leaf)[4:] == [("tool", ""), ("model", "answer 2 after tool")]
    assert leaf.state is not None and leaf.state.messages
    assert leaf.state.messages[4].content[0].tool_response is not None
    assert leaf.state.messages[4].content[0].tool_response.output == "deployed to prod"
    await assert_reads_back(first, backend.ctx)
    await assert_reads_back(second, backend.ctx)


async def test_failed_resume_falls_back_to_last_completed(backend: Backend) -> None:
    store = Recording(backend.store)
    with as_team(backend.team):
        app = App(store)
        chat = app.agent.chat()
        await chat.send("hello")
        out = await chat.send("please deploy")
        paused = await store.get_snapshot(session_id=out.session_id, context=backend.ctx)
        assert paused is not None
        app.tool_fails = True
        with pytest.raises(AgentError):
            await app.agent.chat(session_id=out.session_id).resume(restart=approvals(paused))

        failed = await store.get_snapshot(session_id=out.session_id, context=backend.ctx)
        assert failed is not None and failed.status == "failed"  # the leaf, as stored
        assert failed.parent_id == paused.snapshot_id and failed.error is not None

        # chat(session_id=) walks back past the failed leaf to the paused turn and resumes it.
        app.tool_fails = False
        done = await app.agent.chat(session_id=out.session_id).resume(restart=approvals(paused))
    assert app.tool_runs == 1
    leaf = await store.get_snapshot(session_id=out.session_id, context=backend.ctx)
    assert leaf is not None and leaf.snapshot_id == done.snapshot_id
    assert leaf.parent_id == paused.snapshot_id and leaf.status == "completed"
    assert texts(leaf)[-1] == ("model", "answer 2 after tool")
    await assert_reads_back(store, backend.ctx)


async def test_detached_turn_pending_then_completed(backend: Backend) -> None:
    """The one runtime path that rewrites a row: a detached turn's pending snapshot."""
    store = Recording(backend.store)
    with as_team(backend.team):
        chat = App(store).agent.chat()
        await chat.send("first")
        task = await chat.detach("second")
        final = await asyncio.wait_for(task.wait(interval=0.02), 10)
    assert final.status == "completed" and final.snapshot_id == task.snapshot_id
    assert [t for _, t in texts(final)] == [
        "first",
        "answer 1 after user",
        "second",
        "answer 2 after user",
    ]
    writes = [existing for sid, existing in store.calls if sid == task.snapshot_id]
    assert writes[0] is False and writes[-1] is True  # pending first, then rewritten
    await assert_reads_back(store, backend.ctx)


async def test_latest_leaf_with_forks(backend: Backend) -> None:
    s, ctx = backend.store, backend.ctx

    async def save(sid: str, parent: str, at: str, session: str = "F") -> None:
        fn = snap(sid, parent=parent, session=session, texts=(sid,), created_at=at)
        await s.save_snapshot(sid, fn, context=ctx)

    async def leaf() -> str | None:
        got = await s.get_snapshot(session_id="F", context=ctx)
        return got.snapshot_id if got else None

    await save("root", "", "2026-01-01T00:00:01+00:00")
    assert await leaf() == "root"
    await save("a", "root", "2026-01-01T00:00:02+00:00")
    await save("b", "root", "2026-01-01T00:00:03+00:00")
    assert await leaf() == "b"  # two leaves: the newest wins
    await save("a2", "a", "2026-01-01T00:00:04+00:00")
    assert await leaf() == "a2"
    await save("c", "root", "2026-01-01T00:00:04+00:00")  # same instant as a2
    assert await leaf() == "c"  # ties go to the greater snapshot id
    await save("later-elsewhere", "c", "2026-01-01T00:00:09+00:00", session="G")
    assert await leaf() == "c"  # a child in another session does not hide a leaf
    await save("z", "root", "2026-01-01T00:00:03.5+00:00")
    assert await leaf() == "c"  # string order of ISO times, as Genkit compares them


async def test_unknown_ids(backend: Backend) -> None:
    s, ctx = backend.store, backend.ctx
    assert await s.get_snapshot(snapshot_id="no-such-snapshot", context=ctx) is None
    assert await s.get_snapshot(session_id="no-such-session", context=ctx) is None
    calls: list[SessionSnapshot | None] = []

    def only_update(existing: SessionSnapshot | None) -> SessionSnapshot | None:
        calls.append(existing)
        return None  # abort / heartbeat skip a missing row

    assert await s.save_snapshot("no-such-snapshot", only_update, context=ctx) is None
    assert calls == [None]
    assert await s.get_snapshot(snapshot_id="no-such-snapshot", context=ctx) is None


@pytest.mark.parametrize("bad", ["", "../escape", "a/b", "a\\b", ".", "..", "nul\0byte"])
async def test_invalid_ids_rejected(backend: Backend, bad: str) -> None:
    s, ctx = backend.store, backend.ctx
    called = []

    def fn(existing: SessionSnapshot | None) -> SessionSnapshot:
        called.append(existing)
        return snap(bad or "x", texts=("hi",))(existing)

    if backend.kind == "memory":  # Genkit's in-memory store takes any id; we follow the files
        await s.save_snapshot(bad, fn, context=ctx)
        assert called == [None]
        return
    with pytest.raises(GenkitError) as err:
        await s.save_snapshot(bad, fn, context=ctx)
    assert err.value.status == "INVALID_ARGUMENT" and called == []
    with pytest.raises(GenkitError) as err:
        await s.get_snapshot(snapshot_id=bad, context=ctx)
    assert err.value.status == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    "selector", [{}, {"snapshot_id": "a", "session_id": "b"}, {"session_id": "  "}]
)
async def test_selector_rules(backend: Backend, selector: dict[str, str]) -> None:
    with pytest.raises(GenkitError) as err:
        await backend.store.get_snapshot(**selector, context=backend.ctx)
    assert err.value.status == "INVALID_ARGUMENT"


async def test_mutator_raising_leaves_nothing(backend: Backend) -> None:
    s, ctx = backend.store, backend.ctx

    def boom(existing: SessionSnapshot | None) -> SessionSnapshot:
        raise RuntimeError("mutator failed")

    with pytest.raises(RuntimeError):
        await s.save_snapshot("m1", boom, context=ctx)
    assert await s.get_snapshot(snapshot_id="m1", context=ctx) is None
    assert await s.get_snapshot(session_id="S", context=ctx) is None

    await s.save_snapshot("m1", snap("m1", texts=("kept",)), context=ctx)
    with pytest.raises(RuntimeError):
        await s.save_snapshot("m1", boom, context=ctx)
    assert texts(await s.get_snapshot(snapshot_id="m1", context=ctx)) == [("user", "kept")]


async def test_terminal_status_is_final(backend: Backend) -> None:
    s, ctx = backend.store, backend.ctx
    pending = snap("t1", texts=("q",), status=SnapshotStatus.PENDING)
    await s.save_snapshot("t1", pending, context=ctx)
    done = snap("t1", texts=("q", "a"), status=SnapshotStatus.COMPLETED)
    await s.save_snapshot("t1", done, context=ctx)  # pending -> completed is fine
    back = snap("t1", texts=("q", "a", "b"), status=SnapshotStatus.PENDING)
    with pytest.raises(GenkitError) as err:
        await s.save_snapshot("t1", back, context=ctx)
    assert err.value.status == "FAILED_PRECONDITION"
    got = await s.get_snapshot(snapshot_id="t1", context=ctx)
    assert got is not None and got.status == "completed"
    assert texts(got) == [("user", "q"), ("user", "a")]
    # A terminal snapshot may still be rewritten if its status stays the same.
    await s.save_snapshot("t1", snap("t1", texts=("q", "a", "c")), context=ctx)
    assert texts(await s.get_snapshot(snapshot_id="t1", context=ctx))[-1] == ("user", "c")


async def test_history_rewrites_keep_every_snapshot_intact(backend: Backend) -> None:
    """Children extend, a compaction restarts the list, and a parent gets rewritten."""
    s, ctx = backend.store, backend.ctx
    plan = [
        ("h1", "", ("a", "b")),
        ("h2", "h1", ("a", "b", "c")),
        ("h3", "h2", ("summary", "c")),  # does not extend h2
        ("h4", "h3", ("summary", "c", "d")),
        ("h5", "h4", ("summary", "c", "d")),  # adds nothing
        ("h6", "h5", ("summary", "c", "d", "e", "f")),
    ]
    for sid, parent, msgs in plan:
        await s.save_snapshot(sid, snap(sid, parent=parent, texts=msgs), context=ctx)
    # Rewrite h4's messages after its children were written: theirs must not move.
    await s.save_snapshot("h4", snap("h4", parent="h3", texts=("x",)), context=ctx)
    reader = backend.reopen()
    for sid, _, msgs in plan:
        want = ("x",) if sid == "h4" else msgs
        got = await reader.get_snapshot(snapshot_id=sid, context=ctx)
        assert [t for _, t in texts(got)] == list(want), sid
    # No message list at all is not the same as an empty one.
    await s.save_snapshot(
        "h7",
        lambda e: SessionSnapshot(snapshot_id="h7", session_id="S", created_at=""),
        context=ctx,
    )
    bare = await reader.get_snapshot(snapshot_id="h7", context=ctx)
    assert bare is not None and bare.state is None
    empty = SessionState(session_id="S", messages=[])
    fn = lambda e: SessionSnapshot(snapshot_id="h8", created_at="", state=empty)  # noqa: E731
    await s.save_snapshot("h8", fn, context=ctx)
    got = await reader.get_snapshot(snapshot_id="h8", context=ctx)
    assert got is not None and got.state is not None and got.state.messages == []


# --- SQL only: tenancy, races, layout -------------------------------------------------------


async def test_team_isolation(sql: Backend) -> None:
    s, other = sql.store, "O" + sql.team[1:]
    await s.save_snapshot("iso", snap("iso", session="SI", texts=("secret",)), context=sql.ctx)
    theirs = {"team_id": other}
    assert await s.get_snapshot(snapshot_id="iso", context=theirs) is None
    assert await s.get_snapshot(session_id="SI", context=theirs) is None
    assert await s.get_snapshot(snapshot_id="iso") is None  # no team at all: the default ''
    with as_team(sql.team):
        assert await s.get_snapshot(snapshot_id="iso") is not None  # the ContextVar
        assert await s.get_snapshot(snapshot_id="iso", context=theirs) is None  # context wins
    # The same snapshot id under another team is another row.
    await s.save_snapshot("iso", snap("iso", session="SI", texts=("mine",)), context=theirs)
    assert texts(await s.get_snapshot(snapshot_id="iso", context=sql.ctx)) == [("user", "secret")]
    assert texts(await s.get_snapshot(session_id="SI", context=theirs)) == [("user", "mine")]


async def test_racing_writers_lose_no_update(sql: Backend) -> None:
    """Two engines (two processes) append to one snapshot's list, read-modify-write."""
    stores = [sql.sql_store(), sql.sql_store()]
    fn_calls = 0

    def append(tag: str) -> Callable[[SessionSnapshot | None], SessionSnapshot]:
        def fn(existing: SessionSnapshot | None) -> SessionSnapshot:
            nonlocal fn_calls
            fn_calls += 1
            seen = list(existing.state.custom or []) if existing and existing.state else []
            return snap("race", texts=(*seen, tag), custom=[*seen, tag])(existing)

        return fn

    async def writer(store: SessionStore[Any], name: str) -> None:
        for i in range(25):
            await store.save_snapshot("race", append(f"{name}{i}"), context=sql.ctx)

    await asyncio.gather(writer(stores[0], "a"), writer(stores[1], "b"))
    got = await stores[0].get_snapshot(snapshot_id="race", context=sql.ctx)
    assert got is not None and got.state is not None
    tags = list(got.state.custom or [])
    assert sorted(tags) == sorted([f"{n}{i}" for n in "ab" for i in range(25)])
    assert [t for t in tags if t[0] == "a"] == [f"a{i}" for i in range(25)]
    assert [t for _, t in texts(got)] == tags
    assert fn_calls >= 50


async def test_version_check_catches_a_write_between_read_and_write(
    team: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the row lock, the compare-and-swap alone rolls back and runs fn again."""
    monkeypatch.setattr(session_store, "LOCK_ROW", session_store.GET_ROW)
    url, ctx = pg_test_url(), {"team_id": team}
    engine = make_engine(url)
    store = SqlSessionStore(make_session_factory(engine))
    await store.save_snapshot("cas", snap("cas", custom=["first"]), context=ctx)

    async def competitor() -> None:  # another process, on its own loop and engine
        other = make_engine(url)
        append = snap("cas", custom=["first", "theirs"])
        await SqlSessionStore(make_session_factory(other)).save_snapshot("cas", append, context=ctx)
        await other.dispose()

    seen: list[Any] = []

    def ours(existing: SessionSnapshot | None) -> SessionSnapshot:
        assert existing is not None and existing.state is not None
        seen.append(existing.state.custom)
        if len(seen) == 1:  # lands after our read, before our write
            worker = threading.Thread(target=asyncio.run, args=(competitor(),))
            worker.start()
            worker.join()
        return snap("cas", custom=[*(existing.state.custom or []), "ours"])(existing)

    try:
        await store.save_snapshot("cas", ours, context=ctx)
        got = await store.get_snapshot(snapshot_id="cas", context=ctx)
    finally:
        await engine.dispose()
    assert seen == [["first"], ["first", "theirs"]]
    assert got is not None and got.state is not None
    assert got.state.custom == ["first", "theirs", "ours"]


async def test_parent_rewritten_elsewhere_is_not_inherited(sql: Backend) -> None:
    """A store remembers the rows it created, but another process may rewrite one since."""
    ours, theirs = sql.store, sql.reopen()
    await ours.save_snapshot("p", snap("p", texts=("a", "b")), context=sql.ctx)
    await theirs.save_snapshot("p", snap("p", texts=("x", "y")), context=sql.ctx)
    await ours.save_snapshot("c", snap("c", parent="p", texts=("a", "b", "c")), context=sql.ctx)
    got = await sql.reopen().get_snapshot(snapshot_id="c", context=sql.ctx)
    assert [t for _, t in texts(got)] == ["a", "b", "c"]


async def test_new_snapshot_statements(team: str) -> None:
    """PostgreSQL: a new snapshot is one write, plus a read of its parent unless this store
    created that parent: no lookup of its own row, whose id Genkit made new."""
    engine = make_engine(pg_test_url())
    ran: list[str] = []
    event.listen(engine.sync_engine, "before_cursor_execute", lambda *a: ran.append(a[2]))
    ours, theirs = (SqlSessionStore(make_session_factory(engine)) for _ in range(2))
    ctx = {"team_id": team}
    try:
        await ours.save_snapshot("n1", snap("n1", texts=("a",)), context=ctx)
        ran.clear()
        await ours.save_snapshot("n2", snap("n2", parent="n1", texts=("a", "b")), context=ctx)
        assert len(ran) == 1
        ran.clear()
        await theirs.save_snapshot(
            "n3", snap("n3", parent="n2", texts=("a", "b", "c")), context=ctx
        )
        assert len(ran) == 2
        got = await ours.get_snapshot(snapshot_id="n3", context=ctx)
    finally:
        await engine.dispose()
    assert [t for _, t in texts(got)] == ["a", "b", "c"]


async def test_the_session_a_turn_starts_is_not_looked_up(team: str) -> None:
    """Genkit looks a new chat's session up; one the turn made just now is answered without
    a query. Any other session, or the same one outside the turn, is looked up."""
    engine = make_engine(pg_test_url())
    ran: list[str] = []
    event.listen(engine.sync_engine, "before_cursor_execute", lambda *a: ran.append(a[2]))
    store, ctx = SqlSessionStore(make_session_factory(engine)), {"team_id": team}
    try:
        await store.save_snapshot("s1", snap("s1", session="old", texts=("a",)), context=ctx)
        ran.clear()
        with starting("fresh"):
            assert await store.get_snapshot(session_id="fresh", context=ctx) is None
            assert ran == []
            found = await store.get_snapshot(session_id="old", context=ctx)
        assert [t for _, t in texts(found)] == ["a"] and len(ran) == 2
        assert await store.get_snapshot(session_id="fresh", context=ctx) is None
        assert len(ran) == 3
    finally:
        await engine.dispose()


async def test_concurrent_sessions_all_land(sql: Backend) -> None:
    s = sql.store
    sids = [f"c{i}" for i in range(20)]
    await asyncio.gather(
        *(s.save_snapshot(i, snap(i, session=i, texts=(i,)), context=sql.ctx) for i in sids)
    )
    for i in sids:
        assert texts(await s.get_snapshot(session_id=i, context=sql.ctx)) == [("user", i)]


class _Exploding(SqlSessionStore):
    """Fails after an existing row's rewrite is written, before the commit."""

    async def _write(self, *args: Any) -> None:
        await super()._write(*args)
        raise OSError("connection lost")


async def _rows(b: Backend, snapshot_id: str) -> tuple[int, int]:
    async with AsyncSession(b.engine()) as s:
        snaps = select(func.count()).where(
            SnapshotRow.team_id == b.team, SnapshotRow.snapshot_id == snapshot_id
        )
        msgs = select(func.count()).where(
            MessageRow.team_id == b.team, MessageRow.snapshot_id == snapshot_id
        )
        return (await s.scalar(snaps) or 0, await s.scalar(msgs) or 0)


async def test_failure_half_way_leaves_no_rows(sql: Backend) -> None:
    # A stray message row makes a new snapshot's write fail after its row went in (in its
    # one statement), on a store that does not retry.
    stray = (MessageRow.team_id == sql.team, MessageRow.snapshot_id == "half")
    async with AsyncSession(sql.engine()) as s, s.begin():
        s.add(MessageRow(team_id=sql.team, snapshot_id="half", position=1, data={}))
    once = SqlSessionStore(make_session_factory(sql.engine()), max_attempts=1)
    with pytest.raises(GenkitError) as err:
        await once.save_snapshot("half", snap("half", texts=("a", "b")), context=sql.ctx)
    assert err.value.status == "ABORTED"
    assert await _rows(sql, "half") == (0, 1)
    async with AsyncSession(sql.engine()) as s, s.begin():
        await s.execute(delete(MessageRow).where(*stray))

    await sql.store.save_snapshot("half", snap("half", texts=("a", "b")), context=sql.ctx)
    bad = _Exploding(make_session_factory(sql.engine()))
    with pytest.raises(OSError):
        await bad.save_snapshot("half", snap("half", texts=("x", "y", "z")), context=sql.ctx)
    assert await _rows(sql, "half") == (1, 2)
    got = await sql.store.get_snapshot(snapshot_id="half", context=sql.ctx)
    assert [t for _, t in texts(got)] == ["a", "b"]


async def test_layout_stores_each_message_once(sql: Backend) -> None:
    store = Recording(sql.store)
    with as_team(sql.team):  # through the ContextVar: the runtime passes no context here
        app = App(store)
        chat = app.agent.chat()
        for i in range(5):
            await chat.send(f"turn {i}")
        out = await chat.send("please deploy")
        paused = await store.get_snapshot(session_id=out.session_id)
        assert paused is not None
        await app.agent.chat(session_id=out.session_id).resume(restart=approvals(paused))

    layout = (
        select(SnapshotRow.message_count, SnapshotRow.inherited)
        .where(SnapshotRow.team_id == sql.team, SnapshotRow.session_id == out.session_id)
        .order_by(SnapshotRow.created_at)
    )
    stored = (
        select(func.count())
        .select_from(MessageRow)
        .join(
            SnapshotRow,
            (SnapshotRow.team_id == MessageRow.team_id)
            & (SnapshotRow.snapshot_id == MessageRow.snapshot_id),
        )
        .where(SnapshotRow.team_id == sql.team, SnapshotRow.session_id == out.session_id)
    )
    async with AsyncSession(sql.engine()) as s:
        rows = [tuple(r) for r in (await s.execute(layout)).all()]
        count = await s.scalar(stored)
    # Five turns, the paused turn, then the resume: the resume rewrote the paused model
    # message (interrupt -> resolvedInterrupt), so it builds on the turn before instead.
    assert rows == [(2, 0), (4, 2), (6, 4), (8, 6), (10, 8), (12, 10), (14, 10)]
    assert count == 10 + 2 + 4  # not 2 + 4 + ... + 14 = 56
    await assert_reads_back(store, {"team_id": sql.team})


async def test_updates_that_keep_messages_do_not_rewrite_them(sql: Backend) -> None:
    s = sql.store
    await s.save_snapshot(
        "p", snap("p", texts=("a",), status=SnapshotStatus.PENDING), context=sql.ctx
    )

    def beat(existing: SessionSnapshot | None) -> SessionSnapshot | None:
        assert existing is not None
        return existing.model_copy(update={"heartbeat_at": "2026-01-01T00:00:00+00:00"})

    await s.save_snapshot("p", beat, context=sql.ctx)
    got = await s.get_snapshot(snapshot_id="p", context=sql.ctx)
    assert got is not None and got.heartbeat_at == "2026-01-01T00:00:00+00:00"
    assert texts(got) == [("user", "a")]
    assert await _rows(sql, "p") == (1, 1)


async def test_store_api_matches_genkit(sql: Backend) -> None:
    """Typed like Genkit's protocol, and usable without a team anywhere."""
    store: SessionStore[Any] = sql.store
    sid = "default-" + uuid.uuid4().hex
    await store.save_snapshot(sid, snap(sid, session=sid, texts=("x",)))
    got = await store.get_snapshot(session_id=sid)
    assert got is not None and got.snapshot_id == sid


def test_prefix_digests_match_digests_of_prefixes() -> None:
    """The one-pass prefix digests equal hashing each prefix's own JSON."""
    import hashlib

    msgs = [
        Message(role=Role.USER, content=[Part(text='héllo, "world"] ,')]),
        Message(
            role=Role.MODEL,
            content=[Part(tool_request={"name": "t", "input": {"b": 1, "a": [1.5]}})],
        ),
        Message(role=Role.TOOL, content=[Part(tool_response={"name": "t", "output": None})]),
        Message(role=Role.MODEL, content=[Part(text="")], metadata={"k": {"z": 1, "a": 2}}),
    ]
    got, size = session_store._digests(msgs, range(1, len(msgs) + 1))
    for k in range(1, len(msgs) + 1):
        assert got[k] == hashlib.sha256(session_store._json(msgs[:k])).hexdigest()
    assert size == len(session_store._json(msgs))
    assert session_store._digests([], [])[0][0] == hashlib.sha256(b"[]").hexdigest()
