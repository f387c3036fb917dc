"""The MCP servers whose tools the agent calls, from start to shutdown.

Which are configured, connected at start, POLICY_FILE applied to the tools that join later,
closed after the last turn."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.mcp_config import McpServers
from agent.policy_file import PolicyFile
from agent.workflow import Workflow
from bot.settings import ConfigError, Settings

if TYPE_CHECKING:
    from agent.mcp_tools import McpTools

log = logging.getLogger(__name__)


def mcp_servers(settings: Settings, policy_file: PolicyFile | None) -> McpServers:
    """The MCP servers: from MCP_SERVERS or from POLICY_FILE's `mcp_servers`, never both
    (two lists would leave it unclear which one an operator edits)."""
    in_file = policy_file.mcp_servers if policy_file is not None else {}
    if settings.MCP_SERVERS and in_file:
        raise ConfigError(
            [
                "MCP_SERVERS and POLICY_FILE's mcp_servers are both set: list the MCP "
                "servers in one of them"
            ]
        )
    return dict(settings.MCP_SERVERS or in_file)


class McpConnections:
    """Connects to the servers once the workflow exists, and closes them after the last turn
    (turns may call their tools). `team`: the workspace POLICY_FILE was applied to, once
    known; tools that join after that get its policy too."""

    def __init__(self, servers: McpServers, policy_file: PolicyFile | None) -> None:
        self.servers = servers
        self.team: str | None = None
        self.tools: McpTools | None = None
        self._policy_file = policy_file
        self._workflow: Workflow | None = None

    async def start(self, workflow: Workflow) -> None:
        """Connect to every server (none configured: nothing, and the SDK is not imported)."""
        if not self.servers:
            return
        from agent.mcp_tools import McpTools  # the MCP SDK: only when a server is set

        self._workflow = workflow
        self.tools = McpTools(self.servers, workflow.runtime)
        self.tools.on_added = self._added
        await self.tools.start()

    async def _added(self, tools: list[str]) -> None:
        """An MCP server's tools joined after start: POLICY_FILE applies to them too. (Before
        the workspace is known, the start's own pass over every tool covers them.)"""
        if self._policy_file is None or self.team is None or self._workflow is None:
            return
        policies = self._workflow.policies
        changed = await policies.apply_file(self.team, self._policy_file, only=tools)
        log.info("POLICY_FILE set the policy of MCP tool(s) as they joined: %s", changed)

    async def stop(self) -> None:
        if self.tools is not None:
            await self.tools.stop()
