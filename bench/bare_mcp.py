"""`python -m bench.bare_mcp`: the gateway benchmark's baseline, the same tool behind a bare
MCP server (the mcp SDK's low-level server, stateless streamable HTTP, under uvicorn): no
key, no policy, no message limit, no session row. What an MCP call costs anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import uvicorn
from genkit import Genkit, Part, ToolRequest
from genkit._ai._tools import run_tool_request
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.routing import Mount

from tests import ledger_tools


def app() -> Starlette:
    ai = Genkit()
    tools = {t.name: t for t in ledger_tools.register(ai)}

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=n, input_schema=t.input_schema or {"type": "object"})
                for n, t in tools.items()
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        request = ToolRequest(name=params.name, input=dict(params.arguments or {}))
        raw = await run_tool_request(
            tool=tools[params.name].action(), tool_request_part=Part(tool_request=request)
        )
        body = raw.output if hasattr(raw, "output") else raw
        text = json.dumps(body, default=str)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=body if isinstance(body, dict) else None,
        )

    server: Server[Any] = Server("bare", on_list_tools=list_tools, on_call_tool=call_tool)
    manager = StreamableHTTPSessionManager(app=server, stateless=True)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    return Starlette(routes=[Mount("/mcp", app=manager.handle_request)], lifespan=lifespan)


async def serve() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app(), log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn has no event for it
        await asyncio.sleep(0.01)
    # The line bench/harness.py's ServiceProcess waits for.
    print(f"bare MCP is up (HTTP :{sock.getsockname()[1]})", file=sys.stderr, flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(serve())
