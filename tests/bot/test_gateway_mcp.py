"""The gateway's MCP door (gateway/mcp.py) through the real service: an agent with an API
key lists Greenlight's tools and calls them through the mcp SDK's own streamable HTTP
client; calls that need approval wait for a person in (fake) Slack, and an approved call
runs once, behind the execution gate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation

from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import APPROVERS, SlackClient, in_channel
from tests.fakes.slack_api import Call, FakeSlack

OWNER, BOSS = "UALICE", "UBOSS"


async def new_key(service: Service, team: str, name: str = "ci", user: str = OWNER) -> str:
    assert service.deps is not None
    return (await service.deps.keys.create(team, user, name)).token


@asynccontextmanager
async def mcp_client(service: Service, token: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30.0, read=120.0)
    )
    transport = streamable_http_client(f"http://127.0.0.1:{service.port}/mcp", http_client=http)
    try:
        async with Client(
            transport, client_info=Implementation(name="test-agent", version="1.2.3")
        ) as client:
            yield client
    finally:
        await http.aclose()


async def card_for(slack: FakeSlack) -> Call:
    [card] = await slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    return card


async def test_tools_are_listed_under_their_policy_names(service: Service, team: str) -> None:
    async with mcp_client(service, await new_key(service, team)) as mcp:
        listed = {t.name: t for t in (await mcp.list_tools()).tools}
    assert {"transferMoney", "getBalance"} <= set(listed)
    assert "askHuman" not in listed  # the agent's own way to ask a person
    assert set(listed["transferMoney"].input_schema["properties"]) == {"amount", "toAccount"}


async def test_an_allowed_tool_runs_at_once(service: Service, team: str, ledger: Any) -> None:
    assert service.deps is not None
    await service.deps.workflow.policies.change(team, "getBalance", by="UADMIN", allowed=True)
    async with mcp_client(service, await new_key(service, team)) as mcp:
        result = await mcp.call_tool("getBalance", {"account": "A1"})
    assert not result.is_error
    assert result.structured_content == {"account": "A1", "balance": 100.0}
    assert json.loads(result.content[0].text) == {"account": "A1", "balance": 100.0}  # type: ignore[union-attr]
    assert ledger_tools.entries() == [{"tool": "getBalance", "account": "A1"}]


async def test_a_call_waits_for_approval_and_runs_once(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str, ledger: Any
) -> None:
    async with mcp_client(service, await new_key(service, team)) as mcp:
        call = asyncio.create_task(
            mcp.call_tool("transferMoney", {"amount": 50, "toAccount": "X9"})
        )
        card = await card_for(fake_slack)
        shown = json.dumps(card.args["blocks"])
        assert f"<@{OWNER}>" in shown and "through key `ci`" in shown
        assert "MCP client `test-agent 1.2.3`" in shown
        assert not call.done() and ledger_tools.entries() == []
        # Four eyes: the key's owner is the requester and cannot approve.
        await client.click(team, OWNER, "approve", card)
        await fake_slack.wait_for("chat.postEphemeral")
        assert not call.done()
        await client.click(team, BOSS, "approve", card)
        result = await asyncio.wait_for(call, 30)
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["success"] is True
    [ran] = ledger_tools.entries()
    assert ran["tool"] == "transferMoney" and ran["amount"] == 50 and ran["key"]
    assert result.structured_content["transactionId"] == f"txn-{ran['key']}"
    # The trail names the door and the key; the metric counts the call.
    assert service.deps is not None
    trail = await service.deps.workflow.reads.audit_trail(team, "transferMoney")
    assert {e.action for e in trail} >= {"requested", "approved", "execution_started", "executed"}
    assert all((e.detail["door"], e.detail["key"]) == ("mcp", "ci") for e in trail)
    _, audit = await client.command(team, BOSS, "audit")
    assert "via mcp, key `ci`" in audit
    url = f"http://127.0.0.1:{service.port}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        metrics = await response.text()
    assert 'greenlight_gateway_calls_total{door="mcp",outcome="approved"} 1.0' in metrics


async def test_a_denied_call_runs_nothing_and_says_why(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str, ledger: Any
) -> None:
    async with mcp_client(service, await new_key(service, team)) as mcp:
        call = asyncio.create_task(mcp.call_tool("transferMoney", {"amount": 5, "toAccount": "X"}))
        card = await card_for(fake_slack)
        await client.click(team, BOSS, "deny", card)
        (opened,) = await fake_slack.wait_for("views.open")
        reason = {"reason": {"reason": {"type": "plain_text_input", "value": "not today"}}}
        await client.submit(team, BOSS, opened.args["view"], reason)
        result = await asyncio.wait_for(call, 30)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert "denied" in text and "not today" in text
    assert ledger_tools.entries() == []


async def test_invalid_arguments_name_the_field_and_ask_nobody(
    service: Service, fake_slack: FakeSlack, team: str, ledger: Any
) -> None:
    async with mcp_client(service, await new_key(service, team)) as mcp:
        with pytest.raises(MCPError) as raised:
            await mcp.call_tool("transferMoney", {"amount": "lots", "toAccount": "X"})
    assert "amount" in raised.value.error.message
    assert fake_slack.calls_to("chat.postMessage") == []


@pytest.mark.parametrize("header", [None, "Bearer glk_" + "x" * 30, "Bearer nope", "Basic abc"])
async def test_a_missing_or_wrong_key_gets_401(service: Service, header: str | None) -> None:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if header is not None:
        headers["Authorization"] = header
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{service.port}/mcp", json=body, headers=headers) as response,
    ):
        assert response.status == 401


async def test_a_revoked_key_gets_401(service: Service, team: str) -> None:
    assert service.deps is not None
    token = await new_key(service, team, "gone")
    assert await service.deps.keys.revoke(team, OWNER, "gone")
    with pytest.raises(Exception):  # noqa: B017 - the client raises on the 401
        async with mcp_client(service, token) as mcp:
            await mcp.list_tools()


# -- Claude Code's permission prompt ---------------------------------------------------------


async def test_approval_prompt_allows_with_the_input_once_approved(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    asked = {"tool_name": "Bash", "input": {"command": "ls -la"}, "tool_use_id": "toolu_1"}
    async with mcp_client(service, await new_key(service, team)) as mcp:
        assert "approval_prompt" in {t.name for t in (await mcp.list_tools()).tools}
        call = asyncio.create_task(mcp.call_tool("approval_prompt", asked))
        card = await card_for(fake_slack)
        shown = json.dumps(card.args["blocks"])
        assert "prompt.Bash" in shown and "ls -la" in shown
        await client.click(team, BOSS, "approve", card)
        result = await asyncio.wait_for(call, 30)
    [content] = result.content
    assert json.loads(content.text) == {  # type: ignore[union-attr]
        "behavior": "allow",
        "updatedInput": {"command": "ls -la"},
    }


async def test_approval_prompt_denies_with_the_reason(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    asked = {"tool_name": "Bash", "input": {"command": "rm -rf /"}}
    async with mcp_client(service, await new_key(service, team)) as mcp:
        call = asyncio.create_task(mcp.call_tool("approval_prompt", asked))
        card = await card_for(fake_slack)
        await client.click(team, BOSS, "deny", card)
        (opened,) = await fake_slack.wait_for("views.open")
        reason = {"reason": {"reason": {"type": "plain_text_input", "value": "never"}}}
        await client.submit(team, BOSS, opened.args["view"], reason)
        result = await asyncio.wait_for(call, 30)
    answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert answer["behavior"] == "deny" and "denied" in answer["message"]
    assert "never" in answer["message"]


async def test_approval_prompt_edit_and_approve_gives_the_edited_input(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    """A field per top-level key, labelled with it; text as text, the rest as JSON."""
    from tests.bot.test_edits import open_edit

    asked = {"tool_name": "Bash", "input": {"command": "rm -rf build", "timeout": 30}}
    async with mcp_client(service, await new_key(service, team)) as mcp:
        call = asyncio.create_task(mcp.call_tool("approval_prompt", asked))
        card = await card_for(fake_slack)
        opened = await open_edit(client, fake_slack, team, card)
        fields = {b["block_id"]: b for b in opened.args["view"]["blocks"] if b["type"] == "input"}
        assert fields.pop("greenlight:note")["optional"] is True  # the approver's note
        assert [f["label"]["text"] for f in fields.values()] == ["command", "timeout"]
        assert fields["command"]["element"]["initial_value"] == "rm -rf build"
        assert fields["timeout"]["element"]["initial_value"] == "30"  # JSON
        bad = {"timeout": {"value": {"type": "plain_text_input", "value": "{nope"}}}
        status, answer = await client.submit(team, BOSS, opened.args["view"], bad)
        assert status == 200 and "timeout" in answer and not call.done()
        edited = {
            "command": {"value": {"type": "plain_text_input", "value": "rm -rf build/tmp"}},
            "timeout": {"value": {"type": "plain_text_input", "value": "60"}},
        }
        assert await client.submit(team, BOSS, opened.args["view"], edited) == (200, "")
        result = await asyncio.wait_for(call, 30)
    assert json.loads(result.content[0].text) == {  # type: ignore[union-attr]
        "behavior": "allow",
        "updatedInput": {"command": "rm -rf build/tmp", "timeout": 60},
    }


async def test_a_prompt_policy_allows_a_claude_code_tool(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    _, done = await client.command(team, "UADMIN", "allow prompt.Read")
    assert done.startswith("Done."), done
    asked = {"tool_name": "Read", "input": {"file_path": "README.md"}}
    async with mcp_client(service, await new_key(service, team)) as mcp:
        result = await mcp.call_tool("approval_prompt", asked)
    answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert answer == {"behavior": "allow", "updatedInput": {"file_path": "README.md"}}
    assert fake_slack.calls_to("chat.postMessage") == []


# -- a caller that goes away, and one that waits long -----------------------------------------


async def test_a_caller_that_goes_away_leaves_a_request_that_runs_nothing(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str, ledger: Any
) -> None:
    token = await new_key(service, team)

    async def call_then_leave() -> None:
        async with mcp_client(service, token) as mcp:
            await mcp.call_tool("transferMoney", {"amount": 7, "toAccount": "GONE"})

    caller = asyncio.create_task(call_then_leave())
    card = await card_for(fake_slack)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    [update] = await fake_slack.wait_for(
        "chat.update", timeout=15, predicate=lambda c: "went away" in json.dumps(c.args)
    )
    assert "nothing will run" in json.dumps(update.args["blocks"])
    # No Slack thread is behind a gateway request: its card links to none.
    assert "View the conversation" not in json.dumps(update.args)
    assert service.deps is not None
    pending = await service.deps.workflow.reads.pending(team)
    assert [a.request.tool for a in pending] == ["transferMoney"]  # not cancelled
    await client.click(team, BOSS, "approve", card)
    await fake_slack.wait_for(
        "chat.update", timeout=15, predicate=lambda c: "Approved by" in json.dumps(c.args)
    )
    assert ledger_tools.entries() == []


async def test_a_waiting_call_hears_progress(
    service: Service,
    client: SlackClient,
    fake_slack: FakeSlack,
    team: str,
    monkeypatch: pytest.MonkeyPatch,
    ledger: Any,
) -> None:
    from gateway import calls

    monkeypatch.setattr(calls, "PROGRESS_SECONDS", 0.3)
    heard: list[float] = []
    got = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append(progress)
        got.set()

    async with mcp_client(service, await new_key(service, team)) as mcp:
        call = asyncio.create_task(
            mcp.call_tool(
                "transferMoney", {"amount": 1, "toAccount": "P"}, progress_callback=on_progress
            )
        )
        card = await card_for(fake_slack)
        await asyncio.wait_for(got.wait(), 15)
        await client.click(team, BOSS, "approve", card)
        result = await asyncio.wait_for(call, 30)
    assert not result.is_error and heard and heard == sorted(heard)


async def test_edit_and_approve_runs_the_edited_input_and_says_what_changed(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str, ledger: Any
) -> None:
    from tests.bot.test_edits import open_edit, values

    async with mcp_client(service, await new_key(service, team)) as mcp:
        call = asyncio.create_task(
            mcp.call_tool("transferMoney", {"amount": 500, "toAccount": "E1"})
        )
        card = await card_for(fake_slack)
        opened = await open_edit(client, fake_slack, team, card)
        assert await client.submit(team, BOSS, opened.args["view"], values("300", "E1")) == (
            200,
            "",
        )
        result = await asyncio.wait_for(call, 30)
    assert not result.is_error and result.structured_content is not None
    assert result.structured_content["approved_with_changes"] == {
        "amount": {"from": 500, "to": 300}
    }
    assert result.structured_content["output"]["success"] is True
    [ran] = ledger_tools.entries()
    assert ran["amount"] == 300


async def test_an_approvers_note_comes_with_the_result(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str, ledger: Any
) -> None:
    """The caller's model gets the note, as Greenlight's own agent does: `{"output": …,
    "note": …}`."""
    from tests.bot.conftest import approval_id_of
    from tests.bot.test_approver_tools import note, opened_view, press

    async with mcp_client(service, await new_key(service, team)) as mcp:
        call = asyncio.create_task(mcp.call_tool("transferMoney", {"amount": 9, "toAccount": "N"}))
        card = await card_for(fake_slack)
        id_ = approval_id_of(card)
        assert (await press(client, team, BOSS, "approve_menu", f"note:{id_}~1", card))[0] == 200
        view = await opened_view(fake_slack, 0)
        assert await client.submit(team, BOSS, view, note("Only this once.")) == (200, "")
        result = await asyncio.wait_for(call, 30)
    assert not result.is_error
    body = {"output": {"success": True, "transactionId": f"txn-{id_}"}, "note": "Only this once."}
    assert result.structured_content == body
    assert json.loads(result.content[0].text) == body  # type: ignore[union-attr]
    assert len(ledger_tools.entries()) == 1


async def test_edit_and_approve_with_a_note_says_both(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str, ledger: Any
) -> None:
    from bot.modals import EDIT_NOTE
    from tests.bot.test_edits import open_edit, values

    async with mcp_client(service, await new_key(service, team)) as mcp:
        call = asyncio.create_task(mcp.call_tool("transferMoney", {"amount": 80, "toAccount": "E"}))
        card = await card_for(fake_slack)
        opened = await open_edit(client, fake_slack, team, card)
        written = {EDIT_NOTE: {"note": {"type": "plain_text_input", "value": "Capped at 60."}}}
        submitted = values("60", "E") | written
        assert await client.submit(team, BOSS, opened.args["view"], submitted) == (200, "")
        result = await asyncio.wait_for(call, 30)
    assert not result.is_error and result.structured_content is not None
    assert result.structured_content["approved_with_changes"] == {"amount": {"from": 80, "to": 60}}
    assert result.structured_content["note"] == "Capped at 60."
    assert result.structured_content["output"]["success"] is True


async def test_two_replicas_run_an_approved_call_once(
    service: Service,
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: Any,
    bot_database: str,
    team: str,
    ledger: Any,
) -> None:
    """The call waits on one replica; the click lands on the other; it runs once, there."""
    from tests.bot.conftest import bot_settings

    other = Service(bot_settings(fake_slack, gemini, DATABASE_URL=bot_database), host="127.0.0.1")
    await other.start()
    try:
        async with mcp_client(service, await new_key(service, team)) as mcp:
            call = asyncio.create_task(
                mcp.call_tool("transferMoney", {"amount": 9, "toAccount": "R2"})
            )
            card = await card_for(fake_slack)
            there = SlackClient(client.http, other, fake_slack)
            await asyncio.gather(
                there.click(team, BOSS, "approve", card), client.click(team, BOSS, "approve", card)
            )
            result = await asyncio.wait_for(call, 30)
    finally:
        await other.stop()
    assert not result.is_error
    assert [e["tool"] for e in ledger_tools.entries()] == ["transferMoney"]


class Alternating(httpx2.AsyncHTTPTransport):
    """Sends the session's first request (initialize) to one replica, the rest to another,
    as a balancer with no stickiness might."""

    def __init__(self, first: int, rest: int) -> None:
        super().__init__()
        self.ports = (first, rest)
        self.sent: list[tuple[str, int]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[0] if not self.sent else self.ports[1]
        request.url = request.url.copy_with(port=port)
        self.sent.append((request.method, port))
        return await super().handle_async_request(request)


async def test_any_replica_serves_any_request_of_a_session(
    service: Service,
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: Any,
    bot_database: str,
    team: str,
    ledger: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Initialize on one replica, everything after on the other (no balancer, no sticky
    sessions): the card still names the client, and progress still comes while it waits."""
    from gateway import calls
    from tests.bot.conftest import bot_settings

    monkeypatch.setattr(calls, "PROGRESS_SECONDS", 0.3)
    other = Service(bot_settings(fake_slack, gemini, DATABASE_URL=bot_database), host="127.0.0.1")
    await other.start()
    heard = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.set()

    try:
        assert service.port is not None and other.port is not None
        routes = Alternating(service.port, other.port)
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {await new_key(service, team)}"},
            timeout=httpx2.Timeout(30.0, read=120.0),
            transport=routes,
        )
        transport = streamable_http_client(f"http://127.0.0.1:{service.port}/mcp", http_client=http)
        info = Implementation(name="roaming-agent", version="4.5.6")
        async with Client(transport, client_info=info) as mcp:
            call = asyncio.create_task(
                mcp.call_tool(
                    "transferMoney", {"amount": 3, "toAccount": "RR"}, progress_callback=on_progress
                )
            )
            card = await card_for(fake_slack)
            assert "MCP client `roaming-agent 4.5.6`" in json.dumps(card.args["blocks"])
            await asyncio.wait_for(heard.wait(), 15)
            await client.click(team, BOSS, "approve", card)
            result = await asyncio.wait_for(call, 30)
        await http.aclose()
    finally:
        await other.stop()
    assert not result.is_error
    assert [e["tool"] for e in ledger_tools.entries()] == ["transferMoney"]
    assert routes.sent[0] == ("POST", service.port)
    assert ("POST", other.port) in routes.sent[1:]
    assert all(port == other.port for _, port in routes.sent[1:])


async def test_a_session_is_its_keys_alone_and_ends_when_deleted(
    service: Service, team: str
) -> None:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    url = f"http://127.0.0.1:{service.port}/mcp"
    mine = {**headers, "Authorization": f"Bearer {await new_key(service, team)}"}
    theirs = {**headers, "Authorization": f"Bearer {await new_key(service, team, 'x', 'UBOB')}"}
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        },
    }
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=hello, headers=mine) as opened:
            assert opened.status == 200
            session = opened.headers["Mcp-Session-Id"]
        ours = {**mine, "Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-06-18"}
        async with http.post(url, json=listing, headers=ours) as listed:
            assert listed.status == 200
        stolen = {**theirs, "Mcp-Session-Id": session}
        async with http.post(url, json=listing, headers=stolen) as refused:
            assert refused.status == 404
        async with http.get(url, headers=ours) as stream:
            assert stream.status == 405  # the server never speaks first
        async with http.delete(url, headers=ours) as ended:
            assert ended.status == 200
        async with http.post(url, json=listing, headers=ours) as after:
            assert after.status == 404
