"""MCP servers' tools behind approvals (MCP_SERVERS, or POLICY_FILE's `mcp_servers`).

Each server's tools become Genkit tools named `<server>.<tool>` and pass the approval
middleware like any other tool. One connection per server is kept for the process's lifetime,
owned by a task of its own (the SDK's transports are anyio task groups: entered and left in one
task). A server that is down, at start or later, is retried with backoff; its tools join the
agent when it answers, since the agent reads its tool list at every turn.

A call is sent once. If the server went away, or stops answering mid-call, the model gets an
error result saying so; the call is never sent a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent, Tool as McpTool, ToolAnnotations
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from agent.mcp_config import McpServer

if TYPE_CHECKING:
    from agent.runtime import AgentRuntime

log = logging.getLogger(__name__)

# `<server>.<tool>` must stay a valid model function name (Gemini: letters, digits, `_.:-`,
# at most 64 characters); agent/mcp_config.py checks the server part.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
NAME_MAX = 64
CALL_TIMEOUT = 120.0  # seconds a call may take; past it the outcome is unknown, not retried
LIST_TIMEOUT = 30.0  # seconds for connecting and listing the tools
PROBE_INTERVAL = 30.0  # seconds between checks that a connected server still answers
RESULT_MAX = 20_000  # characters of a tool's text result passed on to the model
TOOLS_MAX = 200  # tools one server may offer; the rest of a longer list are left out


def hint(annotations: ToolAnnotations | None) -> str:
    """What the server says a tool does to the world, for its approvers (a hint, untrusted)."""
    a = annotations or ToolAnnotations()
    if a.read_only_hint:
        return "read-only"
    if a.destructive_hint is False:
        return "not destructive"
    return "destructive" if a.destructive_hint else "may be destructive (no hint given)"


def result_output(result: CallToolResult) -> dict[str, Any]:
    """A tool result as the model sees it: `ok`, then the structured result or its text; an
    error result (`isError`) is a tool error the model reads, never an exception."""
    pieces = [b.text if isinstance(b, TextContent) else f"[{b.type}]" for b in result.content]
    text = "\n".join(pieces)[:RESULT_MAX]
    if result.is_error:
        return {"ok": False, "error": text or "the tool reported an error"}
    if result.structured_content is not None:
        return {"ok": True, "result": result.structured_content}
    return {"ok": True, "result": text}


def _reason(exc: BaseException) -> str:
    """A short, secret-free reason for a log line: the innermost exception's kind and text
    (transport errors name neither header nor environment values)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {str(exc)[:200]}"


@dataclass(frozen=True)
class Backoff:
    first: float = 1.0  # seconds before the first retry
    most: float = 60.0  # the longest wait between retries


@dataclass
class _Link:
    """One server's connection, as its task keeps it."""

    name: str
    config: McpServer
    client: Client | None = None
    tried: asyncio.Event = field(default_factory=asyncio.Event)  # the first attempt ended
    up: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: asyncio.Event = field(default_factory=asyncio.Event)


Added = Callable[[list[str]], Awaitable[None]]


