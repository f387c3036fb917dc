"""The service's recurring work: the recovery sweep, the follow-ups and the people
directory's sync, until it stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from slack_sdk.web.async_client import AsyncWebClient

from bot.deps import Deps

log = logging.getLogger(__name__)

FOLLOW_UP_INTERVAL = 5.0  # seconds between looks for due reminders and escalations
SYNC_CHECKS = 4  # looks an interval whether the people directory's sync is due


class Loops:
    """Started once everything else is up (the first sweep runs at once), stopped before
    the turns drain. A pass that fails is logged and tried again next interval."""

    def __init__(
        self,
        deps: Deps,
        client: AsyncWebClient,
        *,
        sweep_interval: float,
        follow_up_interval: float = FOLLOW_UP_INTERVAL,
        people_sync_interval: float = 0.0,
    ) -> None:
        """`people_sync_interval`: seconds between users.list syncs (0: none)."""
        self._deps = deps
        self._client = client
        self._sweep_interval = sweep_interval
        self._follow_up_interval = follow_up_interval
        self._people_sync_interval = people_sync_interval
        self._tasks: list[asyncio.Task[None]] = []
        self._pass: asyncio.Task[None] | None = None  # the recovery sweep's, while under way

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._sweep_forever(), name="recovery sweep"),
            asyncio.create_task(self._follow_up_forever(), name="follow-ups"),
        ]
        if self._people_sync_interval:
            self._tasks.append(asyncio.create_task(self._sync_forever(), name="people sync"))

    async def stop(self, grace: float = 0.0) -> None:
        """Stop the loops; a sweep's pass under way (its resumes, whose replies may be in
        their threads already) first gets up to `grace` seconds to finish, as turns do."""
        if self._pass is not None and not self._pass.done():
            await asyncio.wait({self._pass}, timeout=grace)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _sweep_forever(self) -> None:
        """Expire overdue approvals and finish turns a dead process left; first at start-up."""
        while True:
            self._pass = asyncio.create_task(self._sweep_once(), name="recovery sweep pass")
            try:
                await self._pass
            except Exception:
                log.exception("recovery sweep failed; trying again next interval")
            await asyncio.sleep(self._sweep_interval)

    async def _sweep_once(self) -> None:
        deps, client = self._deps, self._client
        streams = deps.delivery.streams(client)
        report = await deps.workflow.follow_ups.sweep(on_text=streams)
        if report.expired or report.resumed:
            log.info(
                "recovery sweep resumed %d turn(s), expired %d approval(s)",
                len(report.resumed),
                len(report.expired),
            )
        if report.purged.rows:
            log.info("retention deleted %s", report.purged)
        await deps.delivery.sweep(client, report, streams)
        await streams.close_rest()
        await deps.limits.sweep()

    async def _follow_up_forever(self) -> None:
        """Reminders and escalations, within the follow-up interval of their time: each is
        recorded as done by whichever replica gets there first, then done."""
        while True:
            try:
                due = await self._deps.workflow.follow_ups.due()
                await self._deps.delivery.follow_ups(self._client, due)
            except Exception:
                log.exception("follow-ups failed; trying again shortly")
            await asyncio.sleep(self._follow_up_interval)

    async def _sync_forever(self) -> None:
        """Everyone users.list lists into the people directory, by whichever replica claims
        the sync once it is due; asked at start-up and SYNC_CHECKS times an interval, so a
        sync is late by a quarter of one at most, whichever replica's turn it is."""
        while True:
            try:
                seen = await self._deps.people.sync(self._client)
                if seen is not None:
                    log.info("people directory synced: %d person(s)", seen)
            except Exception:
                log.exception("people directory sync failed; due again at the next look")
            await asyncio.sleep(self._people_sync_interval / SYNC_CHECKS)
