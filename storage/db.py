"""Engine and session factory, built by the application and passed in (never at import)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.pool import QueuePool

from storage.driver import marked, run

SessionFactory = async_sessionmaker[AsyncSession]

# A pooled connection idle for longer than this is pinged before use: long enough that a
# busy service never pays a round trip per transaction, short enough that a connection a
# firewall dropped silently is found before a turn uses it.
PING_AFTER_IDLE_SECONDS = 2.0


def make_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """Create the engine, with a cheap liveness check per checkout (see `_check_alive`)."""
    # Bound parameters are people's words, tool inputs and answers: never in an error's text
    # (which reaches the log).
    kwargs.setdefault("hide_parameters", True)
    engine = create_async_engine(url, **kwargs)
    if kwargs.get("pool_pre_ping"):
        return engine

    @event.listens_for(engine.sync_engine, "checkin")
    def _idle_from(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine.sync_engine, "checkout")
    def _check_alive(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        # Instead of pool_pre_ping's three round trips (BEGIN, ping, ROLLBACK) per checkout:
        # a connection the server closed (restart, pg_terminate_backend) is known locally;
        # only one that sat idle a while is pinged. DisconnectionError makes the pool
        # replace the connection and try again.
        if dbapi_conn.driver_connection.is_closed():
            raise exc.DisconnectionError("the server closed this connection")
        idle_since = record.info.get("idle_since")
        if idle_since is not None and time.monotonic() - idle_since > PING_AFTER_IDLE_SECONDS:
            try:
                dbapi_conn.ping()
            except Exception as error:
                raise exc.DisconnectionError("ping failed") from error

    return engine


def connections_in_use(engine: AsyncEngine) -> Callable[[], int]:
    """How many of the engine's pooled connections are checked out now (for a gauge)."""
    pool = engine.sync_engine.pool
    return pool.checkedout if isinstance(pool, QueuePool) else lambda: 0


def make_session_factory(engine: AsyncEngine) -> SessionFactory:
    return async_sessionmaker(engine, expire_on_commit=False)


class Lone:
    """Lookups and lone writes, which need no transaction around them: each statement
    commits on its own, with no BEGIN and COMMIT round trips (a transition and its audit row
    are one statement), on a connection of the pool taken for that statement alone. A
    statement marked `storage.driver.prepared` runs on the driver; any other on a Core
    connection in autocommit (an ORM session around each cost more CPU than the statement:
    see docs/contributors.md, Performance)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def execute(
        self, statement: sa.Executable, params: Any = None
    ) -> sa.Result[*tuple[Any, ...]]:
        if (driven := marked(statement)) is not None and not isinstance(params, list):
            return await run(self._engine, driven, params)
        async with self._engine.connect() as conn:
            alone = await conn.execution_options(isolation_level="AUTOCOMMIT")
            return await alone.execute(statement, params)

    async def scalar(self, statement: sa.Executable, params: Any = None) -> Any:
        return (await self.execute(statement, params)).scalar()

    async def scalars(self, statement: sa.Executable, params: Any = None) -> sa.ScalarResult[Any]:
        return (await self.execute(statement, params)).scalars()


# What statements run on: lone (`autocommit`), or an ORM session's transaction.
Db = Lone | AsyncSession


@contextlib.asynccontextmanager
async def autocommit(sessions: SessionFactory) -> AsyncIterator[Lone]:
    """Lone statements on the factory's engine (see `Lone`)."""
    yield Lone(sessions.kw["bind"])
