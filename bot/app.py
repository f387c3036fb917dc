"""The Bolt app: a Web API client that honours Retry-After and counts Slack's errors, the
listeners, one error handler."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_bolt.response import BoltResponse
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient

from agent.scope import Outside
from bot import listeners
from bot.deps import Deps

log = logging.getLogger(__name__)

Next = Callable[[], Awaitable[BoltResponse]]
SlackErrorSink = Callable[[str, str], None]  # (method, error)


class RateLimitWait(AsyncRateLimitErrorRetryHandler):
    """Waits out a 429 per its Retry-After, in `outside` (bot/background.py): the work that
    made the call gives its slot to other work meanwhile, instead of sleeping in it."""

    def __init__(self, outside: Outside, max_retry_count: int) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self._outside = outside

    async def prepare_for_next_attempt_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        async with self._outside():
            await super().prepare_for_next_attempt_async(
                state=state, request=request, response=response, error=error
            )


class SlackErrors(AsyncRetryHandler):
    """Tells `sink` of every error answer of Slack's Web API, each attempt, and retries
    nothing itself. A retry handler because slack_sdk shows each answer to the client's
    handlers, and Bolt's per-request clients share them: one place sees every call, whoever
    makes it, before any `SlackApiError` is raised (or caught)."""

    def __init__(self, sink: SlackErrorSink, base_url: str) -> None:
        super().__init__(max_retry_count=0)
        self._sink = sink
        self._base_url = base_url

    async def can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if (found := slack_error(response, error)) is not None:
            url = request.url
            method = url[len(self._base_url) :] if url.startswith(self._base_url) else "other"
            self._sink(method, found)
        return False


def slack_error(response: HttpResponse | None, error: Exception | None) -> str | None:
    """Slack's error code for an answer (None: no error): its `error` field, else the HTTP
    status; `connection_error` when no answer came."""
    if response is None:
        return "connection_error" if error is not None else None
    body = response.body
    if isinstance(body, dict) and body.get("ok") is False:
        return str(body.get("error") or "unknown")
    return f"http_{response.status_code}" if response.status_code >= 400 else None


def web_client(
    token: str,
    api_url: str | None,
    errors: SlackErrorSink | None = None,
    *,
    outside: Outside = contextlib.nullcontext,
) -> AsyncWebClient:
    """Slack's client (see `configure`)."""
    return configure(AsyncWebClient(token=token), api_url, errors, outside=outside)


def configure(
    client: AsyncWebClient,
    api_url: str | None,
    errors: SlackErrorSink | None = None,
    *,
    outside: Outside = contextlib.nullcontext,
) -> AsyncWebClient:
    """`client`, retrying dropped connections, 429s per Retry-After, and 500/503; every
    error answer goes to `errors` (bot/metrics.py). Every call, and every wait for a 429,
    waits for Slack in `outside` (bot/background.py): a slow answer gives the work's slot to
    other work meanwhile, as a model call does. With each Slack call taking 100 ms and each
    model call 800, and more conversations at once than MAX_CONCURRENT_TURNS, the later ones
    otherwise waited for slots held by calls in flight (`python -m bench.latencies`, two
    runs, against the bare bot's 1,106 / 1,065 and 1,562 / 1,462 ms): message → card p99 at
    10 at once 1,426 / 1,405 ms, now 1,158 / 1,175; at 50, 3,285 / 3,054, now 2,319 / 2,181.

    A lost approval card strands a request; a duplicate needs Slack to have acted and then
    failed, which is rarer, and the second card's buttons resolve to the same approval.

    Every call goes through one aiohttp session, whose keep-alive connections are reused:
    without one, slack_sdk opens a session, so a new TCP and TLS connection, per call. Bolt
    hands this session to the per-request clients it builds. Call it with the event loop
    running; whoever owns the client closes `client.session`.
    """
    if api_url:
        client.base_url = api_url if api_url.endswith("/") else api_url + "/"
    # slack_sdk's own default timeout; it sets none per request on a shared session.
    client.session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=30), middlewares=(_waiting_in(outside),)
    )
    client.retry_handlers = [
        AsyncConnectionErrorRetryHandler(max_retry_count=2),
        RateLimitWait(outside, max_retry_count=3),
        AsyncServerErrorRetryHandler(max_retry_count=2),
    ]
    if errors is not None:  # first: the handler that retries stops the others looking
        client.retry_handlers.insert(0, SlackErrors(errors, client.base_url))
    return client


def _waiting_in(outside: Outside) -> aiohttp.ClientMiddlewareType:
    """An aiohttp middleware that waits for the answer's headers in `outside`."""

    async def waiting(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        async with outside():
            return await handler(request)

    return waiting


def raised_by_us(error: BaseException) -> bool:
    """Whether the error came out of this package's code (a listener), not Bolt's alone."""
    tb = error.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("bot."):
            return True
        tb = tb.tb_next
    return False


def build_app(
    deps: Deps,
    *,
    token: str,
    signing_secret: str | None,
    api_url: str | None,
    slack_errors: SlackErrorSink | None = None,
) -> AsyncApp:
    # Bolt is given the token and builds the client, which is then configured: given a
    # `client=`, Bolt would read SLACK_BOT_TOKEN from the environment on its own and warn
    # on every start that the token is unused (bolt-python#983).
    app = AsyncApp(
        token=token,
        signing_secret=signing_secret or "",
        request_verification_enabled=signing_secret is not None,
        ignoring_self_events_enabled=True,
    )
    configure(app.client, api_url, slack_errors, outside=deps.background.outside)

    @app.error
    async def on_error(
        error: Exception, body: dict[str, Any], response: BoltResponse | None
    ) -> BoltResponse | None:
        # The one place unhandled errors land: full detail to the log, none to Slack.
        kind = body.get("type") if isinstance(body, dict) else None
        if response is not None and not raised_by_us(error):
            # Bolt itself (its middleware or listener matching) failed before any listener
            # ran: it indexes into fields Slack always sends, so the payload is malformed.
            # The sender's fault, not a 500. Our listeners' own failures stay 500s.
            log.warning("malformed %s request: %r", kind, error)
            return BoltResponse(status=400, body="")
        log.error("listener failed for a %s request", kind, exc_info=error)
        return None

    @app.middleware
    async def provide_deps(context: AsyncBoltContext, next_: Next) -> BoltResponse:
        """Every listener gets `deps` by name, as Bolt passes what a request's context holds."""
        context["deps"] = deps
        return await next_()

    listeners.register(app)
    return app
