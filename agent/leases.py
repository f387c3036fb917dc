"""Heartbeats: a lease (a resume's claim, a thread's hold) renewed while its work runs.

Renewed every third of the lease: a process that dies stops renewing, so what it held is
free again one lease later at most. A renewal that fails (the database dropped the
connection) or hangs (a lock, a stalled connection) past a third of the lease is tried again
soon: the last one renewed still has two thirds to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

log = logging.getLogger(__name__)

# A resume's lease (and a running turn's hold on its thread), renewed every third of it: a
# process that dies holds its turn this long at most. A failed renewal (a dropped connection)
# is tried again every RENEW_RETRY, with two thirds of the lease still to run.
LEASE = timedelta(seconds=15)
RENEW_RETRY = timedelta(seconds=1)
# Renew until `until`; False once the lease is lost (another holder, or it was let go).
Renew = Callable[[datetime], Awaitable[bool]]


@dataclass(frozen=True)
class Leases:
    """How long a lease runs, and the heartbeat that keeps one."""

    lease: timedelta
    clock: Callable[[], datetime]

    @contextlib.asynccontextmanager
    async def kept(
        self,
        renew: Renew,
        what: str,
        until: datetime,
        *,
        on_lost: Callable[[], None] | None = None,
    ) -> AsyncIterator[None]:
        """Keep a lease (held until `until`) renewed while the block runs; `on_lost` is
        called once it is lost (renewal refused, or it ran out unrenewed) meanwhile."""
        beat = asyncio.create_task(self._beat(renew, what, until, on_lost))
        try:
            yield
        finally:
            beat.cancel()

    async def _beat(
        self, renew: Renew, what: str, until: datetime, on_lost: Callable[[], None] | None
    ) -> None:
        """Renew every third of the lease until it is lost: `renew` says so (False), or it
        ran out (`until`) before a renewal went through."""
        every = self.lease.total_seconds() / 3
        wait = every
        while True:
            await asyncio.sleep(wait)
            left = (until - self.clock()).total_seconds()
            if left <= 0:
                log.error("%s ran out before it could be renewed", what)
                break
            renewed = self.clock() + self.lease
            try:
                async with asyncio.timeout(min(every, left)):
                    if not await renew(renewed):
                        break
            except Exception:  # a database hiccup: the lease may still be renewed soon
                log.warning("could not renew %s", what, exc_info=True)
                wait = min(RENEW_RETRY.total_seconds(), every)
            else:
                until, wait = renewed, every
        if on_lost is not None:
            on_lost()
