"""The gateway through a crash: `python -m bot` SIGKILLed while an MCP call waits for
approval. The next process sees the caller is gone (its lease ran out) and says so on the
card; approving it then runs nothing. An approvals-API request outlives the crash: its
caller still starts it, once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation

from agent.clock import new_uuid, utc_now
from agent.keys import ApiKeys
from storage.db import make_engine, make_session_factory
from storage.models import ApprovalRow
from tests import ledger_tools
from tests.bot.conftest import APPROVERS, SECRET, approval_id_of, button_value, in_channel
from tests.bot.test_faults import FAST_RECOVERY, BotProcess, bot_process
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini
from tests.fakes.slack_api import Call, FakeSlack

OWNER, BOSS = "UALICE", "UBOSS"


@contextlib.asynccontextmanager
async def mcp_at(port: int, token: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0, read=120.0)
    )
    transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
    try:
        async with Client(transport, client_info=Implementation(name="ci", version="9")) as c:
            yield c
    finally:
        await http.aclose()


async def approve(http: aiohttp.ClientSession, bot: BotProcess, team: str, card: Call) -> None:
    """BOSS presses Approve on `card`, through `bot`."""
    click = sp.block_actions(
        team,
        BOSS,
        APPROVERS,
        "1700000000.000100",
        "approve",
        button_value(card, "approve"),
        "trigger-1",
        "http://127.0.0.1:9/unused",
        block_id="approval",
        message_blocks=card.args.get("blocks"),
    )
    assert (await sp.post_signed(http, bot.url, SECRET, *click))[0] == 200


async def card_recorded(database: str, approval_id: str) -> None:
    engine = make_engine(database)
    sessions = make_session_factory(engine)

    async def recorded() -> bool:
        async with sessions() as db:
            row = await db.get(ApprovalRow, approval_id)
            return row is not None and bool(row.card_ts)

    try:
        await poll(recorded, "the card's ts recorded")
    finally:
        await engine.dispose()


def about(tool: str) -> Any:
    return lambda c: in_channel(APPROVERS)(c) and tool in json.dumps(c.args.get("blocks"))


async def test_a_crash_while_a_call_waits_runs_nothing_and_api_requests_stay_valid(
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    ledger: Path,
    bot_database: str,
    tmp_path: Path,
) -> None:
    engine = make_engine(bot_database)
    try:
        keys = ApiKeys(make_session_factory(engine), clock=utc_now, new_id=new_uuid)
        token = (await keys.create(team, OWNER, "ci")).token
    finally:
        await engine.dispose()
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http:
        async with bot_process(
            "first", fake_slack, gemini, bot_database, tmp_path, **FAST_RECOVERY
        ) as first:
            await first.wait_healthy(http)
            api = f"http://127.0.0.1:{first.port}/api/v1/approvals"
            body = {"tool": "deployRelease", "input": {"v": "1"}}
            async with http.post(api, json=body, headers=auth) as made:
                assert made.status == 201
                request_id = (await made.json())["id"]

            async def call() -> None:
                async with mcp_at(first.port or 0, token) as mcp:
                    await mcp.call_tool("transferMoney", {"amount": 70, "toAccount": "K1"})

            waiting = asyncio.create_task(call())
            [card] = await fake_slack.wait_for(
                "chat.postMessage", timeout=30, predicate=about("transferMoney")
            )
            # Killed once the card's place is recorded (before that, it is the outbox's
            # crash, tested in test_faults): the call waits, and its lease is held.
            await card_recorded(bot_database, approval_id_of(card))
            assert await first.stop(signal.SIGKILL) == -signal.SIGKILL
            with contextlib.suppress(BaseException):  # the connection went with the process
                await asyncio.wait_for(waiting, 30)
        [api_card] = await fake_slack.wait_for(
            "chat.postMessage", timeout=30, predicate=about("deployRelease")
        )

        async with bot_process(
            "second", fake_slack, gemini, bot_database, tmp_path, **FAST_RECOVERY
        ) as second:
            await second.wait_healthy(http)
            # The dead process's lease ran out: the card says the caller went away.
            try:
                await fake_slack.wait_for(
                    "chat.update",
                    timeout=30,
                    predicate=lambda c: "went away" in json.dumps(c.args.get("blocks")),
                )
            except AssertionError as missing:
                pytest.fail(f"{missing}\n{second.output()}")
            await approve(http, second, team, card)
            [decided] = await fake_slack.wait_for(
                "chat.update",
                timeout=30,
                predicate=lambda c: "Approved by" in json.dumps(c.args.get("blocks")),
            )
            assert "nothing will run" in json.dumps(decided.args["blocks"])
            assert ledger_tools.entries() == []  # the caller is gone: nothing ran

            # The API's request is as valid as before the crash: started once.
            await approve(http, second, team, api_card)
            api = f"http://127.0.0.1:{second.port}/api/v1/approvals/{request_id}"
            async with http.get(f"{api}?wait=30", headers=auth) as read:
                assert (await read.json())["status"] == "approved"
            starts = []
            for _ in range(2):
                async with http.post(f"{api}/start", headers=auth) as started:
                    starts.append(started.status)
            assert starts == [200, 409]
            assert await second.stop(signal.SIGTERM) == 0, second.output()
        assert "Traceback" not in second.output(), second.output()
    assert ledger_tools.entries() == []
