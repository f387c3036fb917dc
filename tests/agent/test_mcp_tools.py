"""MCP servers: their configuration, and their tools on a real runtime talking to a real stdio
server (tests/mcp_tickets.py) that goes away and comes back."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from genkit.exp import InMemorySessionStore
from genkit.middleware import BaseMiddleware
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import TypeAdapter, ValidationError

from agent import mcp_tools, policy_file
from agent.mcp_config import McpServer, McpServers
from agent.mcp_tools import TOOLS_MAX, Backoff, McpTools, hint, result_output
from agent.runtime import AgentConfig, AgentRuntime, build_runtime
from bot.mcp_servers import mcp_servers
from bot.settings import ConfigError, Settings, load_settings
from tests import mcp_tickets
from tests.conftest import poll
from tests.fakes.scripted_model import ScriptedModel

SERVERS: TypeAdapter[McpServers] = TypeAdapter(McpServers)
SERVER = str(Path(mcp_tickets.__file__))


# -- configuration ---------------------------------------------------------------------------


def test_stdio_and_http_servers_are_accepted() -> None:
    servers = SERVERS.validate_python(
        {
            "tickets": {"command": "python", "args": ["-m", "x"], "env": {"TOKEN": "s3cret"}},
            "crm_2": {"url": "https://crm.example/mcp", "headers": {"Authorization": "Bearer b"}},
        }
    )
    assert servers["tickets"].env["TOKEN"].get_secret_value() == "s3cret"
    assert servers["crm_2"].headers["Authorization"].get_secret_value() == "Bearer b"
    # Env and header values are secrets: what a log line would show does not hold them.
    assert "s3cret" not in repr(servers) and "Bearer b" not in str(servers)


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"tickets": {"command": "x", "url": "http://h/mcp"}}, "exactly one of `command`"),
        ({"tickets": {"args": ["x"]}}, "exactly one of `command`"),
        ({"tickets": {"command": "x", "headers": {"A": "b"}}}, "`headers` go with `url`"),
        ({"tickets": {"url": "http://h/mcp", "env": {"A": "b"}}}, "go with `command`"),
        ({"tickets": {"url": "ftp://h/mcp"}}, "must start with http"),
        ({"tickets": {"command": "x", "cwd": "/"}}, "Extra inputs are not permitted"),
        ({"my tickets": {"command": "x"}}, "'my tickets' must start with a letter"),
        ({"1st": {"command": "x"}}, "'1st' must start with a letter"),
    ],
)
def test_a_bad_server_is_refused_with_its_name(config: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as raised:
        SERVERS.validate_python(config)
    (error,) = raised.value.errors()
    assert problem in str(error["msg"])
    assert error["loc"][0] == next(iter(config))


def test_mcp_servers_from_the_environment_name_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MCP_SERVERS", '{"tickets": {"command": "python"')
    with pytest.raises(ConfigError) as raised:
        load_settings(serving=False)
    assert any(p.startswith("MCP_SERVERS: not valid JSON") for p in raised.value.problems)

    monkeypatch.setenv("MCP_SERVERS", '{"crm": {"url": "https://h/mcp", "command": "x"}}')
    with pytest.raises(ConfigError) as raised:
        load_settings(serving=False)
    assert any(p.startswith("MCP_SERVERS.crm: ") for p in raised.value.problems)

    monkeypatch.setenv("MCP_SERVERS", '{"crm": {"url": "https://h/mcp"}}')
    assert {"crm": McpServer(url="https://h/mcp")} == load_settings(serving=False).MCP_SERVERS


def test_the_policy_file_may_list_the_servers_but_not_both_places(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "allow: [tickets.list_tickets]\n"
        "mcp_servers:\n"
        "  tickets:\n"
        "    command: python\n"
        "    args: [-m, tests.mcp_tickets]\n"
    )
    file = policy_file.load(path)
    assert file.mcp_servers == {
        "tickets": McpServer(command="python", args=["-m", "tests.mcp_tickets"])
    }
    # Its tools may be named before the server is up; another prefix may not.
    policy_file.check_tools(path, file, known=["transferMoney"], servers=["tickets"])
    with pytest.raises(policy_file.PolicyFileError, match=r"no tool 'tickets\.list_tickets'"):
        policy_file.check_tools(path, file, known=["transferMoney"], servers=["crm"])

    assert mcp_servers(Settings(), file) == file.mcp_servers
    with pytest.raises(ConfigError, match="MCP_SERVERS and POLICY_FILE's mcp_servers"):
        mcp_servers(Settings(MCP_SERVERS={"crm": {"url": "https://h/mcp"}}), file)

    path.write_text("mcp_servers:\n  tickets:\n    url: https://h/mcp\n    args: [x]\n")
    with pytest.raises(policy_file.PolicyFileError, match=r"line 3: mcp_servers\.tickets: "):
        policy_file.load(path)


def test_hints_and_results_as_approvers_and_the_model_see_them() -> None:
    assert hint(ToolAnnotations(read_only_hint=True)) == "read-only"
    assert hint(ToolAnnotations(destructive_hint=False)) == "not destructive"
    assert hint(ToolAnnotations(destructive_hint=True)) == "destructive"
    assert hint(None) == "may be destructive (no hint given)"
    failed = CallToolResult(content=[TextContent(type="text", text="no such queue")], is_error=True)
    assert result_output(failed) == {"ok": False, "error": "no such queue"}
    done = CallToolResult(content=[TextContent(type="text", text="7")], structured_content={"n": 7})
    assert result_output(done) == {"ok": True, "result": {"n": 7}}


# -- a live server ---------------------------------------------------------------------------


def new_runtime() -> AgentRuntime:
    return build_runtime(
        AgentConfig(model="scripted", tool_modules=(), ask_human=False),
        store=InMemorySessionStore(),
        middleware=BaseMiddleware,
        previews={},
        questions=set(),
        setup=ScriptedModel().register,
    )


@pytest.fixture
async def tickets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[McpTools, AgentRuntime, Path]]:
    log, pidfile = tmp_path / "tickets.jsonl", tmp_path / "tickets.pid"
    monkeypatch.setenv("TICKETS_LOG", str(log))
    env = {"TICKETS_LOG": str(log), "TICKETS_PIDFILE": str(pidfile)}
    config = McpServer(command=sys.executable, args=[SERVER], env=env)
    runtime = new_runtime()
    mcp = McpTools({"tickets": config}, runtime, backoff=Backoff(first=0.1, most=0.5))
    await mcp.start()
    try:
        yield mcp, runtime, pidfile
    finally:
        await mcp.stop()


async def test_a_server_may_offer_at_most_200_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKETS_LOG", str(tmp_path / "tickets.jsonl"))
    env = {"TICKETS_LOG": str(tmp_path / "tickets.jsonl"), "TICKETS_EXTRA": "250"}
    runtime = new_runtime()
    mcp = McpTools(
        {"many": McpServer(command=sys.executable, args=[SERVER], env=env)},
        runtime,
        backoff=Backoff(first=0.1, most=0.5),
    )
    await mcp.start()
    try:
        assert mcp.connected("many")
        offered = [name for name in runtime.known() if name.startswith("many.")]
        assert len(offered) == TOOLS_MAX == 200  # of the 253 it lists
    finally:
        await mcp.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def run(runtime: AgentRuntime, tool: str, input: dict[str, Any]) -> Any:
    return (await runtime.tools[tool](input)).output


async def test_a_servers_tools_join_the_agent_with_their_hints(
    tickets: tuple[McpTools, AgentRuntime, Path],
) -> None:
    mcp, runtime, _ = tickets
    assert mcp.connected("tickets")
    assert {"tickets.list_tickets", "tickets.create_ticket"} <= set(runtime.known())
    assert {t.name for t in runtime.offered} >= {"tickets.list_tickets", "tickets.create_ticket"}
    assert runtime.notes["tickets.list_tickets"] == "MCP tool of tickets · read-only"
    assert runtime.notes["tickets.create_ticket"] == "MCP tool of tickets · destructive"
    assert runtime.describe("tickets.create_ticket") == "Open a ticket."
    schema = runtime.tools["tickets.create_ticket"].input_schema or {}
    assert schema["required"] == ["title"]

    out = await run(runtime, "tickets.create_ticket", {"title": "a"})
    assert out["ok"] is True and out["result"]["id"] == 1
    assert len(mcp_tickets.created()) == 1


async def test_a_call_to_a_server_that_went_away_is_an_error_never_sent_twice(
    tickets: tuple[McpTools, AgentRuntime, Path], caplog: pytest.LogCaptureFixture
) -> None:
    mcp, runtime, pidfile = tickets
    first = int(await asyncio.to_thread(pidfile.read_text))
    os.kill(first, signal.SIGKILL)  # the server process this test's McpTools started
    await poll(lambda: not alive(first) or _zombie(first), "the server to die", timeout=10)

    caplog.set_level(logging.INFO)
    out = await run(runtime, "tickets.create_ticket", {"title": "lost"})
    assert out["ok"] is False
    assert "went away" in out["error"] or "not connected" in out["error"]

    # It reconnects by itself (a new process), and nothing was sent again meanwhile.
    await poll(lambda: mcp.connected("tickets") and _pid(pidfile) != first, "a reconnect")
    assert mcp_tickets.created() == []
    out = await run(runtime, "tickets.create_ticket", {"title": "after"})
    assert out["ok"] is True
    assert [t["title"] for t in mcp_tickets.created()] == ["after"]
    assert "not reachable" in caplog.text or "connection lost" in caplog.text

    # Stopping closes the connection: the server process ends.
    second = _pid(pidfile)
    await mcp.stop()
    await poll(lambda: not alive(second) or _zombie(second), "the server to end", timeout=10)


async def test_a_call_that_takes_too_long_is_an_unknown_outcome_not_a_dropped_server(
    tickets: tuple[McpTools, AgentRuntime, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    mcp, runtime, _ = tickets
    monkeypatch.setattr(mcp_tools, "CALL_TIMEOUT", 0.5)
    out = await run(runtime, "tickets.wait", {"seconds": 10})
    assert out["ok"] is False and "did not answer in time" in out["error"]
    assert mcp.connected("tickets")  # one slow call does not cut the others off
    assert (await run(runtime, "tickets.wait", {"seconds": 0}))["result"] == {"result": "waited"}


def _pid(pidfile: Path) -> int:
    return int(pidfile.read_text()) if pidfile.exists() else 0


def _zombie(pid: int) -> bool:
    """Whether the process has ended and only waits to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


