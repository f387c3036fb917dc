"""The models and the migrations agree, and the migrations go both ways."""

from __future__ import annotations

import uuid
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from storage.db import make_engine
from storage.migrate import downgrade, upgrade
from storage.models import Base
from tests.conftest import admin_url


def _diff(conn: Connection) -> list[Any]:
    ctx = MigrationContext.configure(conn, opts={"compare_type": True})
    return list(compare_metadata(ctx, Base.metadata))


async def test_models_match_migrations(pg_engine: AsyncEngine) -> None:
    async with pg_engine.connect() as conn:
        assert await conn.run_sync(_diff) == []


async def test_upgrade_and_downgrade_on_empty_postgres() -> None:
    name = f"greenlight_mig_{uuid.uuid4().hex[:8]}"
    admin = make_engine(admin_url(), isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url()).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    try:
        await upgrade(engine)
        async with engine.connect() as conn:
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        assert set(Base.metadata.tables) <= tables
        await downgrade(engine)
        async with engine.connect() as conn:
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        assert tables <= {"alembic_version"}
    finally:
        await engine.dispose()
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()
