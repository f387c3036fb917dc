"""The bot as `python -m bot` runs it: a real `Service` (Bolt over HTTP, or Socket Mode) on
127.0.0.1, talking to a fake Slack Web API, a fake Gemini (through the real Genkit plugin) and
PostgreSQL. Requests reach it signed exactly as Slack signs them.

Each worker has a bot database of its own, and each bot test starts it empty (`bot_database`):
the Service's recovery sweep and follow-ups run at start-up over *every* workspace (as they
must in production), so rows an earlier test left (a turn decided, failed or let go, an
approval overdue) would be resumed, expired or reminded of by this test's Service, spending its
scripted model replies and posting into its fake Slack. Emptying it takes ~25 ms; a copy of a
migrated template (CREATE DATABASE ... TEMPLATE) took 70 ms to 1 s, and a drop waits on a
checkpoint. Tests still work under their own `team`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg  # type: ignore[import-untyped]
import pytest
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy.engine import make_url

from bot.app import web_client
from bot.server import Service
from bot.settings import Settings
from storage.db import SessionFactory, make_engine, make_session_factory
from storage.migrate import upgrade
from storage.models import Base
from tests.conftest import pg_test_url
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini
from tests.fakes.slack_api import DEADLINE, Call, FakeSlack

# Tasks of the service that run on a timer, not for a conversation.
LOOPS = {
    "recovery sweep",
    "recovery sweep pass",  # the start-up pass may still run as a test's conversation does
    "follow-ups",
    "people sync",
    "gateway sweep",
    "gateway decisions",
    "gateway waiters",
}

SECRET = "test-signing-secret"
APPROVERS = "C0APPROVE"
ADMIN = "UADMIN"
DM = "D0DIRECT"
# Slack's deadline for an acknowledgement. Tests that check the bot answers before slow work
# (a model, a Slack lookup) make that work take longer; a tighter bound only measures the
# machine's load.
ACK_DEADLINE = 3.0

_ts = itertools.count(1)


def new_ts() -> str:
    """A message timestamp no other test uses (threads are keyed by channel and ts)."""
    return f"1600000000.{next(_ts):06d}"


# Every table but alembic_version, children first (`_migrated` checks that none is missing).
TABLES = tuple(t.name for t in reversed(Base.metadata.sorted_tables))
DELETES = "".join(f"DELETE FROM {table};" for table in TABLES)  # noqa: S608 (our own names)


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(_dsn(pg_test_url()), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _empty(url: str) -> None:
    """Every row gone, and every connection an earlier test left (a writer it did not stop)."""
    conn = await asyncpg.connect(_dsn(url), timeout=5)
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        async with conn.transaction():
            await conn.execute(
                "SET LOCAL synchronous_commit = off;"  # nothing here need survive a crash
                "SET LOCAL lock_timeout = '5s';"
                # audit_events refuses deletes but of rows older than this (migration 0012).
                "SET LOCAL greenlight.audit_purge_before = 'infinity';" + DELETES
            )
        tables = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    missing = {r["tablename"] for r in tables} - {"alembic_version", *TABLES}
    assert not missing, f"tables the reset does not empty: {missing}"


@pytest.fixture(scope="session")
async def _migrated() -> AsyncIterator[str]:
    """The worker's bot database (the run's test database name plus `_bot`), migrated once."""
    run = make_url(pg_test_url())
    url = run.set(database=f"{run.database}_bot").render_as_string(hide_password=False)
    await _admin(f'CREATE DATABASE "{run.database}_bot"')
    try:
        engine = make_engine(url)
        await upgrade(engine)
        await engine.dispose()
        yield url
    finally:
        await _admin(f'DROP DATABASE IF EXISTS "{run.database}_bot" WITH (FORCE)')


@pytest.fixture
async def bot_database(_migrated: str) -> str:
    """The worker's bot database, emptied for this test: only this test's own turns are there
    for its Service's sweep to find."""
    await _empty(_migrated)
    return _migrated


