"""Alembic environment: async engines from DATABASE_URL, or a connection handed in by the app."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from storage.db import make_engine
from storage.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async(url: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
            await conn.commit()
    finally:
        await engine.dispose()


def main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)  # the application is migrating on its own connection
        return
    url = os.environ.get("DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("Set DATABASE_URL (postgresql+asyncpg://user:pass@host/db)")
    asyncio.run(_run_async(url))


if context.is_offline_mode():
    raise SystemExit("Offline (--sql) migrations are not supported; run against a database.")
main()
