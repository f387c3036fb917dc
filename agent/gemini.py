"""The Gemini plugins (Google AI and Vertex AI), made safe against an outage at start-up.

Stock `GoogleAI.init()` and `VertexAI.init()` list models, and Genkit's registry keeps each
plugin's init task per event loop, failed ones included (genkit/_core/_registry.py,
`_ensure_plugin_initialized`): one failed listing would fail every later call until a
restart. `resolve()` builds any `googleai/*` or `vertexai/*` model on first use without I/O,
so skipping discovery loses only the dev UI's model list (and Vertex's evaluators).
"""

from __future__ import annotations

from genkit.plugin_api import Action
from genkit_google_genai import GoogleAI, VertexAI


class ResilientGoogleAI(GoogleAI):
    async def init(self) -> list[Action]:
        return []


class ResilientVertexAI(VertexAI):
    async def init(self) -> list[Action]:
        return []


def gemini_plugin(api_key: str | None, base_url: str | None) -> GoogleAI:
    return ResilientGoogleAI(api_key=api_key, base_url=base_url)


def vertex_plugin() -> VertexAI:
    """Project, location and credentials as Google's libraries find them: GOOGLE_CLOUD_PROJECT,
    GOOGLE_CLOUD_LOCATION, and Application Default Credentials."""
    return ResilientVertexAI()
