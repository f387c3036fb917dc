"""The /mcp route: the MCP door (gateway/mcp.py) made by the first request to it, so a bot
that no MCP client calls never loads the mcp SDK (its types alone take longer to import
than Genkit, Bolt and SQLAlchemy together)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

from agent.keys import ApiKeys
from gateway.calls import Gateway

if TYPE_CHECKING:
    from gateway.mcp import McpDoor

PATH = "/mcp"


class LazyMcpDoor:
    """McpDoor's route and lifetime, with the door itself started on the first request."""

    def __init__(self, gateway: Gateway, keys: ApiKeys) -> None:
        self._gateway = gateway
        self._keys = keys
        self._door: McpDoor | None = None
        self._starting = asyncio.Lock()
        self._running = contextlib.AsyncExitStack()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Until the service stops: then the door, if one was started, stops too."""
        async with self._running:
            yield

    async def handle(self, request: web.Request) -> web.StreamResponse:
        door = self._door or await self._started()
        return await door.handle(request)

    async def _started(self) -> McpDoor:
        async with self._starting:
            if self._door is None:
                # Off the event loop: the import takes about half a second of CPU.
                sdk = await asyncio.to_thread(importlib.import_module, "gateway.mcp")
                door: McpDoor = sdk.McpDoor(self._gateway, self._keys)
                await self._running.enter_async_context(door.running())
                self._door = door
            return self._door
