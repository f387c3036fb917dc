"""A fake Slack Socket Mode endpoint on 127.0.0.1 that behaves as Slack's does.

`apps.connections.open` (answered through FakeSlack) hands out a one-use WebSocket URL; each
connection gets a `hello`; each envelope (`events_api`, `interactive`, `slash_commands`) goes
to one live connection, round robin, first with `retry_attempt: 0`; one not acknowledged in
time (or whose connection went away first) is sent again, to a live connection, with the next
`retry_attempt`, up to three retries, as Slack retries. `refresh()` sends
`{"type": "disconnect", "reason": "refresh_requested"}` and closes that socket a little later;
`drop()` cuts a connection without a close frame; `refuse` makes `apps.connections.open` fail.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web

from tests.fakes.slack_api import APP_ID, FakeSlack, serve_local
from tests.fakes.slack_payloads import FORM_CT, Payload

JSON = dict[str, Any]
MAX_RETRIES = 3


@dataclass
class Connection:
    """One WebSocket a client opened."""

    number: int
    ws: web.WebSocketResponse
    request: web.Request
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    closed_at: float | None = None


@dataclass
class Delivery:
    """One sending of an envelope: on which connection, which attempt."""

    envelope_id: str
    connection: int
    retry_attempt: int


def envelope_of(payload: Payload) -> tuple[str, JSON]:
    """What Slack sends over the socket for what it would POST over HTTP: the same payload."""
    if payload.content_type == FORM_CT:
        form = dict(parse_qsl(payload.body.decode()))
        if "payload" in form:
            return "interactive", json.loads(form["payload"])
        return "slash_commands", form
    return "events_api", json.loads(payload.body)


class FakeSocketMode:
    def __init__(self, slack: FakeSlack, *, retry_after: float = 3.0) -> None:
        self.slack = slack
        self.retry_after = retry_after  # seconds Slack waits for an ack before it retries
        self.refuse = False  # apps.connections.open answers an error meanwhile
        self.opens: list[float] = []  # monotonic time of each apps.connections.open
        self.connections: list[Connection] = []
        self.deliveries: list[Delivery] = []
        self.acks: dict[str, list[tuple[int, JSON]]] = {}  # envelope id -> (connection, ack)
        self.sent_at: dict[str, float] = {}  # envelope id -> its first sending
        self.acked_at: dict[str, float] = {}  # envelope id -> its first acknowledgement
        self.url = ""
        self.app = web.Application()
        self.app.router.add_get("/link/{ticket}", self._link)
        self._tickets: set[str] = set()
        self._ids = itertools.count(1)
        self._turn = itertools.count()
        self._cond = asyncio.Condition()
        self._retries: set[asyncio.Task[None]] = set()
        self.connected = asyncio.Event()  # set while at least one connection is live

    # -- the Web API side ------------------------------------------------------------------

    def _open(self, args: JSON) -> JSON:
        self.opens.append(time.monotonic())
        if self.refuse:
            return {"ok": False, "error": "internal_error"}
        ticket = f"t{next(self._ids)}"
        self._tickets.add(ticket)
        return {"ok": True, "url": f"{self.url}/link/{ticket}"}

    # -- the WebSocket side ----------------------------------------------------------------

    @property
    def live(self) -> list[Connection]:
        return [c for c in self.connections if not c.closed.is_set()]

    async def _link(self, request: web.Request) -> web.StreamResponse:
        ticket = request.match_info["ticket"]
        if ticket not in self._tickets:  # each URL is good for one connection
            return web.Response(status=401, text="invalid ticket")
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse()  # answers pings: slack_sdk checks the pongs
        await ws.prepare(request)
        conn = Connection(len(self.connections), ws, request)
        self.connections.append(conn)
        await ws.send_json(
            {
                "type": "hello",
                "num_connections": len(self.live),
                "debug_info": {"host": "fake", "approximate_connection_time": 18060},
                "connection_info": {"app_id": APP_ID},
            }
        )
        async with self._cond:
            self.connected.set()
            self._cond.notify_all()
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    ack = json.loads(message.data)
                    async with self._cond:
                        self.acked_at.setdefault(str(ack.get("envelope_id")), time.monotonic())
                        self.acks.setdefault(str(ack.get("envelope_id")), []).append(
                            (conn.number, ack)
                        )
                        self._cond.notify_all()
        finally:
            async with self._cond:
                conn.closed_at = time.monotonic()
                conn.closed.set()
                if not self.live:
                    self.connected.clear()
                self._cond.notify_all()
        return ws

    async def wait(self, predicate: Any, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout), self._cond:
            await self._cond.wait_for(predicate)

    async def wait_connections(self, count: int, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        await self.wait(lambda: len(self.live) >= count, timeout)

    # -- sending ---------------------------------------------------------------------------

    async def deliver(self, payload: Payload, *, retry_attempt: int = 0) -> str:
        """Send `payload` as a new envelope to one live connection (the next, round robin);
        retried as Slack retries. `retry_attempt` > 0: Slack's retry of the same event after
        an acknowledgement it did not get."""
        kind, body = envelope_of(payload)
        envelope_id = f"env-{next(self._ids)}"
        self.sent_at[envelope_id] = time.monotonic()
        await self._send(envelope_id, kind, body, retry_attempt)
        task = asyncio.create_task(self._retry(envelope_id, kind, body))
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)
        return envelope_id

    async def _send(self, envelope_id: str, kind: str, body: JSON, attempt: int) -> None:
        await self.wait_connections(1)
        live = self.live
        conn = live[next(self._turn) % len(live)]
        envelope = {
            "envelope_id": envelope_id,
            "type": kind,
            "accepts_response_payload": kind != "events_api",
            "payload": body,
        }
        if kind == "events_api":
            envelope |= {"retry_attempt": attempt, "retry_reason": "timeout" if attempt else ""}
        self.deliveries.append(Delivery(envelope_id, conn.number, attempt))
        await conn.ws.send_json(envelope)

    async def _retry(self, envelope_id: str, kind: str, body: JSON) -> None:
        for attempt in range(1, MAX_RETRIES + 1):
            sent_on = next(
                d.connection for d in reversed(self.deliveries) if d.envelope_id == envelope_id
            )
            gone = self.connections[sent_on].closed
            with suppress(TimeoutError):
                await self.wait(
                    lambda gone=gone: envelope_id in self.acks or gone.is_set(), self.retry_after
                )
            if envelope_id in self.acks:
                return
            if kind == "events_api":  # Slack retries events; the other kinds are lost
                await self._send(envelope_id, kind, body, attempt)
            else:
                return

    async def wait_for_ack(self, envelope_id: str, timeout: float = 5.0) -> JSON:  # noqa: ASYNC109
        await self.wait(lambda: envelope_id in self.acks, timeout)
        return self.acks[envelope_id][0][1]

    async def refresh(self, connection: Connection, *, close_after: float = 1.0) -> None:
        """Slack's periodic `refresh_requested`: the client should open a new connection; the
        old one is closed a little later (unless the client closed it first)."""
        await connection.ws.send_json(
            {
                "type": "disconnect",
                "reason": "refresh_requested",
                "debug_info": {"host": "fake"},
            }
        )
        with_grace = asyncio.create_task(self._close_later(connection, close_after))
        self._retries.add(with_grace)
        with_grace.add_done_callback(self._retries.discard)

    async def _close_later(self, connection: Connection, delay: float) -> None:
        try:
            await asyncio.wait_for(connection.closed.wait(), delay)
        except TimeoutError:
            await connection.ws.close()

    def drop(self, connection: Connection) -> None:
        """The network goes away: the TCP connection is cut with no close frame."""
        transport = connection.request.transport
        assert transport is not None
        transport.abort()

    async def close(self) -> None:
        for task in list(self._retries):
            task.cancel()
        for conn in self.live:
            await conn.ws.close()


@asynccontextmanager
async def fake_socket_mode(slack: FakeSlack, **kwargs: Any) -> AsyncIterator[FakeSocketMode]:
    """Serve the endpoint and answer `apps.connections.open` on `slack` with its URLs."""
    fake = FakeSocketMode(slack, **kwargs)
    async with serve_local(fake.app) as url:
        fake.url = url.replace("http://", "ws://")
        slack.handlers["apps.connections.open"] = fake._open
        try:
            yield fake
        finally:
            await fake.close()