@pytest.fixture(autouse=True)
async def _no_task_outlives_its_test() -> AsyncIterator[None]:
    """Tasks a bot test leaves running are cancelled when it ends.

    Every test runs on the suite's one event loop, and a few leave a task behind (a fake
    server's handler cut off by a killed bot, a gateway call's wait): it would otherwise go
    on during the next test, after that test's database was emptied."""
    before = asyncio.all_tasks()
    yield
    left = asyncio.all_tasks() - before - {asyncio.current_task()}
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


@pytest.fixture
async def bot_sessions(bot_database: str) -> AsyncIterator[SessionFactory]:
    """This test's database, for tests that check what a request wrote (or did not)."""
    engine = make_engine(bot_database)
    yield make_session_factory(engine)
    await engine.dispose()


def bot_settings(slack: FakeSlack, gemini: FakeGemini, **overrides: Any) -> Settings:
    """A Service's settings for these fakes; DATABASE_URL is the caller's (`bot_database`)."""
    values: dict[str, Any] = dict(
        SLACK_BOT_TOKEN="xoxb-test",
        SLACK_SIGNING_SECRET=SECRET,
        SLACK_API_URL=slack.base_url,
        GEMINI_API_KEY="k",
        GEMINI_API_URL=gemini.base_url,
        MIGRATE_ON_START=False,
        AGENT_TOOLS=["tests.ledger_tools"],
        APPROVER_CHANNEL=APPROVERS,
        ADMIN_USERS=[ADMIN],
        RECOVERY_INTERVAL_SECONDS=3600,
        AGENT_MODEL_RETRY_DELAY_SECONDS=0,  # a retried model call waits no backoff
        PORT=0,
    )
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(ts_start=int(time.time())) as slack:  # posts get real-time ts
        slack.channels[APPROVERS] = {"is_private": True}  # the only kind the bot accepts
        # Who is in it: a modal's submission asks Slack again (a test may change it).
        slack.members[APPROVERS] = ["UBOSS", "UCFO", "UOTHERBOSS"]
        yield slack


@pytest.fixture
async def web_api(fake_slack: FakeSlack) -> AsyncIterator[AsyncWebClient]:
    """The bot's own Web API client (bot/app.py `web_client`), on the fake Slack: for tests
    of one piece (people, links) without the service."""
    api = web_client("xoxb-test", fake_slack.base_url)
    yield api
    assert api.session is not None
    await api.session.close()


@pytest.fixture
async def gemini() -> AsyncIterator[FakeGemini]:
    async with FakeGemini() as fake:
        yield fake


@pytest.fixture
def service_overrides() -> dict[str, Any]:
    """Settings a test changes (parametrize this name to override it)."""
    return {}


@pytest.fixture
async def service(
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    ledger: Path,
    bot_database: str,
    service_overrides: dict[str, Any],
) -> AsyncIterator[Service]:
    settings = bot_settings(fake_slack, gemini, DATABASE_URL=bot_database, **service_overrides)
    svc = Service(settings, host="127.0.0.1")
    await svc.start()
    if settings.PEOPLE_SYNC_MINUTES:  # its start-up sync's calls are made before the test's
        await fake_slack.wait_for("users.list")
    try:
        yield svc
    finally:
        await svc.stop()


async def settle(service: Service, timeout: float = DEADLINE) -> None:  # noqa: ASYNC109
    """Wait until every Bolt listener and every background turn of `service` has finished.

    Bolt answers Slack at `ack()` and runs the rest of a listener in a task of its own; those
    tasks are found by name, the turns through the service's own tracker.
    """
    assert service.deps is not None
    async with asyncio.timeout(timeout):
        while True:
            running = [
                t
                for t in asyncio.all_tasks()
                if getattr(t.get_coro(), "__qualname__", "").endswith(
                    "run_ack_function_asynchronously"
                )
                and not t.done()
            ]
            if running:
                await asyncio.wait(running)
                continue
            await service.deps.background.drain(timeout)
            return


def policy_file(slack: FakeSlack, team: str, path: Path, policy: str) -> dict[str, Any]:
    """Settings for a POLICY_FILE of `policy` written at `path`. The file's policy is for the
    workspace auth.test names, so the fake Slack names this test's `team` there."""
    path.write_text(policy)
    slack.team_id = team
    return {"POLICY_FILE": path}