async def test_a_server_that_is_down_is_retried_and_its_tools_join_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ready = tmp_path / "ready"
    monkeypatch.setenv("TICKETS_LOG", str(tmp_path / "tickets.jsonl"))
    env = {"TICKETS_LOG": str(tmp_path / "tickets.jsonl"), "TICKETS_READY": str(ready)}
    secret = "Bearer do-not-log-me"
    servers = {
        "tickets": McpServer(command=sys.executable, args=[SERVER], env=env),
        # Nothing listens there: it stays down, and its header never reaches a log line.
        "crm": McpServer(url="http://127.0.0.1:9/mcp", headers={"Authorization": secret}),
    }
    runtime = new_runtime()
    mcp = McpTools(servers, runtime, backoff=Backoff(first=0.1, most=0.2))
    caplog.set_level(logging.DEBUG)
    joined: list[str] = []

    async def added(tools: list[str]) -> None:
        joined.extend(tools)

    mcp.on_added = added
    await mcp.start()
    try:
        assert not mcp.connected("tickets") and not mcp.connected("crm")
        assert not any(t.startswith("tickets.") for t in runtime.known())
        await asyncio.to_thread(ready.touch)
        await asyncio.wait_for(mcp.wait_up("tickets"), timeout=30)
        assert {"tickets.list_tickets", "tickets.create_ticket"} <= set(runtime.known())
        assert sorted(joined) == ["tickets.create_ticket", "tickets.list_tickets", "tickets.wait"]
        assert not mcp.connected("crm")
    finally:
        await mcp.stop()
    assert "MCP server crm: not reachable" in caplog.text
    assert "do-not-log-me" not in caplog.text


