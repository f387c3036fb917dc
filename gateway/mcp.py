"""The MCP door: Greenlight's tools over streamable HTTP at /mcp, on the bot's own port.

The mcp SDK's server (its session manager and streamable HTTP transport) is an ASGI
application; the bot's HTTP server is aiohttp's. `AsgiBridge` hands each /mcp request to the
SDK as ASGI, after checking the Bearer key (401 before the SDK sees anything). It also tells
the waiting call when its client went away: the SDK answers on an SSE stream and keeps
running the handler after the stream drops, so the bridge watches the connection itself and
puts an event in the request's scope that the handler reads.

Any replica serves any request of a session: the SDK runs stateless (a fresh server session
per request), and what a session must remember, whose key opened it and which client it is
(from its initialize request, for the card), is a row (`mcp_sessions`) named by the
`Mcp-Session-Id` this door gives on initialize. No GET stream: the server never speaks
first; a waiting call's progress goes on its own response stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from aiohttp import web
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError

from agent.gate import note_of
from agent.keys import ApiKeys
from gateway.api import bearer, unauthorized
from gateway.calls import (
    APPROVAL_PROMPT,
    Caller,
    Gateway,
    InvalidArguments,
    Outcome,
    OverLimit,
    UnknownTool,
)
from storage.gateway_store import McpSession

log = logging.getLogger(__name__)

PROMPT_SCHEMA = {
    "type": "object",
    "properties": {
        "tool_name": {"type": "string", "description": "The tool Claude Code wants to run."},
        "input": {"type": "object", "description": "Its input."},
        "tool_use_id": {"type": "string"},
    },
    "required": ["tool_name", "input"],
}
PROMPT_DESCRIPTION = (
    "Claude Code's --permission-prompt-tool: asks a person in Slack whether a tool may run "
    "(policy names it prompt.<tool_name>)."
)
SCOPE_KEY = "greenlight.caller"
WATCH_SECONDS = 0.5  # how often a waiting request's connection is looked at
SESSION_HEADER = "Mcp-Session-Id"
SESSIONS_CACHED = 10_000  # sessions' facts kept in memory (they never change)


def no_session() -> web.Response:
    """The spec's answer to an unknown session: the client initializes anew."""
    error = {"code": types.INVALID_REQUEST, "message": "Session not found: initialize again"}
    return web.json_response({"jsonrpc": "2.0", "id": None, "error": error}, status=404)


