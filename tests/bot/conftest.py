"""The bot as `python -m bot` runs it: a real `Service` (Bolt over HTTP, or Socket Mode) on
127.0.0.1, talking to a fake Slack Web API, a fake Gemini (through the real Genkit plugin) and
PostgreSQL. Requests reach it signed exactly as Slack signs them.

Every test works under its own `team`, so tests share the database without seeing each other's
rows. The bot suite has a database of its own all the same: the Service's recovery sweep runs at
start-up over *every* workspace (as it must in production), and would otherwise resume turns
that other suites leave decided-but-idle on purpose, spending this test's scripted model
replies and posting into this test's fake Slack.
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
from sqlalchemy.engine import make_url

from bot.server import Service
from bot.settings import Settings
from storage.db import SessionFactory, make_engine, make_session_factory
from storage.migrate import upgrade
from tests.conftest import pg_test_url
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini
from tests.fakes.slack_api import Call, FakeSlack

SECRET = "test-signing-secret"
APPROVERS = "C0APPROVE"
ADMIN = "UADMIN"
DM = "D0DIRECT"

_ts = itertools.count(1)


def new_ts() -> str:
    """A message timestamp no other test uses (threads are keyed by channel and ts)."""
    return f"1600000000.{next(_ts):06d}"


def bot_database_url() -> str:
    """The bot suite's database: the run's test database name plus `_bot`."""
    run = make_url(pg_test_url())
    return run.set(database=f"{run.database}_bot").render_as_string(hide_password=False)


async def _admin(sql: str) -> None:
    dsn = make_url(pg_test_url()).set(drivername="postgresql")
    conn = await asyncpg.connect(dsn.render_as_string(hide_password=False), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
async def bot_database() -> AsyncIterator[str]:
    """Created and migrated once for the bot suite, dropped at its end."""
    url = bot_database_url()
    name = make_url(url).database
    await _admin(f'CREATE DATABASE "{name}"')
    try:
        engine = make_engine(url)
        await upgrade(engine)
        await engine.dispose()
        yield url
    finally:
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
async def bot_sessions(bot_database: str) -> AsyncIterator[SessionFactory]:
    """The bot database, for tests that check what a request wrote (or did not)."""
    engine = make_engine(bot_database)
    yield make_session_factory(engine)
    await engine.dispose()


def bot_settings(slack: FakeSlack, gemini: FakeGemini, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        SLACK_BOT_TOKEN="xoxb-test",
        SLACK_SIGNING_SECRET=SECRET,
        SLACK_API_URL=slack.base_url,
        GEMINI_API_KEY="k",
        GEMINI_API_URL=gemini.base_url,
        DATABASE_URL=bot_database_url(),
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
    try:
        yield svc
    finally:
        await svc.stop()


async def settle(service: Service, timeout: float = 15.0) -> None:  # noqa: ASYNC109
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

    async def click(
        self, team: str, user: str, action: str, card: Call, *, channel: str = APPROVERS
    ) -> tuple[int, str]:
        """Press a button of the card whose chat.postMessage is `card`."""
        value = button_value(card, action)
        assert self.service.deps is not None
        approval = await self.service.deps.workflow.reads.approval(team, value.split("~")[0])
        payload = sp.block_actions(
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
        return await self.send(payload)

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
        [answer] = await self.slack.wait_for(f"response_url:{name}", timeout=15)
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