@dataclass
class SlackClient:
    """Sends what Slack would send to the service, signed with the app's signing secret."""

    http: aiohttp.ClientSession
    service: Service
    slack: FakeSlack

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.service.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/slack/events"

    async def send(
        self,
        payload: sp.Payload,
        *,
        timestamp: int | None = None,
        headers: dict[str, str] | None = None,
        secret: str = SECRET,
    ) -> tuple[int, str]:
        return await sp.post_signed(
            self.http,
            self.url,
            secret,
            *payload,
            timestamp=timestamp,
            extra_headers=headers,
        )

    async def dm(
        self,
        team: str,
        user: str,
        text: str,
        *,
        ts: str | None = None,
        event_id: str | None = None,
        channel: str = DM,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        payload = sp.message_im_event(team, user, channel, text, ts or new_ts(), event_id=event_id)
        return await self.send(payload, headers=headers)

    async def dm_until_card(
        self, team: str, user: str, text: str, *, ts: str | None = None
    ) -> Call:
        """DM the bot (the model's answers already scripted) and wait for the approval card."""
        assert (await self.dm(team, user, text, ts=ts))[0] == 200
        (card,) = await self.slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
        return card

    async def click(
        self, team: str, user: str, action: str, card: Call, *, channel: str = APPROVERS
    ) -> tuple[int, str]:
        """Press a button of the card whose chat.postMessage is `card`."""
        return await self.send(await self.click_payload(team, user, action, card, channel=channel))

    async def click_payload(
        self, team: str, user: str, action: str, card: Call, *, channel: str = APPROVERS
    ) -> sp.Payload:
        """What Slack sends when `user` presses a button of the card `card` posted."""
        value = button_value(card, action)
        assert self.service.deps is not None
        approval = await self.service.deps.workflow.reads.approval(team, value.split("~")[0])
        return sp.block_actions(
            team,
            user,
            channel,
            (approval.card.ts if approval and approval.card else None) or "1700000000.000000",
            action,
            value,
            f"trigger-{next(_ts)}",
            self.slack.response_url(f"click-{next(_ts)}"),
            block_id="approval",
            message_text=str(card.args.get("text", "")),
            message_blocks=card.args.get("blocks"),
        )

    async def submit(
        self, team: str, user: str, view: dict[str, Any], values: dict[str, Any]
    ) -> tuple[int, str]:
        """Submit a modal the service opened with views.open (`view` is its `view` arg)."""
        payload = sp.view_submission(
            team, user, str(view["callback_id"]), str(view.get("private_metadata", "")), values
        )
        return await self.send(payload)

    async def command(self, team: str, user: str, text: str) -> tuple[int, str]:
        """The acknowledgement's status, and the reply: the ack's own text when it has one
        (a malformed or unknown command), else what came to the response_url."""
        name = f"command-{next(_ts)}"
        payload = sp.slash_command(
            team,
            user,
            "/approvals",
            text,
            "C0GENERAL",
            self.slack.response_url(name),
            f"trigger-{next(_ts)}",
        )
        status, body = await self.send(payload)
        if status != 200 or body:
            return status, body
        [answer] = await self.slack.wait_for(f"response_url:{name}")
        return status, str(answer.args["text"])

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.http.get(f"{self.base}{path}") as response:
            return response.status, await response.json()


@pytest.fixture
async def client(service: Service, fake_slack: FakeSlack) -> AsyncIterator[SlackClient]:
    async with aiohttp.ClientSession() as http:
        yield SlackClient(http, service, fake_slack)


# -- reading what the service sent to Slack --------------------------------------------------


def approval_id_of(card: Call) -> str:
    """The approval a card is about (its decision buttons name a version too: `<id>~<n>`)."""
    return button_value(card, "approve").split("~")[0]


def button_value(card: Call, action: str) -> str:
    for block in card.args.get("blocks") or []:
        if block.get("type") == "actions":
            for element in block["elements"]:
                if element.get("action_id") == action:
                    return str(element["value"])
    raise AssertionError(f"no {action} button on the card: {json.dumps(card.args)[:500]}")


def in_channel(channel: str, thread_ts: str | None = None) -> Callable[[Call], bool]:
    def match(call: Call) -> bool:
        if call.args.get("channel") != channel:
            return False
        return thread_ts is None or call.args.get("thread_ts") == thread_ts

    return match
