"""Test database: a fresh PostgreSQL database per run, migrated once, dropped at the end.

Under pytest-xdist each worker is a run of its own (its own process, so its own name below):
created, migrated and dropped by the worker; the controller, which runs no tests, makes none.

Tests stay independent without rollbacks by working under their own Slack team id (the
`team` fixture): every table is keyed by team, so no test sees another's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from storage.db import SessionFactory, make_engine, make_session_factory
from storage.migrate import upgrade

ADMIN_URL = os.environ.get(
    "TEST_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
_RUN_DB = f"greenlight_test_{uuid.uuid4().hex[:10]}"


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(_dsn(ADMIN_URL), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _xdist_controller(session: pytest.Session) -> bool:
    config = session.config
    return getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    controller = _xdist_controller(session)  # only checks the server, for one clear message
    try:
        asyncio.run(_admin("SELECT 1" if controller else f'CREATE DATABASE "{_RUN_DB}"'))
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        pytest.exit(
            f"The tests need PostgreSQL and could not reach it at {make_url(ADMIN_URL)!r} "
            f"({type(exc).__name__}: {exc}). Start one (e.g. `pg_ctlcluster 15 main start`, or "
            "`docker run -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16`) or set "
            "TEST_DATABASE_URL=postgresql+asyncpg://user:pass@host:port/db to a database the "
            "tests may create databases from.",
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
    if _xdist_controller(session):
        return
    with contextlib.suppress(OSError, asyncpg.PostgresError, TimeoutError):
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{_RUN_DB}" WITH (FORCE)'))


def pg_test_url() -> str:
    """The migrated database of this run (also handed to subprocesses)."""
    return make_url(ADMIN_URL).set(database=_RUN_DB).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
async def pg_engine() -> AsyncIterator[AsyncEngine]:
    engine = make_engine(pg_test_url(), pool_size=20, max_overflow=40)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
def sqlite_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sqlite") / "greenlight.db"


@pytest.fixture(scope="session")
async def sqlite_engine(sqlite_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(f"sqlite+aiosqlite:///{sqlite_path}")
    await upgrade(engine)
    yield engine
    await engine.dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def any_engine(
    request: pytest.FixtureRequest, pg_engine: AsyncEngine, sqlite_engine: AsyncEngine
) -> AsyncEngine:
    """Storage tests run on both backends."""
    return pg_engine if request.param == "postgresql" else sqlite_engine


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
def team() -> Iterator[str]:
    """A workspace of this test's own: rows of other tests are invisible to it."""
    yield "T" + uuid.uuid4().hex[:10].upper()


async def poll(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:  # noqa: ASYNC109
    """Until `check()` holds; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.05)
