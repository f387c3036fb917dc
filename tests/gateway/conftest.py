"""The gateway's tests run the real service (tests/bot/conftest.py) and reach it as an
agent would: the mcp SDK's streamable HTTP client, aiohttp for the approvals API."""

from __future__ import annotations

from tests.bot.conftest import (  # noqa: F401  (the bot suite's fixtures, reused)
    bot_database,
    bot_sessions,
    client,
    fake_slack,
    gemini,
    service,
    service_overrides,
)
