"""Statements run on the driver (storage/driver.py) give what SQLAlchemy's execution gives:
the same rows and types, its exceptions without the parameters, and a pool left sound when
a statement is cancelled."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from storage import turns
from storage.db import autocommit, make_engine, make_session_factory
from storage.domain import Approval, ApprovalState, Card, PausedTurn, Request, Thread
from storage.driver import marked, prepared
from storage.session_store import CREATE
from tests.conftest import pg_test_url

NOW = datetime(2030, 1, 2, 3, 4, tzinfo=UTC)
BACKEND = prepared(sa.select(sa.func.pg_backend_pid()))
SLEEP = prepared(sa.select(sa.func.pg_sleep(sa.bindparam("seconds", type_=sa.Float()))))


async def on_core(
    engine: AsyncEngine, statement: sa.Executable, params: Mapping[str, object]
) -> list[tuple[tuple[str, ...], tuple[object, ...]]]:
    """What SQLAlchemy's own execution returns for `statement`."""
    async with engine.connect() as conn:
        alone = await conn.execution_options(isolation_level="AUTOCOMMIT")
        result = await alone.execute(statement, params)
        return [(tuple(result.keys()), tuple(row)) for row in result.all()]


async def test_a_statement_on_the_driver_reads_what_sqlalchemy_reads(
    pg_engine: AsyncEngine, team: str
) -> None:
    """A paused turn's approvals: enums, UTC datetimes, JSON, an IN list spread per item."""
    sessions = make_session_factory(pg_engine)
    store = turns.TurnStore(sessions)
    thread = Thread(team, "D0DRIVER", "1.1")
    held = await store.hold_thread(
        thread, author="UEMP", new_id=str(uuid.uuid4()), now=NOW, until=NOW
    )
    assert held is not None
    turn = PausedTurn(str(uuid.uuid4()), held.conversation_id, thread, "s", "p", NOW)
    request = Request("transferMoney", "r", {"amount": 5, "to": "ü"}, "UEMP", "why", NOW, NOW)
    approval = Approval(str(uuid.uuid4()), turn.id, thread, request, card=Card("C0APPROVE"))
    await store.pause(turn, [approval])
    assert marked(turns.WAITING_ON) is not None
    params = {"team": team, "channel": "D0DRIVER", "thread": "1.1"}

    async with autocommit(sessions) as db:
        result = await db.execute(turns.WAITING_ON, params)
        driven = [(tuple(result.keys()), tuple(row)) for row in result.all()]

    assert driven == await on_core(pg_engine, turns.WAITING_ON, params)
    [(keys, row)] = driven
    got = dict(zip(keys, row, strict=True))
    assert got["status"] is ApprovalState.PENDING and got["input"] == {"amount": 5, "to": "ü"}
    assert got["requested_at"] == NOW and got["requested_at"].tzinfo is not None
    # The same approvals through the store, as every caller reads them.
    assert [a.id for a in await store.waiting_on(thread)] == [approval.id]


async def test_a_refused_statement_raises_sqlalchemys_error_without_its_parameters(
    pg_engine: AsyncEngine, team: str
) -> None:
    sid = str(uuid.uuid4())
    params = {
        "team": team,
        "sid": sid,
        "new_session_id": "s",
        "new_parent_id": None,
        "new_created_at": NOW.isoformat(),
        "new_meta": {"secret": "hunter2-meta"},
        "new_message_count": 0,
        "new_inherited": 0,
        "new_digest": "d",
        "parent_digest": None,
        "tail": json.dumps([]),
    }
    async with autocommit(make_session_factory(pg_engine)) as db:
        assert (await db.execute(CREATE, params)).scalar() == 1
        with pytest.raises(sa.exc.IntegrityError) as raised:
            await db.execute(CREATE, params)  # the same snapshot id again
    assert "hunter2" not in str(raised.value) and sid not in str(raised.value)


async def test_a_cancelled_statement_does_not_go_back_to_the_pool() -> None:
    """One connection in the pool: a statement cut off by a timeout leaves its connection in
    a state nobody knows, so it is closed, not handed to the next statement (which runs on a
    new one, another server process)."""
    engine = make_engine(pg_test_url(), pool_size=1, max_overflow=0, pool_timeout=5)
    sessions = make_session_factory(engine)
    try:
        async with autocommit(sessions) as db:
            before = (await db.execute(BACKEND)).scalar()
            assert (await db.execute(BACKEND)).scalar() == before  # the pool reuses it
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await db.execute(SLEEP, {"seconds": 30})
            assert (await db.execute(BACKEND)).scalar() != before
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        await engine.dispose()
