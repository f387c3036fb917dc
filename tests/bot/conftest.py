"""The bot as `python -m bot` runs it: a real `Service` (Bolt over HTTP, or Socket Mode) on
127.0.0.1, talking to a fake Slack Web API, a fake Gemini (through the real Genkit plugin) and
PostgreSQL. Requests reach it signed exactly as Slack signs them.

Every bot test has a database of its own (`bot_database`), cloned from one migrated template
per worker: the Service's recovery sweep and follow-ups run at start-up over *every* workspace
(as they must in production), so in a shared database they would resume turns, expire approvals
and remind approvers that earlier tests left behind, spending this test's scripted model
replies and posting into this test's fake Slack. Tests still work under their own `team`.
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


class Clones:
    """One worker's bot databases: a migrated template, and a copy of it for each test.

    A copy takes tens of milliseconds (CREATE DATABASE ... TEMPLATE, its commit not waited
    for: nothing here need survive a crash of the server). A drop waits on a checkpoint, so
    each copy is dropped in the background while the next test runs, and the last ones at
    the end of the worker's run.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        self._count = itertools.count(1)
        self._drops: set[asyncio.Task[None]] = set()

    async def copy(self) -> str:
        run = make_url(self.template)
        name = f"{run.database}_{next(self._count)}"
        await _admin(f'CREATE DATABASE "{name}" TEMPLATE "{run.database}"')
        return run.set(database=name).render_as_string(hide_password=False)

    def drop_later(self, url: str) -> None:
        """Dropped WITH (FORCE): a connection the test left open does not keep it."""
        name = make_url(url).database
        task = asyncio.create_task(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def close(self) -> None:
        await asyncio.gather(*self._drops, return_exceptions=True)


async def _admin(sql: str) -> None:
    dsn = make_url(pg_test_url()).set(drivername="postgresql")
    conn = await asyncpg.connect(dsn.render_as_string(hide_password=False), timeout=5)
    try:
        await conn.execute("SET synchronous_commit = off")
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
async def bot_template() -> AsyncIterator[Clones]:
    """The template: the run's test database name plus `_bot`, migrated once per worker."""
    run = make_url(pg_test_url())
    url = run.set(database=f"{run.database}_bot").render_as_string(hide_password=False)
    await _admin(f'CREATE DATABASE "{run.database}_bot"')
    clones = Clones(url)
    try:
        engine = make_engine(url)
        await upgrade(engine)
        await engine.dispose()  # a template is copied only while nobody is connected to it
        yield clones
    finally:
        await clones.close()
        await _admin(f'DROP DATABASE IF EXISTS "{run.database}_bot" WITH (FORCE)')


@pytest.fixture
async def bot_database(bot_template: Clones) -> AsyncIterator[str]:
    """This test's own database, migrated, with nothing in it."""
    url = await bot_template.copy()
    try:
        yield url
    finally:
        bot_template.drop_later(url)


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
        approval = await self.service.deps.workflow.approval(team, value.split("~")[0])
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
