"""The models and the migrations agree, and the migrations go both ways."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.asking import turn_id_of
from storage.db import make_engine, make_session_factory
from storage.domain import Approval, Request, Thread, Withdrawn
from storage.gateway_store import GATEWAY_CHANNEL, GatewayStore
from storage.migrate import downgrade, upgrade
from storage.models import Base
from storage.rows import get
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


async def test_the_apis_earlier_withdrawals_become_withdrawn_and_back() -> None:
    """0021: a request the approvals API's DELETE ended before WITHDRAW existed (a denial by
    its own requester, "withdrawn by the caller") is withdrawn; downgraded, such again."""
    name = f"greenlight_mig_{uuid.uuid4().hex[:8]}"
    admin = make_engine(admin_url(), isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(admin_url()).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    now = datetime(2026, 5, 1, tzinfo=UTC)
    request = Request("deployRelease", "r", {}, "UALICE", "why", now, now + timedelta(hours=1))
    approvals = [
        Approval(i, turn_id_of(i), Thread("T1", GATEWAY_CHANNEL, i[:8]), request)
        for i in ("0a0a0a0a-cancelled", "0b0b0b0b-denied")
    ]
    sessions = make_session_factory(engine)
    legacy = (
        "UPDATE approvals SET status = 'denied', decided_by = :by, decided_at = :at, "
        "reason = :why WHERE id = :id"
    )
    status = text("SELECT id, status, reason FROM approvals ORDER BY id")
    try:
        # Rows are written by today's store (at head), then taken back to 0020's schema.
        await upgrade(engine)
        for approval in approvals:
            await GatewayStore(sessions).open(approval, now=now)
        await downgrade(engine, "0020")
        async with engine.begin() as conn:
            for approval, by, why in zip(
                approvals, ("UALICE", "UBOSS"), ("withdrawn by the caller", "no"), strict=True
            ):
                await conn.execute(
                    text(legacy), {"by": by, "at": now, "why": why, "id": approval.id}
                )
        await upgrade(engine)
        async with engine.connect() as conn:
            assert (await conn.execute(status)).all() == [
                ("0a0a0a0a-cancelled", "withdrawn", None),
                ("0b0b0b0b-denied", "denied", "no"),
            ]
        found = await get(sessions, "T1", approvals[0].id)
        assert found is not None and found.decision == Withdrawn("UALICE", now)
        await downgrade(engine, "0020")
        async with engine.connect() as conn:
            assert (await conn.execute(status)).all() == [
                ("0a0a0a0a-cancelled", "denied", "withdrawn by the caller"),
                ("0b0b0b0b-denied", "denied", "no"),
            ]
    finally:
        await engine.dispose()
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()
