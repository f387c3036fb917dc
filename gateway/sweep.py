"""The gateway's own background work, in every replica: callbacks now due, callers whose
process died while they waited (the card says they went away), and old MCP sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta

from gateway.callbacks import Deliveries
from gateway.calls import Gateway

log = logging.getLogger(__name__)

INTERVAL = 1.0  # seconds: how late a callback may be after its request is decided
SESSIONS_KEPT = timedelta(days=30)  # an MCP session older than this initializes anew
PRUNE_EVERY = 3600  # sweeps between two prunings of old sessions


class GatewaySweep:
    def __init__(
        self,
        gateway: Gateway,
        deliveries: Deliveries,
        *,
        clock: Callable[[], datetime],
        interval: float = INTERVAL,
    ) -> None:
        self._gateway = gateway
        self._deliveries = deliveries
        self._clock = clock
        self._interval = interval

    async def once(self, n: int = 0) -> None:
        """Each job on its own: one failing (the database, Slack) does not stop the others."""
        jobs = [self._deliveries.run, self.lost_callers]
        if n % PRUNE_EVERY == 0:
            jobs.append(self._prune)
        for job in jobs:
            try:
                await job()
            except Exception:
                log.exception("the gateway's sweep failed (%s); trying again shortly", job)

    async def _prune(self) -> int:
        return await self._gateway.store.prune_sessions(before=self._clock() - SESSIONS_KEPT)

    async def lost_callers(self) -> int:
        """Requests whose waiting process died (its lease ran out): noted on their cards."""
        g = self._gateway
        now = self._clock()
        lost = await g.store.lost_waiters(now=now, lease_until=now + g.waiters.lease)
        for team_id, approval_id in lost:
            found = await g.workflow.reads.approval(team_id, approval_id)
            if found is None:
                await g.waiters.release(approval_id)
            else:
                await g.gone(found)
        return len(lost)

    async def _forever(self) -> None:
        n = 0
        while True:
            await self.once(n)
            n += 1
            await asyncio.sleep(self._interval)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self._forever(), name="gateway sweep")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self._deliveries.close()
