"""The approvals API's callback_url: one signed POST of the final status once decided,
retried after a failure, never again after a success, claimed by one replica; and never to
an address the operator did not allow (gateway/callbacks.py)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bot.server import Service
from storage.db import make_engine, make_session_factory
from storage.gateway_store import GatewayStore
from storage.models import GatewayCallbackRow
from tests.bot.conftest import APPROVERS, SlackClient, in_channel
from tests.bot.test_gateway_api import Api
from tests.conftest import poll
from tests.fakes.slack_api import FakeSlack

OWNER, BOSS = "UALICE", "UBOSS"


@dataclass
class Receiver:
    """A callback receiver on 127.0.0.1: answers each POST with the next of `statuses`."""

    statuses: list[int]
    got: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append((await request.read(), dict(request.headers)))
        status = self.statuses.pop(0) if self.statuses else 200
        return web.Response(status=status, text="ok" if status < 300 else "no")


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    got = Receiver([500])  # fails once, then takes it
    app = web.Application()
    app.router.add_post("/hook", got.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    got.url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    try:
        yield got
    finally:
        await runner.cleanup()


@pytest.fixture
def service_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The receiver is on loopback: allowed only where a test says so."""
    if getattr(request, "param", None) == "public only":
        return {}
    return {"CALLBACK_ALLOWED_NETWORKS": ["127.0.0.1/32"]}


@pytest.fixture
async def api(service: Service) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as http:
        yield Api(http, f"http://127.0.0.1:{service.port}")


async def callback_row(bot_database: str, approval_id: str) -> GatewayCallbackRow | None:
    engine = make_engine(bot_database)
    try:
        async with make_session_factory(engine)() as db:
            return await db.get(GatewayCallbackRow, approval_id)
    finally:
        await engine.dispose()


async def test_a_signed_callback_is_retried_after_a_500_and_sent_once(
    service: Service,
    api: Api,
    client: SlackClient,
    fake_slack: FakeSlack,
    team: str,
    receiver: Receiver,
    bot_database: str,
) -> None:
    assert service.deps is not None
    made_key = await service.deps.keys.create(team, OWNER, "deployer")
    asked = {"tool": "deployRelease", "input": {"v": "2"}, "callback_url": receiver.url}
    status, made = await api.call("POST", "/approvals", made_key.token, asked)
    assert status == 201
    [card] = await fake_slack.wait_for(
        "chat.postMessage", timeout=15, predicate=in_channel(APPROVERS)
    )
    assert receiver.got == []  # nothing before the decision
    await client.click(team, BOSS, "approve", card)
    await poll(lambda: len(receiver.got) >= 2, "the callback, once failed, then delivered")
    for body, headers in receiver.got:
        expected = hmac.new(made_key.callback_secret.encode(), body, hashlib.sha256).hexdigest()
        assert headers["X-Greenlight-Signature"] == f"sha256={expected}"
        assert json.loads(body) == {
            "id": made["id"],
            "status": "approved",
            "decided_by": BOSS,
            "reason": None,
            "input": {"v": "2"},
            "note": None,
        }
    row = await callback_row(bot_database, made["id"])
    assert row is not None and row.delivered_at is not None and row.attempts == 2
    # Delivered: never due again, whoever looks and however late.
    assert service.gateway is not None
    later = row.delivered_at + timedelta(days=1)
    owed = await service.gateway.store.claim_callbacks(now=later, lease_until=later, limit=10)
    assert owed == [] and len(receiver.got) == 2


async def test_two_replicas_claim_a_delivery_once(
    service: Service, api: Api, team: str, receiver: Receiver, bot_database: str
) -> None:
    """The claim is one conditional write: of many claims at once, one gets the row."""
    assert service.deps is not None
    token = (await service.deps.keys.create(team, OWNER, "deployer")).token
    _, made = await api.call("POST", "/approvals", token, {"tool": "deployRelease", "input": {}})
    assert service.gateway is not None
    found = await service.gateway.workflow.reads.approval(team, made["id"])
    assert found is not None
    engine = make_engine(bot_database)
    try:
        stores = [GatewayStore(make_session_factory(engine)) for _ in range(4)]
        # Not yet decided: owed, not due.
        far = found.request.requested_at + timedelta(minutes=5)
        await stores[0].owe_callback(found, key_id="k", url=receiver.url, now=far)
        assert await stores[0].claim_callbacks(now=far, lease_until=far, limit=5) == []
        assert (await api.call("DELETE", f"/approvals/{made['id']}", token))[0] == 200
        claims = await asyncio.gather(
            *(
                s.claim_callbacks(now=far, lease_until=far + timedelta(minutes=1), limit=5)
                for s in stores
            )
        )
    finally:
        await engine.dispose()
    mine = [o for claim in claims for o in claim if o.approval_id == made["id"]]
    assert len(mine) == 1 and mine[0].attempt == 1


@pytest.mark.parametrize("service_overrides", ["public only"], indirect=True)
async def test_callbacks_go_to_public_addresses_only(
    service: Service,
    api: Api,
    team: str,
    receiver: Receiver,
    bot_database: str,
) -> None:
    """By default a callback may not reach loopback, private or link-local addresses (the
    bot's own host, the cloud's metadata service): refused when given as an address, and
    when a name resolves to one, at delivery."""
    assert service.deps is not None
    token = (await service.deps.keys.create(team, OWNER, "deployer")).token
    port = receiver.url.split(":")[2].split("/")[0]
    for bad in (
        receiver.url,
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/x",
        "ftp://example.com/x",
        "http://user:pw@example.com/x",
        "not a url",
    ):
        asked = {"tool": "deployRelease", "input": {}, "callback_url": bad}
        status, body = await api.call("POST", "/approvals", token, asked)
        assert status == 400 and "callback_url" in body["fields"], bad
    # A name that resolves to loopback is taken, and refused as it is called.
    asked = {
        "tool": "deployRelease",
        "input": {},
        "callback_url": f"http://localhost:{port}/hook",
    }
    status, made = await api.call("POST", "/approvals", token, asked)
    assert status == 201
    assert (await api.call("DELETE", f"/approvals/{made['id']}", token))[0] == 200

    async def given_up() -> bool:
        row = await callback_row(bot_database, made["id"])
        return row is not None and row.gave_up_at is not None

    await poll(given_up, "the callback given up", timeout=20)
    row = await callback_row(bot_database, made["id"])
    assert row is not None and "may call" in (row.last_error or "")
    assert receiver.got == []
