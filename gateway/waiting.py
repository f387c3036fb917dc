"""Waiting for decisions in one process: which waited-on requests are decided (one poll of
the database for all of them, whichever replica decided), and the lease by which this
process says its MCP callers are still there.

A caller waits in the process it called; if that process dies, nobody will ever run what it
asked. The lease (RESUME_LEASE_SECONDS, renewed every third of it) lets any replica see that,
and say on the card that the caller went away (gateway/sweep.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from storage.gateway_store import GatewayStore

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25  # how often one process asks the database which waited-on calls are decided


class Decisions:
    """The calls this process waits on, each told once it is decided; one query per poll
    for all of them, whichever replica decided."""

    def __init__(self, store: GatewayStore) -> None:
        self._store = store
        self._waiting: dict[str, asyncio.Event] = {}
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, approval_id: str, timeout: float) -> bool:  # noqa: ASYNC109
        """Whether it was decided within `timeout` seconds."""
        event = self._waiting.setdefault(approval_id, asyncio.Event())
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="gateway decisions")
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            if self._waiting.get(approval_id) is event and event.is_set():
                del self._waiting[approval_id]

    def forget(self, approval_id: str) -> None:
        self._waiting.pop(approval_id, None)

    async def _poll(self) -> None:
        while self._waiting:
            try:
                for done in await self._store.settled(list(self._waiting)):
                    if (event := self._waiting.get(done)) is not None:
                        event.set()
            except Exception:  # the database: the next poll tries again
                log.warning("could not read the gateway's decisions", exc_info=True)
            await asyncio.sleep(POLL_SECONDS)

    def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()


class Waiters:
    """The MCP callers waiting in this process, held in the database by a lease that one
    statement renews for all of them every third of it."""

    def __init__(
        self, store: GatewayStore, *, clock: Callable[[], datetime], lease: timedelta
    ) -> None:
        self._store = store
        self._clock = clock
        self._lease = lease
        self._held: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None

    async def hold(self, approval_id: str) -> None:
        self._held.add(approval_id)
        await self._store.hold_waiters([approval_id], until=self._clock() + self._lease)
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew(), name="gateway waiters")

    async def release(self, approval_id: str) -> None:
        """The caller got its answer, or its going away is noted: no lease is left."""
        self._held.discard(approval_id)
        with contextlib.suppress(Exception):  # the lease runs out; a sweep notes it then
            await self._store.release_waiter(approval_id)

    def drop(self, approval_id: str) -> None:
        """No longer renewed: its lease runs out, and a sweep (any replica's) notes it."""
        self._held.discard(approval_id)

    @property
    def lease(self) -> timedelta:
        return self._lease

    async def _renew(self) -> None:
        while self._held:
            await asyncio.sleep(self._lease.total_seconds() / 3)
            try:
                until = self._clock() + self._lease
                await self._store.hold_waiters(list(self._held), until=until)
            except Exception:  # the next renewal tries again, well within the lease
                log.warning("could not renew the gateway's waiting callers", exc_info=True)

    def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
