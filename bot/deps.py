"""What every listener shares, built once by the application."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent.workflow import Workflow
from bot.delivery import Delivery
from bot.people import People
from storage.db import SessionFactory

log = logging.getLogger(__name__)


class Background:
    """Work that runs after Slack's acknowledgement, tracked so shutdown can let it finish.

    At most `limit` pieces run at once; the rest wait their turn in order. Under a burst,
    hundreds of half-run turns would otherwise share the loop: each would finish later, and
    their live state would make every garbage collection (which stops the loop, and with it
    Slack's acknowledgements) longer. The database pool would make most of them wait anyway.
    """

    def __init__(self, limit: int) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = asyncio.Semaphore(limit)

    def has_room(self) -> bool:
        """Whether work spawned now would start at once."""
        return not self._running.locked()

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        task = asyncio.create_task(self._guard(coro, name), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        try:
            async with self._running:
                await coro
        except Exception:
            log.exception("background work %s failed", name)
        finally:
            coro.close()  # cut off before it began (shutdown): closed, not left un-awaited

    async def drain(self, grace: float) -> int:
        """Wait for in-flight and waiting work; returns how many pieces were cut off."""
        if not self._tasks:
            return 0
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        return len(pending)


@dataclass
class Deps:
    workflow: Workflow
    sessions: SessionFactory
    delivery: Delivery
    people: People
    clock: Callable[[], datetime]
    background: Background
