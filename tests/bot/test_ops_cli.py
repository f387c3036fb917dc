"""The subcommands a deployment runs: `migrate` (the Kubernetes Job), `healthcheck` (the image's
HEALTHCHECK) and `manifest` (the Slack app manifest from an installed package)."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
from aiohttp import web
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from bot.server import Service
from storage.migrate import alembic_config
from tests.bot.conftest import _admin
from tests.conftest import pg_test_url
from tests.fakes.slack_api import serve_local

ROOT = Path(__file__).resolve().parents[2]


async def run_bot(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GEMINI_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *args,
        cwd=ROOT,
        env={**clean, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def empty_database() -> AsyncIterator[str]:
    url = make_url(pg_test_url()).set(database=f"greenlight_migrate_{uuid.uuid4().hex[:8]}")
    await _admin(f'CREATE DATABASE "{url.database}"')
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        await _admin(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')


async def test_migrate_brings_an_empty_database_to_head_and_exits(empty_database: str) -> None:
    code, out, err = await run_bot("migrate", env={"DATABASE_URL": empty_database})
    assert code == 0, err
    assert "migrations applied" in out
    dsn = make_url(empty_database).set(drivername="postgresql")
    conn = await asyncpg.connect(dsn.render_as_string(hide_password=False))
    try:
        version = await conn.fetchval("SELECT version_num FROM alembic_version")
    finally:
        await conn.close()
    assert version == ScriptDirectory.from_config(alembic_config()).get_current_head()
    # Again: nothing to do, still exit 0 (a Job retried after a lost acknowledgement).
    assert (await run_bot("migrate", env={"DATABASE_URL": empty_database}))[0] == 0


async def test_migrate_with_a_bad_database_url_says_so_without_a_traceback() -> None:
    code, _, err = await run_bot("migrate", env={"DATABASE_URL": "mysql://x"})
    assert code == 2 and "DATABASE_URL" in err and "Traceback" not in err


async def test_healthcheck_follows_healthz(service: Service) -> None:
    assert (await run_bot("healthcheck", env={"PORT": str(service.port)}))[0] == 0

    async def unhealthy(request: web.Request) -> web.Response:
        return web.json_response({"ok": False, "database": "unreachable"}, status=503)

    app = web.Application()
    app.router.add_get("/healthz", unhealthy)
    async with serve_local(app) as url:
        port = url.rsplit(":", 1)[1]
        code, _, err = await run_bot("healthcheck", env={"PORT": port})
    assert code == 1 and "503" in err
    code, _, err = await run_bot("healthcheck", env={"PORT": port})  # nobody listens now
    assert code == 1 and "unhealthy" in err and "Traceback" not in err


async def test_manifest_prints_the_slack_app_manifest() -> None:
    code, out, _ = await run_bot("manifest", env={})
    assert code == 0 and out == (ROOT / "manifest.yml").read_text()
