"""GET /metrics and /healthz of the running service, and the Grafana dashboard built on them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncConnection

from bot.server import Service
from tests.bot.conftest import APPROVERS, SlackClient, bot_settings, in_channel, new_ts, settle
from tests.bot.test_e2e import REQUESTER, reply_in_thread, text_of
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import FakeSlack

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
TOOLS = {"AGENT_TOOLS": ["tests.ledger_tools", "tests.metrics_tools"]}


class Scrape:
    """One /metrics answer, parsed."""

    def __init__(self, body: str) -> None:
        self.families = list(text_string_to_metric_families(body))

    def value(self, name: str, **labels: str) -> float | None:
        """The sample `name` with exactly `labels`; None when there is none."""
        for family in self.families:
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return None

    def names(self) -> set[str]:
        """Every name a query may use: each family's samples, and families yet without any
        (a labelled counter before its first event), under their exposed names."""
        found = {s.name for f in self.families for s in f.samples}
        for f in self.families:
            match f.type:
                case "counter":
                    found.add(f"{f.name}_total")
                case "histogram":
                    found |= {f"{f.name}_bucket", f"{f.name}_count", f"{f.name}_sum"}
                case _:
                    found.add(f.name)
        return found


async def scrape(client: SlackClient) -> Scrape:
    async with client.http.get(f"{client.base}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        return Scrape(await response.text())


@pytest.mark.parametrize("service_overrides", [TOOLS])
async def test_an_approval_flow_shows_in_the_metrics(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    pending = "greenlight_approvals_pending"
    before = await scrape(client)
    # A known tool; the gauge counts the whole database, which other tests on this worker
    # share (they may leave a request of theirs pending), so it is read as a difference.
    waiting = before.value(pending, tool="issueRefund") or 0

    gemini.script(function_call("issueRefund", {"order": "A-1"}, id="call-1"))
    ts = new_ts()
    card = await client.dm_until_card(team, REQUESTER, "refund A-1", ts=ts)
    await settle(service)
    asked = await scrape(client)
    assert asked.value(pending, tool="issueRefund") == waiting + 1
    assert asked.value("greenlight_turns_total", outcome="awaiting_approval") == 1

    gemini.script(text("Refunded A-1."))
    assert (await client.click(team, "UBOSS", "approve", card))[0] == 200
    await reply_in_thread(fake_slack, ts)
    await settle(service)
    done = await scrape(client)
    assert done.value(pending, tool="issueRefund") == waiting
    assert done.value("greenlight_decisions_total", tool="issueRefund", outcome="approved") == 1
    assert done.value("greenlight_decision_seconds_count", outcome="approved") == 1
    assert done.value("greenlight_tool_executions_total", tool="issueRefund", outcome="ok") == 1
    assert done.value("greenlight_turns_total", outcome="reply") == 1
    assert done.value("greenlight_turn_seconds_count") == 2  # the message's, the resume's
    assert done.value("greenlight_queue_depth") == 0

    # Every metric the dashboard queries is served.
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {m for e in exprs for m in re.findall(r"\bgreenlight_[a-z_]+", e)}
    assert len(queried) == 8
    assert queried <= done.names(), queried - done.names()


@pytest.mark.parametrize("service_overrides", [TOOLS])
async def test_a_tool_that_raises_is_counted_as_an_error(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(function_call("issueRefund", {"order": "broken"}, id="call-1"))
    ts = new_ts()
    await client.dm(team, REQUESTER, "refund the broken one", ts=ts)
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    gemini.script(text("The refund failed."))
    await client.click(team, "UBOSS", "approve", card)
    reply = await reply_in_thread(fake_slack, ts)
    assert text_of(reply) == "The refund failed."
    await settle(service)
    counted = await scrape(client)
    executions = "greenlight_tool_executions_total"
    assert counted.value(executions, tool="issueRefund", outcome="error") == 1
    assert counted.value(executions, tool="issueRefund", outcome="ok") is None


async def test_slack_api_errors_are_counted_by_method_and_error(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(text("Hello."))
    # A 429 first (retried, and then posted), then an error on the answer's update.
    fake_slack.fail_next("chat.postMessage", status=429, retry_after=0)
    fake_slack.fail_next("chat.update", error="msg_too_long")
    await client.dm(team, REQUESTER, "hi", ts=new_ts())
    await settle(service)
    counted = await scrape(client)
    errors = "greenlight_slack_api_errors_total"
    assert counted.value(errors, method="chat.postMessage", error="ratelimited") == 1
    assert counted.value(errors, method="chat.update", error="msg_too_long") == 1
    assert len(fake_slack.calls_to("chat.postMessage")) >= 2  # the retry went out


# -- /healthz ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def silent_database() -> AsyncIterator[str]:
    """A "database" that takes connections and never answers: what a hung server looks like."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/silent"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def timed_get(svc: Service, path: str) -> tuple[int, float]:
    started = time.monotonic()
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{svc.port}{path}", timeout=aiohttp.ClientTimeout(total=10)
        ) as response,
    ):
        await response.read()
        return response.status, time.monotonic() - started


async def test_healthz_answers_503_fast_when_the_database_hangs(
    fake_slack: FakeSlack, gemini: FakeGemini, ledger: Path
) -> None:
    async with silent_database() as url:
        # Its start-up sweep hangs on the database, and gets the shutdown grace: kept short.
        settings = bot_settings(fake_slack, gemini, DATABASE_URL=url, SHUTDOWN_GRACE_SECONDS=0.5)
        svc = Service(settings, host="127.0.0.1")
        await svc.start()
        try:
            status, took = await timed_get(svc, "/healthz")
            metrics_status, metrics_took = await timed_get(svc, "/metrics")
        finally:
            await svc.stop()
    assert status == 503 and took < 3.5
    assert metrics_status == 200 and metrics_took < 3.5  # without the pending count


async def test_healthz_does_not_wait_for_an_exhausted_pool(
    fake_slack: FakeSlack, gemini: FakeGemini, ledger: Path, bot_database: str
) -> None:
    settings = bot_settings(fake_slack, gemini, DATABASE_URL=bot_database, DATABASE_POOL_SIZE=1)
    svc = Service(settings, host="127.0.0.1")
    await svc.start()
    try:
        async with contextlib.AsyncExitStack() as stack:
            engine = svc._engine  # the service's pool: every connection taken, none returned
            limit = engine.pool.size() + engine.pool._max_overflow  # type: ignore[attr-defined]
            held: list[AsyncConnection] = [
                await stack.enter_async_context(engine.connect()) for _ in range(limit)
            ]
            assert len(held) == limit
            status, took = await timed_get(svc, "/healthz")
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{svc.port}/metrics") as response,
            ):
                in_use = Scrape(await response.text()).value("greenlight_db_connections_in_use")
    finally:
        await svc.stop()
    assert status == 200 and took < 3.5  # the database answers; the pool is not asked
    assert in_use == limit  # what an operator sees when statements wait for a connection
