"""`greenlight audit export` as an operator runs it, against the real PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from bot import audit_export
from storage.models import AuditRow
from tests.bot.test_cli import run_bot
from tests.conftest import pg_test_url

# In 2003: no other test writes rows that old, so `--since` below sees only these.
START = datetime(2003, 5, 1, tzinfo=UTC)


async def write_trail(engine: AsyncEngine, team: str) -> None:
    """Seven events of `team` from START on, every third one for exportData; one before."""
    rows: list[dict[str, Any]] = [
        {
            "team_id": team,
            "at": START + timedelta(hours=i),
            "actor": "UADMIN",
            "action": "approved",
            "tool": "exportData" if i % 3 == 0 else "transferMoney",
            "approval_id": f"a{i}",
            "detail": {"input": {"amount": i, "memo": 'say "hi", then\nleave'}},
        }
        for i in range(-1, 7)
    ]
    async with engine.begin() as conn:
        await conn.execute(sa.insert(cast(sa.Table, AuditRow.__table__)), rows)


def export(*args: str) -> tuple[int, str, str]:
    result = run_bot("audit", "export", *args, env={"DATABASE_URL": pg_test_url()})
    return result.returncode, result.stdout, result.stderr


async def test_csv_by_default_with_a_header_streamed_in_pages(
    pg_engine: AsyncEngine, team: str
) -> None:
    await write_trail(pg_engine, team)
    code, out, err = export("--since", "2003-05-01", "--team", team, "--page-size", "2")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == [
        "id", "at", "team_id", "actor", "action", "tool", "approval_id", "detail"
    ]  # fmt: skip
    assert [r["approval_id"] for r in rows] == [f"a{i}" for i in range(7)]  # none lost
    assert rows[0]["at"] == "2003-05-01T00:00:00+00:00" and rows[0]["team_id"] == team
    assert json.loads(rows[1]["detail"]) == {
        "input": {"amount": 1, "memo": 'say "hi", then\nleave'}
    }
    assert "exported 7 audit event(s)" in err


async def test_jsonl_for_one_tool(pg_engine: AsyncEngine, team: str) -> None:
    await write_trail(pg_engine, team)
    code, out, err = export(
        "--since", "2003-05-01T01:00:00", "--tool", "exportData", "--format", "jsonl",
        "--team", team,
    )  # fmt: skip
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["approval_id"] for e in events] == ["a3", "a6"]
    assert events[0]["detail"]["input"]["amount"] == 3 and events[0]["tool"] == "exportData"


def export_here(*args: str) -> tuple[int, str, str]:
    """`greenlight audit export ARGS` run in this process (`bot.audit_export.main`), for
    arguments refused before any database is opened: a process costs a second of imports.
    The last check below runs `python -m bot audit ...` whole."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = audit_export.main(["export", *args])
        except SystemExit as exc:  # argparse's way out
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def test_bad_arguments_are_usage_on_stderr_and_exit_2() -> None:
    for args in (
        (),  # --since is required
        ("--since", "last tuesday"),
        ("--since", "2026-01-01", "--format", "xml"),
        ("--since", "2026-01-01", "--colour"),
    ):
        code, out, err = export_here(*args)
        assert code == 2 and out == "" and "usage: greenlight audit export" in err, args
        assert "Traceback" not in err
    result = run_bot("audit", "import", env={"DATABASE_URL": pg_test_url()})
    assert result.returncode == 2 and "usage:" in result.stderr
