"""The Gemini plugin, made safe against an outage at start-up.

Stock `GoogleAI.init()` lists models, and Genkit's registry keeps each plugin's init task per
event loop, failed ones included (genkit/_core/_registry.py, `_ensure_plugin_initialized`):
one failed listing would fail every later call until a restart. `resolve()` builds any
`googleai/*` model on first use without I/O, so skipping discovery loses only the dev UI's
model list.
"""

from __future__ import annotations

from genkit.plugin_api import Action
from genkit_google_genai import GoogleAI


class ResilientGoogleAI(GoogleAI):
    async def init(self) -> list[Action]:
        return []


def gemini_plugin(api_key: str | None, base_url: str | None) -> GoogleAI:
    return ResilientGoogleAI(api_key=api_key, base_url=base_url)
