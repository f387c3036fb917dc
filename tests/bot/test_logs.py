"""The logs `python -m bot` writes: JSON lines with LOG_FORMAT=json, a quiet start-up."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import text as sql
from sqlalchemy.exc import DBAPIError

from bot.logs import setup_logging
from storage.db import make_engine
from tests.bot.test_faults import bot_process
from tests.conftest import pg_test_url
from tests.fakes.gemini import FakeGemini
from tests.fakes.slack_api import FakeSlack


async def test_json_logs_and_a_quiet_start(
    fake_slack: FakeSlack, gemini: FakeGemini, ledger: Path, bot_database: str, tmp_path: Path
) -> None:
    async with (
        bot_process("json", fake_slack, gemini, bot_database, tmp_path, LOG_FORMAT="json") as bot,
        aiohttp.ClientSession() as http,
    ):
        await bot.wait_healthy(http)
        assert await bot.stop(signal.SIGTERM) == 0
    lines = bot.log.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert records, bot.output()
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys(), record
    messages = [r["message"] for r in records]
    assert any(m.startswith("Greenlight is up") for m in messages), bot.output()
    # Start-up says what an operator needs, not what libraries set up.
    assert not [r for r in records if r["logger"] == "alembic.runtime.plugins"], bot.output()
    assert not [m for m in messages if "will be unused" in m], bot.output()


def test_json_lines_carry_the_exception_and_the_ids(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging("INFO", "json")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logging.getLogger("agent.workflow").exception(
                "resume of turn %s failed", "T-1", extra={"turn_id": "T-1"}
            )
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["logger"] == "agent.workflow"
    assert record["time"].startswith("20") and record["time"].endswith("+00:00")
    assert record["message"] == "resume of turn T-1 failed"
    assert record["turn_id"] == "T-1"
    assert "RuntimeError: boom" in record["exception"]


SECRET = "MARKER-7f3a"  # a person's words, a tool input or an answer, bound as a parameter


async def test_database_errors_hide_bound_parameters() -> None:
    engine = make_engine(pg_test_url())
    try:
        async with engine.connect() as conn:
            with pytest.raises(DBAPIError) as failed:
                await conn.execute(sql("SELECT CAST(:v AS text), 1 / 0"), {"v": SECRET})
    finally:
        await engine.dispose()
    assert "division by zero" in str(failed.value)
    assert SECRET not in str(failed.value)
