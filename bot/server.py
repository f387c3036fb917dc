"""The running service: HTTP (or Socket Mode), health, the recovery sweep, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from datetime import timedelta

from aiohttp import web
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from sqlalchemy import text

from agent.assemble import build_workflow, new_uuid, utc_now
from agent.policy import PolicyDefaults
from agent.runtime import DEFAULT_SYSTEM_PROMPT, AgentConfig
from bot.app import build_app
from bot.delivery import Delivery
from bot.deps import Deps
from bot.people import People
from bot.settings import ConfigError, Settings
from storage import events
from storage.db import make_engine, make_session_factory
from storage.migrate import upgrade

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 25.0  # seconds for in-flight turns; what is cut off stays resumable


class Service:
    """Everything `python -m bot` runs, with start/stop so tests run the very same thing."""

    def __init__(self, settings: Settings, *, host: str = "0.0.0.0") -> None:  # noqa: S104
        # Checked here too, not only by the CLI: without a signing secret Bolt would take
        # unsigned HTTP requests as Slack's.
        if problems := settings.serving_problems():
            raise ConfigError(problems)
        self.settings = settings
        self.host = host
        self.port: int | None = None
        self._engine = make_engine(settings.DATABASE_URL)
        self._runner: web.AppRunner | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.deps: Deps | None = None
        self.app: AsyncApp | None = None

    async def start(self) -> None:
        s = self.settings
        if s.MIGRATE_ON_START:
            await upgrade(self._engine)
        sessions = make_session_factory(self._engine)
        config = AgentConfig(
            model=s.AGENT_MODEL,
            system_prompt=s.AGENT_SYSTEM_PROMPT or DEFAULT_SYSTEM_PROMPT,
            tool_modules=tuple(s.AGENT_TOOLS),
            gemini_api_key=s.GEMINI_API_KEY.get_secret_value() if s.GEMINI_API_KEY else None,
            gemini_api_url=s.GEMINI_API_URL,
        )
        defaults = PolicyDefaults(
            channel=s.APPROVER_CHANNEL, timeout=timedelta(seconds=s.APPROVAL_TIMEOUT_SECONDS)
        )
        workflow = build_workflow(
            sessions,
            config,
            defaults=defaults,
            clock=utc_now,
            new_id=new_uuid,
            lease=timedelta(seconds=s.RESUME_LEASE_SECONDS),
        )
        self.deps = deps = Deps(
            workflow=workflow,
            sessions=sessions,
            delivery=Delivery(workflow, clock=utc_now),
            people=People(admin_users=s.ADMIN_USERS, clock=utc_now),
            clock=utc_now,
        )
        assert s.SLACK_BOT_TOKEN is not None
        signing = s.SLACK_SIGNING_SECRET.get_secret_value() if s.SLACK_SIGNING_SECRET else None
        self.app = app = build_app(
            deps,
            token=s.SLACK_BOT_TOKEN.get_secret_value(),
            signing_secret=None if s.socket_mode else signing,
            api_url=s.SLACK_API_URL,
        )
        # Socket Mode gets no Slack route: unsigned HTTP requests must never reach Bolt.
        web_app = web.Application() if s.socket_mode else app.web_app(path="/slack/events")
        web_app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(web_app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host=self.host, port=s.PORT)
        await site.start()
        self.port = self._runner.addresses[0][1]
        if s.SLACK_APP_TOKEN is not None:
            self._socket = AsyncSocketModeHandler(app, s.SLACK_APP_TOKEN.get_secret_value())
            await self._socket.connect_async()  # type: ignore[no-untyped-call]
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="recovery sweep")
        log.info("Greenlight is up (%s)", "Socket Mode" if s.socket_mode else f"HTTP :{self.port}")

    async def stop(self) -> None:
        """Stop taking work, let in-flight turns finish, close connections."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]
        if self._runner is not None:
            await self._runner.cleanup()
        if self.deps is not None:
            cut = await self.deps.background.drain(SHUTDOWN_GRACE)
            if cut:
                log.warning("%d turns were cut off by shutdown; the sweep resumes them", cut)
        await self._engine.dispose()

    async def _healthz(self, request: web.Request) -> web.Response:
        try:
            async with self._engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception:
            log.warning("health check: database unreachable", exc_info=True)
            return web.json_response({"ok": False, "database": "unreachable"}, status=503)
        return web.json_response({"ok": True})

    async def _sweep_forever(self) -> None:
        """Expire overdue approvals and finish turns a dead process left; first at start-up."""
        assert self.deps is not None and self.app is not None
        while True:
            try:
                report = await self.deps.workflow.sweep()
                await self.deps.delivery.sweep(self.app.client, report)
                async with self.deps.sessions.begin() as db:
                    await events.forget_before(db, utc_now() - timedelta(days=1))
            except Exception:
                log.exception("recovery sweep failed; trying again next interval")
            await asyncio.sleep(self.settings.RECOVERY_INTERVAL_SECONDS)


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT."""
    service = Service(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        await service.stop()
