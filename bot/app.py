"""The Bolt app: a Web API client that honours Retry-After, the listeners, one error handler."""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot import listeners
from bot.deps import Deps

log = logging.getLogger(__name__)


def web_client(token: str, api_url: str | None) -> AsyncWebClient:
    """Slack's client, retrying dropped connections, 429s per Retry-After, and 500/503.

    A lost approval card strands a request; a duplicate needs Slack to have acted and then
    failed, which is rarer, and the second card's buttons resolve to the same approval.
    """
    kwargs: dict[str, Any] = {}
    if api_url:
        kwargs["base_url"] = api_url if api_url.endswith("/") else api_url + "/"
    return AsyncWebClient(
        token=token,
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(max_retry_count=2),
            AsyncRateLimitErrorRetryHandler(max_retry_count=3),
            AsyncServerErrorRetryHandler(max_retry_count=2),
        ],
        **kwargs,
    )


def build_app(
    deps: Deps, *, token: str, signing_secret: str | None, api_url: str | None
) -> AsyncApp:
    app = AsyncApp(
        client=web_client(token, api_url),
        signing_secret=signing_secret or "",
        request_verification_enabled=signing_secret is not None,
        ignoring_self_events_enabled=True,
    )

    @app.error
    async def on_error(error: Exception, body: dict[str, Any]) -> None:
        # The one place unhandled listener errors land: full detail to the log, none to Slack.
        log.error("listener failed for a %s request", body.get("type"), exc_info=error)

    listeners.register(app, deps)
    return app
