"""The service's own HTTP routes: Slack's events behind a signature check, /healthz and
/metrics.

The gateway adds its routes beside them (bot/server.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST
from slack_bolt.async_app import AsyncApp
from slack_sdk.signature import SignatureVerifier
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bot.metrics import Metrics

if TYPE_CHECKING:
    from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

log = logging.getLogger(__name__)

SLACK_PATH = "/slack/events"
HEALTH_TIMEOUT = 2.0  # seconds /healthz waits for the database before it answers 503


def signed_only(signing_secret: str) -> Middleware:
    """Let only correctly signed requests reach Bolt, and never let a body become a 500.

    Bolt parses a body before it checks the signature, and raises on what Slack never sends
    (bytes that are not UTF-8, JSON that is not an object, a `payload=` that is not JSON, a
    timestamp that is not a number); aiohttp answered those with a 500 to anyone who asked.
    Now: no valid signature, 401 whatever the body; signed but unreadable, 400.
    """
    verifier = SignatureVerifier(signing_secret)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST" or request.path != SLACK_PATH:
            return await handler(request)
        body = await request.read()
        try:
            signed = verifier.is_valid_request(body, dict(request.headers))
        except ValueError:  # a timestamp that is not a number
            signed = False
        if not signed:
            return web.json_response({"error": "invalid request"}, status=401)
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception as exc:
            log.warning("a signed request Bolt could not read: %r", exc)
            return web.json_response({"error": "malformed request"}, status=400)

    return guard


def slack_web_app(app: AsyncApp, *, socket_mode: bool, signing: str | None) -> web.Application:
    """The aiohttp application: with Slack's route over HTTP, signed requests only; in
    Socket Mode none, so unsigned HTTP requests never reach Bolt."""
    if socket_mode:
        return web.Application()
    web_app = app.web_app(path=SLACK_PATH)
    if signing is not None:
        web_app.middlewares.append(signed_only(signing))
    return web_app


class Probes:
    """/healthz and /metrics. `socket`: the Socket Mode connection, once there is one."""

    def __init__(
        self,
        health: AsyncEngine,
        metrics: Metrics,
        pending_by_tool: Callable[[], Awaitable[dict[str, int]]],
    ) -> None:
        self._health = health
        self._metrics = metrics
        self._pending_by_tool = pending_by_tool
        self.socket: AsyncSocketModeHandler | None = None

    def routes(self, web_app: web.Application) -> None:
        web_app.router.add_get("/healthz", self.healthz)
        web_app.router.add_get("/metrics", self.metrics)

    async def healthz(self, request: web.Request) -> web.Response:
        """200 when the database answers and, in Socket Mode, a connection to Slack is up:
        a replica without one receives nothing, so it is not ready."""
        link = self.socket.client if self.socket is not None else None  # slack_sdk's
        if link is not None and not await link.is_connected():
            return web.json_response({"ok": False, "slack": "disconnected"}, status=503)
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT), self._health.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception:
            log.warning("health check: database unreachable", exc_info=True)
            return web.json_response({"ok": False, "database": "unreachable"}, status=503)
        return web.json_response({"ok": True})

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus' text format (bot/metrics.py)."""
        body = await self._metrics.render(self._pending_by_tool)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
