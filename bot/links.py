"""Permalinks to Slack messages (a thread, a card): built as Slack builds them, asked once.

Slack's permalink is `{workspace}archives/{channel}/p{ts without the dot}`
(`?thread_ts=…&cid=…` for a reply); the workspace's address comes from one `auth.test` per
process, and `chat.getPermalink` is only the fallback when it fails (see Performance in
docs/contributors.md). Once the address is known a link is built when asked for, and nothing
is kept. Until then (or for good, if auth.test fails) a message's link is looked up once and
kept, as a task, so a lookup started early (`warm`) is shared, not repeated.
"""

from __future__ import annotations

import asyncio
import logging

from slack_sdk.web.async_client import AsyncWebClient

from bot.background import detached
from storage.domain import Thread
from storage.gateway_store import GATEWAY_CHANNEL

log = logging.getLogger(__name__)

KEPT = 4096  # links (and, in bot/delivery.py, channel names and cards drawn) this process keeps


class Links:
    def __init__(self) -> None:
        self._permalinks: dict[tuple[str, str], asyncio.Future[str | None]] = {}
        # The workspace's address (auth.test's `url`, asked once): with it a link is built
        # as Slack builds it, without a call (two fewer per conversation).
        self._workspace: asyncio.Future[str | None] | None = None

    def warm(self, client: AsyncWebClient, thread: Thread) -> None:
        """Start looking up the thread's link now, off the path of a card that may need it
        (nothing to do once the workspace's address is known: the link is built then)."""
        if thread.channel_id != GATEWAY_CHANNEL and self._address_known() is None:
            self._lookup(client, thread)

    async def link(
        self, client: AsyncWebClient, thread: Thread, *, in_thread: str | None = None
    ) -> str | None:
        """`thread`'s message's link (`in_thread`: the root of the thread it is a reply in)."""
        if thread.channel_id == GATEWAY_CHANNEL:
            return None  # a gateway request's: no Slack thread is behind it
        if (base := self._address_known()) is not None:
            return _built(base, thread, in_thread)
        lookup = self._lookup(client, thread, in_thread)
        link = await asyncio.shield(lookup)  # one waiter cancelled must not cancel the others
        if link is None and self._permalinks.get((thread.channel_id, thread.thread_ts)) is lookup:
            del self._permalinks[(thread.channel_id, thread.thread_ts)]  # ask again next time
        return link

    def _lookup(
        self, client: AsyncWebClient, thread: Thread, in_thread: str | None = None
    ) -> asyncio.Future[str | None]:
        key = (thread.channel_id, thread.thread_ts)
        if (known := self._permalinks.get(key)) is None:
            if len(self._permalinks) >= KEPT:
                del self._permalinks[next(iter(self._permalinks))]  # the oldest
            known = self._permalinks[key] = detached(self._ask(client, thread, in_thread))
        return known

    def _address_known(self) -> str | None:
        """The workspace's address, if auth.test has given it already."""
        asked = self._workspace
        if asked is None or not asked.done() or asked.cancelled() or asked.exception():
            return None
        return asked.result()

    async def _ask(
        self, client: AsyncWebClient, thread: Thread, in_thread: str | None
    ) -> str | None:
        """The link, or None: a card without it still works, so nothing here may fail it."""
        if self._workspace is None:
            self._workspace = detached(self._address(client))
        if (base := await asyncio.shield(self._workspace)) is not None:
            return _built(base, thread, in_thread)
        try:
            response = await client.chat_getPermalink(
                channel=thread.channel_id, message_ts=thread.thread_ts
            )
        except Exception as exc:
            log.warning("no permalink for %s: %r", thread.channel_id, exc)
            return None
        link = response.get("permalink")
        return str(link) if link else None

    async def _address(self, client: AsyncWebClient) -> str | None:
        """ "https://acme.slack.com/", or None (links are then asked for; asked again later)."""
        try:
            url = (await client.auth_test()).get("url")
        except Exception as exc:
            log.warning("no workspace address: %r", exc)
            url = None
        if isinstance(url, str) and url.startswith("https://") and url.endswith("/"):
            return url
        self._workspace = None
        return None


def _built(base: str, thread: Thread, in_thread: str | None) -> str:
    """The link as Slack builds it, `base` the workspace's address."""
    channel, ts = thread.channel_id, thread.thread_ts
    built = f"{base}archives/{channel}/p{ts.replace('.', '')}"
    reply = in_thread is not None and in_thread != ts
    return built + f"?thread_ts={in_thread}&cid={channel}" if reply else built
