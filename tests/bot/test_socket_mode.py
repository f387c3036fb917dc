"""Socket Mode, proven like HTTP: the real Service (Bolt's Socket Mode adapter, slack_sdk's
client) against a fake Socket Mode endpoint that behaves as Slack's (tests/fakes/socket_mode.py):
acknowledgements, refreshes, dropped connections, two replicas, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import (
    APPROVERS,
    DM,
    SlackClient,
    bot_settings,
    button_value,
    in_channel,
    new_ts,
)
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import BOT_USER_ID, Call, FakeSlack
from tests.fakes.socket_mode import FakeSocketMode, fake_socket_mode

ROOT = Path(__file__).resolve().parents[2]
PING = 0.5  # seconds: slack_sdk's ping interval, which is also its wait before a reconnect
ACK_WITHIN = 3.0  # Slack's deadline for an acknowledgement


@pytest.fixture
async def socket_mode(fake_slack: FakeSlack) -> AsyncIterator[FakeSocketMode]:
    async with fake_socket_mode(fake_slack) as fake:
        yield fake


@asynccontextmanager
async def replica(
    fake_slack: FakeSlack, gemini: FakeGemini, database: str, **overrides: Any
) -> AsyncIterator[Service]:
    """One Service in Socket Mode, as `python -m bot` runs it with SLACK_APP_TOKEN set."""
    settings = bot_settings(
        fake_slack,
        gemini,
        SLACK_APP_TOKEN="xapp-test",
        SLACK_SIGNING_SECRET=None,
        DATABASE_URL=database,
        **overrides,
    )
    svc = Service(settings, host="127.0.0.1", socket_ping_interval=PING)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()


@pytest.fixture
async def service(
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    socket_mode: FakeSocketMode,
    ledger: Path,
    bot_database: str,
) -> AsyncIterator[Service]:
    async with replica(fake_slack, gemini, bot_database) as svc:
        await socket_mode.wait_connections(1)
        yield svc


async def health(svc: Service) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{svc.port}/healthz") as response,
    ):
        return response.status


def replies_in(fake_slack: FakeSlack, ts: str) -> list[Call]:
    """The placeholders the bot posted in the thread of the message at `ts`: one per turn
    the message started (a doubled delivery would start two)."""
    return [
        c
        for c in fake_slack.calls_to("chat.postMessage")
        if in_channel(DM, ts)(c) and c.args.get("text") == "_Thinking…_"
    ]


def dm(team: str, user: str, ts: str, words: str = "hello") -> sp.Payload:
    return sp.message_im_event(team, user, DM, words, ts)


async def test_socket_mode_acks_envelopes_and_replies_in_thread(
    service: Service,
    socket_mode: FakeSocketMode,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
) -> None:
    (opened,) = fake_slack.calls_to("apps.connections.open")
    assert opened.token == "xapp-test"  # the app-level token, never the bot token

    gemini.script(text("Deployed nothing, just saying hi."))
    ts = new_ts()
    mention = sp.app_mention_event(team, "UEMP", "C0GENERAL", f"<@{BOT_USER_ID}> hi", ts)
    envelope = await socket_mode.deliver(mention)
    assert await socket_mode.wait_for_ack(envelope) == {"envelope_id": envelope}

    (placeholder,) = await fake_slack.wait_for(
        "chat.postMessage", predicate=in_channel("C0GENERAL", ts)
    )
    reply = await fake_slack.wait_for_message(
        lambda m: (
            m.get("channel") == "C0GENERAL" and m.get("text") == "Deployed nothing, just saying hi."
        )
    )
    assert placeholder.args["text"] == "_Thinking…_"
    assert reply["thread_ts"] == ts
    user_text = gemini.generate_requests()[0].json
    assert user_text is not None and f"<@{BOT_USER_ID}>" not in json.dumps(user_text)

    # Socket Mode serves no Slack route over HTTP: unsigned requests have nowhere to go.
    async with aiohttp.ClientSession() as http:
        client = SlackClient(http, service, fake_slack)
        assert (await client.send(mention))[0] == 404
        assert await client.get("/healthz") == (200, {"ok": True})
        async with http.get(f"{client.base}/metrics") as metrics:
            assert metrics.status == 200
            assert 'greenlight_turns_total{outcome="reply"} 1.0' in await metrics.text()


async def test_every_kind_of_envelope_is_acknowledged_within_3_seconds(
    service: Service,
    socket_mode: FakeSocketMode,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
) -> None:
    """events_api (a first delivery carries retry_attempt 0: it is not a retry), interactive
    (an Approve click) and slash_commands, each acknowledged in time and then acted on."""
    gemini.script(function_call("transferMoney", {"amount": 5, "toAccount": "12345"}))
    gemini.script(text("Sent."))
    ts = new_ts()
    event = await socket_mode.deliver(dm(team, "UEMP", ts, "send 5 to 12345"))
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))

    value = button_value(card, "approve")
    assert service.deps is not None
    approval = await service.deps.workflow.reads.approval(team, value.split("~")[0])  # id~version
    assert approval is not None
    click = sp.block_actions(
        team,
        "UBOSS",
        APPROVERS,
        (approval.card.ts if approval.card else None) or "1700000000.000000",  # as SlackClient
        "approve",
        value,
        "trigger-1",
        fake_slack.response_url("click"),
        block_id="approval",
        message_text=str(card.args.get("text", "")),
        message_blocks=card.args.get("blocks"),
    )
    interactive = await socket_mode.deliver(click)
    command = sp.slash_command(
        team, "UEMP", "/approvals", "list", "C0GENERAL", fake_slack.response_url("cmd"), "t-2"
    )
    slash = await socket_mode.deliver(command)

    for envelope in (event, interactive, slash):
        ack = await socket_mode.wait_for_ack(envelope, timeout=ACK_WITHIN)
        assert ack["envelope_id"] == envelope
        assert socket_mode.acked_at[envelope] - socket_mode.sent_at[envelope] < ACK_WITHIN
    await poll(lambda: len(ledger_tools.entries()) == 1, "the approved transfer ran")
    [answer] = await fake_slack.wait_for("response_url:cmd")
    assert "transferMoney" in str(answer.args["text"])
    await fake_slack.wait_for(
        "chat.postMessage",
        predicate=lambda c: in_channel(DM, ts)(c) and c.args.get("text") == "Sent.",
    )
    assert len(replies_in(fake_slack, ts)) == 1
    # Nothing needed a retry: each envelope was sent once.
    assert sorted(d.envelope_id for d in socket_mode.deliveries) == sorted(
        [event, interactive, slash]
    )


async def test_a_refresh_reconnects_without_losing_or_doubling_an_envelope(
    service: Service,
    socket_mode: FakeSocketMode,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
) -> None:
    messages = [new_ts() for _ in range(10)]
    gemini.script(*[text("Hi.") for _ in messages])
    (first,) = socket_mode.live
    envelopes = []
    for i, ts in enumerate(messages):
        if i == 5:  # Slack's refresh_requested, with envelopes before and after it
            await socket_mode.refresh(first)
            await socket_mode.wait(lambda: len(socket_mode.connections) == 2)
        envelopes.append(await socket_mode.deliver(dm(team, f"UEMP{i}", ts)))

    assert len(socket_mode.opens) == 2, "a new apps.connections.open for the new socket"
    await socket_mode.wait(lambda: first.closed.is_set())
    for envelope in envelopes:
        await socket_mode.wait_for_ack(envelope)
    await poll(lambda: all(len(replies_in(fake_slack, ts)) >= 1 for ts in messages), "every reply")
    assert service.deps is not None
    await service.deps.background.drain(15)
    assert [len(replies_in(fake_slack, ts)) for ts in messages] == [1] * len(messages)
    later = {d.connection for d in socket_mode.deliveries if d.envelope_id in envelopes[5:]}
    assert later == {1}, "after the refresh, envelopes go to the new connection"


async def test_a_dropped_connection_reconnects_with_backoff_and_is_unhealthy_meanwhile(
    service: Service,
    socket_mode: FakeSocketMode,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
) -> None:
    assert await health(service) == 200
    (first,) = socket_mode.live
    socket_mode.refuse = True  # Slack unreachable for a while: apps.connections.open fails
    socket_mode.drop(first)
    await poll(lambda: first.closed.is_set(), "the fake saw the connection go")

    deadline = time.monotonic() + 10
    while await health(service) != 503:
        assert time.monotonic() < deadline, "/healthz kept answering 200 with no connection"
        await asyncio.sleep(0.05)
    opened = len(socket_mode.opens)
    window = 6 * PING
    await asyncio.sleep(window)  # a measured window of refused reconnects
    attempts = len(socket_mode.opens) - opened
    assert attempts >= 1, "it keeps trying"
    # slack_sdk waits its ping interval after each failure (two loops may each try once).
    assert attempts <= 2 * (window / PING + 1), f"{attempts} attempts in {window}s: no backoff"
    assert await health(service) == 503

    socket_mode.refuse = False
    await socket_mode.wait_connections(1)
    await poll(lambda: socket_mode.connections[-1] is not first, "a new connection")
    deadline = time.monotonic() + 10
    while await health(service) != 200:
        assert time.monotonic() < deadline, "/healthz stayed 503 once reconnected"
        await asyncio.sleep(0.05)

    gemini.script(text("Back."))
    ts = new_ts()
    await socket_mode.wait_for_ack(await socket_mode.deliver(dm(team, "UEMP", ts)))
    await poll(lambda: len(replies_in(fake_slack, ts)) == 1, "the reply after the reconnect")


async def test_two_replicas_share_the_envelopes_and_handle_each_request_once(
    socket_mode: FakeSocketMode,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    ledger: Path,
    bot_database: str,
    team: str,
) -> None:
    async with AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(replica(fake_slack, gemini, bot_database))
            for _ in range(2)
        ]
        await socket_mode.wait_connections(2)
        messages = [new_ts() for _ in range(8)]
        gemini.script(*[text("Hi.") for _ in messages])
        for i, ts in enumerate(messages):
            payload = dm(team, f"UEMP{i}", ts)
            envelope = await socket_mode.deliver(payload)
            if i % 2 == 0:
                # Slack retries an event whose ack it did not get, maybe to the other replica.
                await socket_mode.wait_for_ack(envelope)
                await socket_mode.deliver(payload, retry_attempt=1)
        await poll(
            lambda: all(len(replies_in(fake_slack, ts)) >= 1 for ts in messages),
            "every message answered",
        )
        for svc in replicas:
            assert svc.deps is not None
            await svc.deps.background.drain(15)
        assert [len(replies_in(fake_slack, ts)) for ts in messages] == [1] * len(messages)
        handled = [await turns(svc) for svc in replicas]
        assert sum(handled) == len(messages) and all(n > 0 for n in handled), handled
        assert {d.connection for d in socket_mode.deliveries} == {0, 1}


async def turns(svc: Service) -> float:
    """Turns this replica ran to a reply (its own /metrics)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{svc.port}/metrics") as response,
    ):
        body = await response.text()
    line = 'greenlight_turns_total{outcome="reply"} '
    found = [float(x[len(line) :]) for x in body.splitlines() if x.startswith(line)]
    return found[0] if found else 0.0