class McpTools:
    """Keeps a connection to each configured server and their tools registered on the agent."""

    def __init__(
        self,
        servers: Mapping[str, McpServer],
        runtime: AgentRuntime,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self._links = {name: _Link(name, config) for name, config in servers.items()}
        self._runtime = runtime
        self._backoff = backoff or Backoff()
        self._tasks: list[asyncio.Task[None]] = []  # one a link, in the links' order
        self._stopping = False
        self.on_added: Added | None = None  # told the names of tools that joined later

    def connected(self, server: str) -> bool:
        return self._links[server].client is not None

    async def wait_up(self, server: str) -> None:
        """Until the server is connected, its tools offered and their policy applied."""
        await self._links[server].up.wait()

    async def start(self, wait: float = LIST_TIMEOUT) -> None:
        """Connect to every server, waiting up to `wait` seconds for each first attempt; a
        server not up by then keeps being tried in the background."""
        for link in self._links.values():
            self._tasks.append(asyncio.create_task(self._keep(link), name=f"mcp {link.name}"))
        tried = [asyncio.create_task(link.tried.wait()) for link in self._links.values()]
        if tried:
            _, late = await asyncio.wait(tried, timeout=wait)
            for task in late:
                task.cancel()

    async def stop(self) -> None:
        """Close every connection (stdio servers' processes end with it). A connected link
        leaves its client as on a lost connection, not by a cancel: the SDK's shutdown, which
        stops a stdio server's process, can be cut short by one (its own comment says so),
        and a reader left waiting on that process can then hang the stop. A link not
        connected (connecting, or waiting to retry) is cancelled."""
        self._stopping = True
        for link, task in zip(self._links.values(), self._tasks, strict=False):
            if link.client is not None:
                link.dropped.set()
            else:
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    @staticmethod
    def _client(config: McpServer, stack: contextlib.AsyncExitStack) -> Client:
        """A client for the server; what it opens besides is closed with `stack`."""
        if config.command is not None:
            env = {k: v.get_secret_value() for k, v in config.env.items()}
            params = StdioServerParameters(command=config.command, args=config.args, env=env)
            return Client(params)
        assert config.url is not None
        headers = {k: v.get_secret_value() for k, v in config.headers.items()}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
        stack.push_async_callback(http.aclose)
        return Client(streamable_http_client(config.url, http_client=http))

    async def _keep(self, link: _Link) -> None:
        """Connect, register the tools, watch the connection; on any failure, retry after
        a backoff that doubles up to its most."""
        delay = self._backoff.first
        while True:
            try:
                async with contextlib.AsyncExitStack() as stack:
                    client = self._client(link.config, stack)
                    async with asyncio.timeout(LIST_TIMEOUT):
                        await stack.enter_async_context(client)
                        listed = await self._list(client, link.name)
                    link.client = client
                    link.dropped.clear()
                    await self._added(self._register(link, listed))
                    link.up.set()  # its tools are offered, their policy applied
                    link.tried.set()
                    delay = self._backoff.first
                    log.info("MCP server %s: connected, %d tool(s)", link.name, len(listed))
                    await self._watch(link, client)
                    if self._stopping:
                        return  # the client is left as on a lost connection
                    log.warning("MCP server %s: connection lost; reconnecting", link.name)
            except Exception as exc:  # any failure means: not up, try again later
                log.warning(
                    "MCP server %s: not reachable (%s); retrying in %.0fs",
                    link.name,
                    _reason(exc),
                    delay,
                )
            finally:
                link.client = None
                link.up.clear()
                link.tried.set()
            if self._stopping:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff.most)

    @staticmethod
    async def _list(client: Client, server: str) -> list[McpTool]:
        """The server's tools, the first TOOLS_MAX of them: every tool's name, description
        and schema go to the model on every turn, so a server cannot flood its context."""
        tools: list[McpTool] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang the start
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools += page.tools
            if (cursor := page.next_cursor) is None or len(tools) > TOOLS_MAX:
                break
        if len(tools) > TOOLS_MAX:
            log.warning(
                "MCP server %s lists over %d tools: the rest are left out", server, TOOLS_MAX
            )
        return tools[:TOOLS_MAX]

    async def _watch(self, link: _Link, client: Client) -> None:
        """Until the connection is lost: a call saw it closed, or a periodic listing failed.
        Tools the server added meanwhile are registered as they are seen."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PROBE_INTERVAL):
                    await link.dropped.wait()
                    return
            try:
                async with asyncio.timeout(LIST_TIMEOUT):
                    listed = await self._list(client, link.name)
            except Exception as exc:
                log.warning("MCP server %s: stopped answering (%s)", link.name, _reason(exc))
                return
            await self._added(self._register(link, listed))

    async def _added(self, tools: list[str]) -> None:
        """Tell `on_added` of tools that joined; its failure does not cut the connection."""
        if not tools or self.on_added is None:
            return
        try:
            await self.on_added(tools)
        except Exception:
            log.exception("applying the policy to MCP tools %s failed", tools)

    def _register(self, link: _Link, listed: list[McpTool]) -> list[str]:
        """Register the tools not registered yet; returns their names."""
        added = []
        runtime = self._runtime
        for tool in listed:
            name = f"{link.name}.{tool.name}"
            if name in runtime.tools and name in runtime.notes:
                continue  # ours, from an earlier connection: it calls whichever is current
            if not TOOL_NAME.match(tool.name) or len(name) > NAME_MAX:
                log.warning("MCP server %s: tool %r skipped: not a valid name", link.name, name)
                continue
            if name in runtime.tools or name in runtime.mounted:
                log.warning("MCP server %s: tool %s skipped: the name is taken", link.name, name)
                continue
            registered = runtime.ai.tool(
                name=name,
                description=tool.description or tool.title or "",
                input_schema=tool.input_schema,
            )(self._caller(link, tool.name, name))
            runtime.add_tool(registered, note=f"MCP tool of {link.name} · {hint(tool.annotations)}")
            added.append(name)
        return added

    def _caller(self, link: _Link, tool: str, name: str) -> Callable[[Any], Awaitable[Any]]:
        async def call(input: Any) -> Any:
            """Send the call once, on the server's current connection."""
            client = link.client
            if client is None:
                return {
                    "ok": False,
                    "error": f"the MCP server {link.name} is not connected, so {name} did not "
                    "run. Tell the person; it may work later.",
                }
            arguments = input if isinstance(input, dict) else {}
            try:
                result = await client.call_tool(tool, arguments, read_timeout_seconds=CALL_TIMEOUT)
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    link.dropped.set()  # its task reconnects; this call is not resent
                if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                    return _unknown(link.name, name)
                # Its message may quote the call's input: the model gets it, the log does not.
                log.info("MCP server %s answered %s with error %s", link.name, name, exc.code)
                return {"ok": False, "error": f"{name} failed: {exc.message[:500]}"}
            except Exception as exc:  # a broken transport: the outcome is unknown
                log.warning("MCP call of %s: no answer (%s)", name, _reason(exc))
                return _unknown(link.name, name)
            return result_output(result)

        return call


def _unknown(server: str, name: str) -> dict[str, Any]:
    return {
        "ok": False,
        "error": f"the MCP server {server} went away or did not answer in time during the call "
        f"of {name}: it may or may not have taken effect, and it was not sent again. A human "
        "must check.",
    }
