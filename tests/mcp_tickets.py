"""A small MCP server for the tests (`python -m tests.mcp_tickets`, over stdio): tickets.

`list_tickets` is read-only; `create_ticket` writes, and appends each call to the JSON-lines
file TICKETS_LOG, so a test can count how often it ran. With TICKETS_READY set, the server
exits at once while that file does not exist: a server that is down until the test says so.
With TICKETS_PIDFILE set, it writes its process id there (a test stops it to see it go away).
With TICKETS_EXTRA=N, it also lists N more tools, `extra_1` to `extra_N` (a server that lists
too many).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("tickets", log_level="ERROR")


def _log() -> Path:
    return Path(os.environ["TICKETS_LOG"])


def created() -> list[dict[str, Any]]:
    """The create_ticket calls recorded so far (read by the tests)."""
    path = _log()
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def list_tickets(status: str = "open") -> list[dict[str, Any]]:
    """List the tickets with a status."""
    tickets = enumerate(created(), 1)
    return [dict(ticket, id=i) for i, ticket in tickets if ticket["status"] == status]


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def create_ticket(title: str, priority: str = "normal") -> dict[str, Any]:
    """Open a ticket."""
    if not title.strip():
        raise ValueError("a ticket needs a title")
    ticket = {"title": title, "priority": priority, "status": "open"}
    with _log().open("a") as f:
        f.write(json.dumps(ticket) + "\n")
    return dict(ticket, id=len(created()))


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def wait(seconds: float) -> str:
    """Answer after a while (a slow server)."""
    await asyncio.sleep(seconds)
    return "waited"


if __name__ == "__main__":
    if (ready := os.environ.get("TICKETS_READY")) and not Path(ready).exists():
        sys.exit(1)
    for i in range(1, int(os.environ.get("TICKETS_EXTRA", "0")) + 1):
        server.add_tool(lambda: "extra", name=f"extra_{i}", description="One of many.")
    if pidfile := os.environ.get("TICKETS_PIDFILE"):
        Path(pidfile).write_text(str(os.getpid()))
    server.run()
