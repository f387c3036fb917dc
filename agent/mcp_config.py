"""MCP servers as configured (MCP_SERVERS, or POLICY_FILE's `mcp_servers`), checked.

Apart from agent/mcp_tools.py so that reading the settings does not import the MCP SDK
(about a second of start-up): the SDK is imported only when a server is configured.
"""

from __future__ import annotations

import json
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, model_validator

# A server's name starts each of its tools' names; with the dot and the tool's own name it must
# stay a valid model function name (Gemini: letters, digits, `_.:-`, at most 64 characters).
SERVER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")


def _server_name(value: str) -> str:
    if not SERVER_NAME.match(value):
        raise ValueError(
            f"MCP server name {value!r} must start with a letter and have only letters, "
            "digits, _ and - (at most 32): it starts the names of its tools"
        )
    return value


ServerName = Annotated[str, AfterValidator(_server_name)]


class McpServer(BaseModel):
    """One server: stdio (`command`, `args`, `env`) or streamable HTTP (`url`, `headers`).
    Env and header values are secrets: they never reach logs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, SecretStr] = Field(default_factory=dict)
    url: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("needs exactly one of `command` (stdio) or `url` (streamable HTTP)")
        if self.command is not None and self.headers:
            raise ValueError("`headers` go with `url`, not with `command`")
        if self.url is not None and (self.args or self.env):
            raise ValueError("`args` and `env` go with `command`, not with `url`")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError("`url` must start with http:// or https://")
        return self


McpServers = dict[ServerName, McpServer]


def parse_servers(value: object) -> object:
    """MCP_SERVERS as given in the environment: JSON text (a mapping of server name to its
    config); a clear error rather than the settings library's own."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