async def test_an_http_server_started_later_joins_and_gets_its_headers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TICKETS_LOG", str(tmp_path / "tickets.jsonl"))
    caplog.set_level(logging.DEBUG)
    # The port is held from here on (bound, not listening: connecting is refused until the
    # server starts on this very socket), so no test running in parallel can take it.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    port = int(held.getsockname()[1])
    app = mcp_tickets.server.streamable_http_app()
    seen: list[bytes] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen.append(dict(scope["headers"]).get(b"authorization", b""))
        await app(scope, receive, send)

    url = f"http://127.0.0.1:{port}/mcp"
    config = McpServer(url=url, headers={"Authorization": "Bearer t0ken"})
    runtime = new_runtime()
    mcp = McpTools({"crm": config}, runtime, backoff=Backoff(first=0.1, most=0.3))
    await mcp.start()
    assert not mcp.connected("crm")
    server = uvicorn.Server(
        uvicorn.Config(recording, host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve(sockets=[held]))
    try:
        await asyncio.wait_for(mcp.wait_up("crm"), timeout=30)
        assert runtime.notes["crm.list_tickets"] == "MCP tool of crm · read-only"
        out = await run(runtime, "crm.list_tickets", {})
        assert out == {"ok": True, "result": {"result": []}}
        assert seen and set(seen) == {b"Bearer t0ken"}
    finally:
        await mcp.stop()
        server.should_exit = True
        await serving
        held.close()
    assert "MCP server crm: not reachable" in caplog.text and "t0ken" not in caplog.text
