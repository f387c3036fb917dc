"""A migrated PostgreSQL database for a benchmark run: the one given, or a temporary one."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from sqlalchemy import text
from sqlalchemy.engine import make_url

from storage.db import make_engine
from storage.migrate import upgrade

ADMIN_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"


async def _admin(sql: str) -> None:
    engine = make_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def temporary_database(database_url: str | None) -> AsyncIterator[str]:
    """The given database, migrated; or a new one on 127.0.0.1, dropped afterwards."""
    temp = None
    if database_url is None:
        temp = f"greenlight_bench_{uuid.uuid4().hex[:10]}"
        await _admin(f'CREATE DATABASE "{temp}"')
        database_url = make_url(ADMIN_URL).set(database=temp).render_as_string(False)
    try:
        engine = make_engine(database_url)
        try:
            await upgrade(engine)
        finally:
            await engine.dispose()
        yield database_url
    finally:
        if temp is not None:
            await _admin(f'DROP DATABASE IF EXISTS "{temp}" WITH (FORCE)')
