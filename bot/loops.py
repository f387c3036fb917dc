"""The service's recurring work: the recovery sweep and the follow-ups, until it stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from slack_sdk.web.async_client import AsyncWebClient

from bot.deps import Deps

log = logging.getLogger(__name__)

FOLLOW_UP_INTERVAL = 5.0  # seconds between looks for due reminders and escalations


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
    ) -> None:
        self._deps = deps
        self._client = client
        self._sweep_interval = sweep_interval
        self._follow_up_interval = follow_up_interval
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._sweep_forever(), name="recovery sweep"),
            asyncio.create_task(self._follow_up_forever(), name="follow-ups"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _sweep_forever(self) -> None:
        """Expire overdue approvals and finish turns a dead process left; first at start-up."""
        deps, client = self._deps, self._client
        while True:
            try:
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
            except Exception:
                log.exception("recovery sweep failed; trying again next interval")
            await asyncio.sleep(self._sweep_interval)

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