def parsed(body: bytes) -> Any:
    """The JSON-RPC message(s) of a POST, or None (the SDK answers what is malformed)."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def quiet(message: Any) -> bool:
    """Whether nothing but the answer will be sent for this POST: one request that asked for
    no progress. Its answer is plain JSON, which costs both sides less than an SSE stream."""
    if not isinstance(message, dict) or "id" not in message:
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return not (isinstance(meta, dict) and "progressToken" in meta)


def initialize_client(message: Any) -> str | None:
    """The client's name and version if `message` is an initialize request ("" if it names
    none), else None."""
    for m in message if isinstance(message, list) else [message]:
        if isinstance(m, dict) and m.get("method") == "initialize":
            params = m.get("params")
            info = params.get("clientInfo") if isinstance(params, dict) else None
            if not isinstance(info, dict):
                return ""
            name, version = str(info.get("name", ""))[:120], str(info.get("version", ""))[:60]
            return f"{name} {version}".strip()
    return None


def _result(outcome: Outcome) -> types.CallToolResult:
    """The call's result as MCP has it: the output as JSON text (and structured when it is
    an object); or an error result saying why nothing ran. An approved call's output comes
    wrapped, `{"output": …}`, when there is more to say: the approver's changes
    (`approved_with_changes`) and note (`note`: the caller's model reads it, as Greenlight's
    own agent does, agent/gate.py)."""
    if outcome.error is not None and outcome.status in (
        "denied",
        "expired",
        "withdrawn",
        "unknown",
    ):
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=outcome.error)], is_error=True
        )
    body: Any = outcome.output
    more: dict[str, Any] = {}
    if outcome.changes is not None:
        more["approved_with_changes"] = outcome.changes
    if outcome.status == "ran" and outcome.approval is not None:
        more |= note_of(outcome.approval)
    if more:
        body = {"output": outcome.output} | more
    text = json.dumps(body, ensure_ascii=False, default=str)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=body if isinstance(body, dict) else None,
        is_error=not outcome.ok,
    )


class McpDoor:
    """The MCP server of the gateway and its aiohttp route."""

    def __init__(self, gateway: Gateway, keys: ApiKeys) -> None:
        self._gateway = gateway
        self._keys = keys
        self.server: Server[Any] = Server(
            "greenlight",
            version="0.1.0",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        # Two ways to answer a POST: an SSE stream (progress while a call waits) and, for
        # one that asked for no progress, plain JSON.
        self._streamed = StreamableHTTPSessionManager(app=self.server, stateless=True)
        self._plain = StreamableHTTPSessionManager(
            app=self.server, stateless=True, json_response=True
        )
        self._sessions: OrderedDict[str, McpSession] = OrderedDict()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager, run in a task of its own: its anyio task group must be
        left by the task that entered it, and a service may stop from another task."""
        ready, stop = asyncio.Event(), asyncio.Event()

        async def run() -> None:
            async with self._streamed.run(), self._plain.run():
                ready.set()
                await stop.wait()

        task = asyncio.create_task(run(), name="mcp sessions")
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if task.done():
            task.result()  # it failed to start: say why
        try:
            yield
        finally:
            stop.set()
            await task

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [
            types.Tool(name=t.name, description=t.description, input_schema=t.input_schema)
            for t in self._gateway.tools()
        ]
        tools.append(
            types.Tool(
                name=APPROVAL_PROMPT, description=PROMPT_DESCRIPTION, input_schema=PROMPT_SCHEMA
            )
        )
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        scope = getattr(ctx.request, "scope", None) or {}
        caller: Caller | None = scope.get(SCOPE_KEY)
        if caller is None:  # never: the bridge puts it there for every request
            raise MCPError(types.INVALID_REQUEST, "no API key")
        client = caller.client
        if client is None and ctx.session.client_params is not None:
            info = ctx.session.client_params.client_info
            client = f"{info.name} {info.version}".strip()
        caller = Caller(caller.key, "mcp", client, caller.gone)

        async def progress(waited: float, message: str) -> None:
            await ctx.session.report_progress(waited, None, message)

        args = dict(params.arguments or {})
        count = self._gateway.observer.gateway_call
        try:
            if params.name == APPROVAL_PROMPT:
                answered = await self._prompt(caller, args, progress)
                count("mcp", "prompt_answered")
                return answered
            outcome = await self._gateway.call(caller, params.name, args, progress)
        except (asyncio.CancelledError, ConnectionResetError):
            count("mcp", "gone")
            raise
        except OverLimit:
            count("mcp", "over_limit")
            raise MCPError(
                types.INVALID_REQUEST,
                "too many calls this minute for this key's owner; wait a minute",
            ) from None
        except UnknownTool:
            count("mcp", "invalid")
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}") from None
        except InvalidArguments as exc:
            count("mcp", "invalid")
            fields = "; ".join(f"{k}: {v}" for k, v in exc.errors.items())
            raise MCPError(
                types.INVALID_PARAMS,
                f"invalid arguments for {params.name} ({fields}); nobody was asked to approve it",
                {"fields": exc.errors},
            ) from None
        count("mcp", {"ran": "approved"}.get(outcome.status, outcome.status))
        return _result(outcome)

    async def _prompt(
        self, caller: Caller, args: dict[str, Any], progress: Any
    ) -> types.CallToolResult:
        """approval_prompt: one text content whose text is Claude Code's JSON answer."""
        name, given = args.get("tool_name"), args.get("input")
        errors = {}
        if not isinstance(name, str) or not name.strip() or len(name) > 120:
            errors["tool_name"] = "a tool's name is needed"
        if not isinstance(given, dict):
            errors["input"] = "an object is needed"
        if errors:
            raise InvalidArguments(errors)
        assert isinstance(name, str) and isinstance(given, dict)
        answer = await self._gateway.prompt(caller, name, given, progress)
        text = json.dumps(answer, ensure_ascii=False)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """/mcp: the key checked, the session's facts found (or made, on initialize), then
        the SDK's transport, spoken through ASGI."""
        key = await self._keys.authenticate(bearer(request))
        if key is None:
            self._gateway.observer.gateway_call("mcp", "unauthorized")
            return unauthorized()
        if request.method == "GET":
            return web.Response(status=405, headers={"Allow": "POST, DELETE"})
        given = request.headers.get(SESSION_HEADER)
        if request.method == "DELETE":
            self._sessions.pop(given or "", None)
            closed = given is not None and await self._gateway.store.close_session(given, key.id)
            return web.Response(status=200) if closed else no_session()
        body = await request.read()
        message = parsed(body)
        opened: str | None = None
        client = initialize_client(message)
        if client is not None:
            opened = uuid.uuid4().hex
            session = McpSession(opened, key.team_id, key.id, client or None)
            await self._gateway.store.open_session(session, now=self._gateway.clock())
        elif given is not None:
            found = await self._session(given)
            if found is None or found.key_id != key.id:
                return no_session()
            client = found.client
        caller = Caller(key, "mcp", client or None)
        bridge = AsgiBridge(request, caller, body, session=opened)
        manager = self._plain if quiet(message) else self._streamed
        return await bridge.serve(manager.handle_request)

    async def _session(self, session_id: str) -> McpSession | None:
        if (cached := self._sessions.get(session_id)) is not None:
            self._sessions.move_to_end(session_id)
            return cached
        found = await self._gateway.store.session(session_id)
        if found is not None:
            self._sessions[session_id] = found
            if len(self._sessions) > SESSIONS_CACHED:
                self._sessions.popitem(last=False)
        return found


