"""The Gemini plugins (Google AI and Vertex AI), made safe against an outage at start-up, and
the HTTP session Google AI's calls go through.

Stock `GoogleAI.init()` and `VertexAI.init()` list models, and Genkit's registry keeps each
plugin's init task per event loop, failed ones included (genkit/_core/_registry.py,
`_ensure_plugin_initialized`): one failed listing would fail every later call until a
restart. `resolve()` builds any `googleai/*` or `vertexai/*` model on first use without I/O,
so skipping discovery loses only the dev UI's model list (and Vertex's evaluators).
"""

from __future__ import annotations

from typing import cast

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from genkit.plugin_api import Action
from genkit_google_genai import GoogleAI, VertexAI
from google.genai.types import HttpOptionsDict
from yarl import URL

GOOGLE_AI = "https://generativelanguage.googleapis.com/"
READ_BUFSIZE = 2**22  # google-genai's own: a streamed answer's event is one line


class ResilientGoogleAI(GoogleAI):
    async def init(self) -> list[Action]:
        return []


class ResilientVertexAI(VertexAI):
    async def init(self) -> list[Action]:
        return []


def gemini_plugin(
    api_key: str | None, base_url: str | None, http: aiohttp.ClientSession | None = None
) -> GoogleAI:
    """`http`: the session its calls go through (`model_session`); None: google-genai's."""
    # A dict, not HttpOptions: the plugin deep-copies an HttpOptions, which breaks a session
    # (its loop copied). HttpOptions has the field; google-genai's TypedDict does not name it.
    options = cast("HttpOptionsDict", {"aiohttp_client": http}) if http is not None else None
    return ResilientGoogleAI(api_key=api_key, base_url=base_url, http_options=options)


def model_session(base_url: str | None) -> aiohttp.ClientSession:
    """The session Google AI's calls go through, its proxy (HTTPS_PROXY, NO_PROXY) read from
    the environment once, here. google-genai's own session reads it at every call
    (`trust_env`), with two trips to a worker thread (~/.netrc, then the proxy) before each
    model call is sent: at one conversation, the two alternated conversation by conversation,
    message → card p50 and Approve → reply p50 were 5% slower with it. Call it with the event
    loop running; whoever owns it closes it (bot/server.py)."""
    try:
        proxy, proxy_auth = get_env_proxy_for_url(URL(base_url or GOOGLE_AI))
    except LookupError:  # no proxy for it
        proxy, proxy_auth = None, None
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),  # as google-genai's: no cap on connections
        read_bufsize=READ_BUFSIZE,
        proxy=proxy,
        proxy_auth=proxy_auth,
    )


def vertex_plugin() -> VertexAI:
    """Project, location and credentials as Google's libraries find them: GOOGLE_CLOUD_PROJECT,
    GOOGLE_CLOUD_LOCATION, and Application Default Credentials."""
    return ResilientVertexAI()
