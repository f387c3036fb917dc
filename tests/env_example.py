""".env.example: every setting `bot/settings.py` reads, with its default, for compose's `.env`.

`python -m tests.env_example > .env.example` writes it; tests/test_compose.py fails when a
setting is added, dropped or its default changes without it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import SecretStr
from pydantic_core import to_jsonable_python

from bot.settings import Settings

# Needed to serve (with the default Gemini model); the rest have defaults or are optional.
REQUIRED = ("SLACK_BOT_TOKEN", "APPROVER_CHANNEL", "GEMINI_API_KEY")
HEADER = """\
# Greenlight's settings for `docker compose up` (copy to .env). Every setting bot/settings.py
# reads is here with its default; uncomment a line to change it. See the README's
# Configuration table for what each means. Written by `python -m tests.env_example`.
# In compose, DATABASE_URL is set by compose.yaml to its PostgreSQL service.

# Required: the bot token, the approvers' private channel, the model's key, and either
# SLACK_APP_TOKEN (Socket Mode, no public URL) or SLACK_SIGNING_SECRET (HTTP mode).
"""


def render_default(value: Any) -> str:
    """The default as the environment spells it (what Settings parses back to the same)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    if isinstance(value, list | dict):
        return json.dumps(to_jsonable_python(value))
    return str(value)


def defaults() -> dict[str, str]:
    out = {}
    for name, field in Settings.model_fields.items():
        value = field.get_default(call_default_factory=True)
        out[name] = render_default(value)
    return out


def render() -> str:
    values = defaults()
    lines = [HEADER]
    lines += [f"{name}=\n" for name in REQUIRED]
    lines += ["# SLACK_APP_TOKEN=\n", "# SLACK_SIGNING_SECRET=\n"]
    lines.append("\n# Optional, with their defaults:\n")
    skip = {*REQUIRED, "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"}
    lines += [f"# {name}={value}\n" for name, value in values.items() if name not in skip]
    return "".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