class AsgiBridge:
    """One aiohttp request served by an ASGI application (the SDK's transport)."""

    def __init__(
        self, request: web.Request, caller: Caller, body: bytes, *, session: str | None = None
    ) -> None:
        self._request = request
        self._caller = caller
        self._body: bytes | None = body
        self._session = session  # a session just opened: its id goes to the client
        self._response: web.StreamResponse | None = None

    def scope(self) -> dict[str, Any]:
        r = self._request
        peer = r.transport.get_extra_info("peername") if r.transport else None
        token = AccessToken(token=self._caller.key.id, client_id=self._caller.key.id, scopes=[])
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": f"{r.version.major}.{r.version.minor}",
            "method": r.method,
            "scheme": r.scheme,
            "path": r.path,
            "raw_path": r.raw_path.encode(),
            "root_path": "",
            "query_string": r.query_string.encode(),
            "headers": [(k.lower(), v) for k, v in r.raw_headers],
            "server": None,
            "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
            # The session is bound to the key that opened it (the SDK compares).
            "user": AuthenticatedUser(token),
            SCOPE_KEY: self._caller,
        }

    async def receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        # Then: until the client goes away.
        while True:
            transport = self._request.transport
            if transport is None or transport.is_closing():
                self._caller.gone.set()
                return {"type": "http.disconnect"}
            await asyncio.sleep(WATCH_SECONDS)

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = [(k.decode(), v.decode()) for k, v in message.get("headers", [])]
            response = web.StreamResponse(status=message["status"])
            for name, value in headers:
                if name.lower() != "content-length":
                    response.headers.add(name, value)
            if self._session is not None and message["status"] == 200:
                response.headers[SESSION_HEADER] = self._session
            self._response = response
            await response.prepare(self._request)
        elif message["type"] == "http.response.body" and self._response is not None:
            try:
                if body := message.get("body", b""):
                    await self._response.write(body)
                if not message.get("more_body", False):
                    await self._response.write_eof()
            except (ConnectionResetError, RuntimeError):
                self._caller.gone.set()

    async def _watch(self) -> None:
        """The caller is gone once its connection closes, whether or not the SDK reads on."""
        # aiohttp has no event for a peer that closed: its transport is looked at.
        while (t := self._request.transport) is not None and not t.is_closing():  # noqa: ASYNC110
            await asyncio.sleep(WATCH_SECONDS)
        self._caller.gone.set()

    async def serve(self, app: Any) -> web.StreamResponse:
        watching = asyncio.create_task(self._watch())
        try:
            await app(self.scope(), self.receive, self.send)
        finally:
            watching.cancel()
        if self._response is None:
            return web.Response(status=500)
        return self._response
