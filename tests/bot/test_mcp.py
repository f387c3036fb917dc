"""MCP servers' tools through the running service: a real stdio MCP server (tests/mcp_tickets.py)
behind the approval middleware, the real Bolt app, fake Slack and fake Gemini."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.server import Service
from tests import mcp_tickets
from tests.bot.conftest import (
    ADMIN,
    APPROVERS,
    DM,
    SlackClient,
    in_channel,
    new_ts,
    policy_file,
    settle,
)
from tests.bot.test_e2e import blocks_of, reply_in_thread, said, text_of
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import FakeSlack

SERVER = str(Path(mcp_tickets.__file__))
REQUESTER = "UEMP"


@pytest.fixture
def ready_at_start() -> bool:
    """Whether the tickets server answers when the service starts (parametrize to change)."""
    return True


@pytest.fixture
def ready(tmp_path: Path, ready_at_start: bool) -> Path:
    """The file whose existence lets the tickets server start."""
    path = tmp_path / "tickets-ready"
    if ready_at_start:
        path.touch()
    return path


@pytest.fixture
def in_policy_file() -> bool:
    """Whether POLICY_FILE lists the server (else MCP_SERVERS does); parametrize to change."""
    return False


@pytest.fixture
def service_overrides(
    tmp_path: Path,
    ready: Path,
    in_policy_file: bool,
    fake_slack: FakeSlack,
    team: str,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, Any]:
    log = tmp_path / "tickets.jsonl"
    monkeypatch.setenv("TICKETS_LOG", str(log))  # for mcp_tickets.created() in this process
    env = {"TICKETS_LOG": str(log), "TICKETS_READY": str(ready)}
    servers = {"tickets": {"command": sys.executable, "args": [SERVER], "env": env}}
    if not in_policy_file:
        return {"MCP_SERVERS": servers}
    policy = {"allow": ["tickets.list_tickets"], "mcp_servers": servers}  # JSON is YAML
    return policy_file(fake_slack, team, tmp_path / "policy.yml", json.dumps(policy))


def declared(gemini: FakeGemini, request: int = -1) -> set[str]:
    """The function names the model was offered in a generate request."""
    body = gemini.generate_requests()[request].json or {}
    return {
        d["name"] for tool in body.get("tools", []) for d in tool.get("functionDeclarations", [])
    }


async def dm(client: SlackClient, fake_slack: FakeSlack, team: str, said: str) -> str:
    ts = new_ts()
    status, _ = await client.dm(team, REQUESTER, said, ts=ts)
    assert status == 200
    await fake_slack.wait_for("chat.postMessage", predicate=in_channel(DM, ts))
    return ts


async def test_a_read_runs_when_allowed_and_a_write_runs_once_after_approval(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    status, body = await client.command(team, ADMIN, "allow tickets.list_tickets")
    assert status == 200 and body.startswith("Done."), body

    # The read: allowed, it runs at once and its result reaches the model.
    gemini.script(function_call("tickets.list_tickets", {"status": "open"}), text("None open."))
    ts = await dm(client, fake_slack, team, "any open tickets?")
    await said(fake_slack, "None open.")
    assert {"tickets.list_tickets", "tickets.create_ticket"} <= declared(gemini, 0)
    [listed] = gemini.function_responses()
    assert listed["name"] == "tickets.list_tickets"
    assert listed["response"]["content"] == {"ok": True, "result": {"result": []}}
    assert not [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)]

    # The write: a card naming the server's hint; nothing runs before Approve.
    args = {"title": "Printer on fire", "priority": "high"}
    gemini.script(function_call("tickets.create_ticket", args, id="call-2"))
    ts = await dm(client, fake_slack, team, "open a ticket: printer on fire")
    (card,) = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    shown = json.dumps(blocks_of(card), ensure_ascii=False)
    assert "Approval needed: tickets.create_ticket" in shown
    assert "MCP tool of tickets · destructive" in shown and "Printer on fire" in shown
    await settle(service)
    assert mcp_tickets.created() == []

    # Approve, twice at once: it runs exactly once.
    gemini.script(text("Opened ticket 1."))
    clicks = await asyncio.gather(
        client.click(team, "UBOSS", "approve", card), client.click(team, "UBOSS", "approve", card)
    )
    assert [s for s, _ in clicks] == [200, 200]
    reply = await reply_in_thread(fake_slack, ts)
    await settle(service)
    assert text_of(reply) == "Opened ticket 1."
    assert mcp_tickets.created() == [dict(args, status="open")]
    created = [r for r in gemini.function_responses() if r["name"] == "tickets.create_ticket"]
    assert len(created) == 1
    assert created[0]["response"]["content"]["ok"] is True
    assert gemini.pending == 0


async def test_a_tools_error_result_reaches_the_model(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    status, body = await client.command(team, ADMIN, "allow tickets.create_ticket")
    assert status == 200 and body.startswith("Done."), body
    gemini.script(function_call("tickets.create_ticket", {"title": " "}), text("It failed."))
    await dm(client, fake_slack, team, "open an empty ticket")
    await said(fake_slack, "It failed.")
    [response] = gemini.function_responses()
    content = response["response"]["content"]
    assert content["ok"] is False and "create_ticket" in content["error"]
    assert mcp_tickets.created() == []


async def test_a_call_that_does_not_fit_the_servers_input_schema_never_reaches_a_card(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    """The server's `inputSchema` requires a string `title`: the model is told what is
    wrong; no approver is asked to approve a call that cannot run."""
    bad = {"title": 42, "priority": "high"}
    gemini.script(function_call("tickets.create_ticket", bad), text("Let me fix that."))
    await dm(client, fake_slack, team, "open a ticket")
    await said(fake_slack, "Let me fix that.")
    await settle(service)
    [response] = gemini.function_responses()
    content = response["response"]["content"]
    assert content["ok"] is False and "invalid input" in content["error"]
    assert "title" in content["error"]
    assert not [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)]
    assert mcp_tickets.created() == []


@pytest.mark.parametrize("ready_at_start", [False])
async def test_a_server_down_at_start_joins_when_it_comes_up(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    ready: Path,
) -> None:
    assert service.mcp is not None and not service.mcp.connected("tickets")
    assert service.deps is not None
    assert "tickets.list_tickets" not in service.deps.workflow.policies.known_tools()

    # Meanwhile the bot works, without the server's tools.
    gemini.script(text("Hello."))
    await dm(client, fake_slack, team, "hi")
    await said(fake_slack, "Hello.")
    assert not any(name.startswith("tickets.") for name in declared(gemini))

    # The server comes up: the background retry finds it, with no restart.
    await asyncio.to_thread(ready.touch)
    await asyncio.wait_for(service.mcp.wait_up("tickets"), timeout=30)
    status, body = await client.command(team, ADMIN, "allow tickets.list_tickets")
    assert status == 200 and body.startswith("Done."), body

    gemini.script(function_call("tickets.list_tickets", {}), text("None open."))
    await dm(client, fake_slack, team, "any open tickets?")
    await said(fake_slack, "None open.")
    assert {"tickets.list_tickets", "tickets.create_ticket"} <= declared(gemini, -2)
    [listed] = gemini.function_responses()
    assert listed["name"] == "tickets.list_tickets" and listed["response"]["content"]["ok"]


@pytest.mark.parametrize(("ready_at_start", "in_policy_file"), [(False, True)])
async def test_the_policy_file_applies_to_a_servers_tools_as_they_join(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    ready: Path,
) -> None:
    assert service.mcp is not None and not service.mcp.connected("tickets")
    await asyncio.to_thread(ready.touch)
    await asyncio.wait_for(service.mcp.wait_up("tickets"), timeout=30)
    assert service.deps is not None
    policy = await service.deps.workflow.policies.get(team, "tickets.list_tickets")
    assert policy.allowed  # the file's allow, written when the tool joined: no command

    gemini.script(function_call("tickets.list_tickets", {}), text("None open."))
    await dm(client, fake_slack, team, "any open tickets?")
    await said(fake_slack, "None open.")
    await settle(service)
    assert not [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)]
    trail = [
        (e.action, e.actor, e.tool) for e in await service.deps.workflow.reads.audit_trail(team)
    ]
    assert ("policy_changed", "policy-file", "tickets.list_tickets") in trail