async def test_sigterm_closes_the_socket_first_then_drains(
    socket_mode: FakeSocketMode,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    ledger: Path,
    bot_database: str,
    team: str,
) -> None:
    """`python -m bot` itself: SIGTERM closes the Slack connection (no reconnect), the turn
    in flight still finishes and is answered, and the process exits 0."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GEMINI_"))},
        "SLACK_BOT_TOKEN": "xoxb-test",
        "SLACK_APP_TOKEN": "xapp-test",
        "SLACK_API_URL": fake_slack.base_url,
        "GEMINI_API_KEY": "k",
        "GEMINI_API_URL": gemini.base_url,
        "DATABASE_URL": bot_database,
        "MIGRATE_ON_START": "false",
        "AGENT_TOOLS": "tests.ledger_tools",
        "APPROVER_CHANNEL": APPROVERS,
        "RECOVERY_INTERVAL_SECONDS": "3600",
        "PORT": "0",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await socket_mode.wait_connections(1, timeout=90)
        (conn,) = socket_mode.live
        gemini.script(text("Done, after a while.", delay=4))
        ts = new_ts()
        await socket_mode.wait_for_ack(await socket_mode.deliver(dm(team, "UEMP", ts)))
        await poll(lambda: len(replies_in(fake_slack, ts)) == 1, "the turn started")

        def answered() -> bool:
            return any(
                m.get("text") == "Done, after a while." for m in fake_slack.messages.values()
            )

        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(conn.closed.wait(), timeout=5)
        assert not answered(), "the socket closed before the turn in flight finished"
        await poll(answered, "the turn in flight was drained", timeout=30)
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
        assert len(socket_mode.opens) == 1, "no reconnect after SIGTERM"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if proc.stderr is not None:
            log = (await proc.stderr.read()).decode()
            assert "Traceback" not in log, log
