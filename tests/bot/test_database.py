"""Where the bot's database comes from: DATABASE_URL, else the embedded PostgreSQL in
./greenlight-data; and what a setup from the SQLite days is told at start."""

from __future__ import annotations

import signal
from pathlib import Path

import aiohttp

from tests.bot.test_cli import run_bot
from tests.bot.test_faults import bot_process
from tests.fakes.gemini import FakeGemini
from tests.fakes.slack_api import FakeSlack

SERVING = {
    "SLACK_BOT_TOKEN": "xoxb-1",
    "SLACK_SIGNING_SECRET": "s",
    "GEMINI_API_KEY": "k",
    "APPROVER_CHANNEL": "C0APPROVE",
    "PORT": "0",
}


def test_a_sqlite_database_url_stops_the_bot_saying_what_changed(tmp_path: Path) -> None:
    old = tmp_path / "greenlight.db"
    old.write_bytes(b"SQLite format 3\x00")
    result = run_bot(env=SERVING | {"DATABASE_URL": f"sqlite+aiosqlite:///{old}"}, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    err = " ".join(result.stderr.split())
    assert "DATABASE_URL: names a sqlite database" in err
    assert "Greenlight now runs on PostgreSQL only" in err
    assert f"The data in {old} is not carried over and is left as it is" in err
    assert "Traceback" not in result.stderr
    assert old.read_bytes() == b"SQLite format 3\x00"
    assert not (tmp_path / "greenlight-data").exists()  # stopped before anything started


def test_an_old_sqlite_file_beside_an_unset_database_url_stops_the_bot(tmp_path: Path) -> None:
    """Else an upgrade would start afresh on an empty database, as if the old one were lost."""
    (tmp_path / "greenlight.db").write_bytes(b"SQLite format 3\x00")
    result = run_bot(env=SERVING | {"DATABASE_URL": ""}, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    err = " ".join(result.stderr.split())
    assert "DATABASE_URL is unset, and ./greenlight.db is the SQLite database" in err
    assert "embedded PostgreSQL in ./greenlight-data" in err
    assert "are not carried over, and the file is left as it is" in err
    assert "Traceback" not in result.stderr
    assert (tmp_path / "greenlight.db").read_bytes() == b"SQLite format 3\x00"
    assert not (tmp_path / "greenlight-data").exists()


async def test_an_unset_database_url_serves_from_an_embedded_postgresql_in_greenlight_data(
    fake_slack: FakeSlack, gemini: FakeGemini, ledger: Path, own_tmp: Path
) -> None:
    """The zero-setup default: a real PostgreSQL, its data kept in ./greenlight-data, stopped
    with the bot."""
    async with (
        bot_process("embedded", fake_slack, gemini, None, own_tmp, cwd=own_tmp) as bot,
        aiohttp.ClientSession() as http,
    ):
        await bot.wait_healthy(http)  # /healthz runs a query on the database
        assert await bot.stop(signal.SIGTERM) == 0, bot.output()
    data = own_tmp / "greenlight-data"
    assert (data / "PG_VERSION").read_text().strip() == "18", bot.output()
    assert not (data / "postmaster.pid").exists(), "the server outlived the bot"


def test_the_demo_runs_on_a_temporary_embedded_postgresql_and_leaves_nothing(
    own_tmp: Path,
) -> None:
    work, tmp = own_tmp / "work", own_tmp / "tmp"
    work.mkdir()
    tmp.mkdir()
    result = run_bot("demo", env={"TMPDIR": str(tmp), "HOME": str(own_tmp)}, cwd=work)
    assert result.returncode == 0, result.stderr
    assert "That's the whole loop." in result.stdout
    # Only the wheel's lock file stays, in the user's runtime directory (platformdirs falls
    # back to $TMPDIR/runtime-UID where XDG_RUNTIME_DIR is unset): no data directory.
    assert [p.name for p in tmp.iterdir() if not p.name.startswith("runtime-")] == []
    assert list(work.iterdir()) == []
