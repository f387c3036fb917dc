"""A snapshot a resume will load, asked for as soon as the resume holds its turn.

Between a resume's claim and Genkit's `get_snapshot` of the paused snapshot, the workflow
sets the turn up (its scope, the lease's heartbeat, the calls approved with changes) and
Genkit its chat: a millisecond or two at the click's expense. Inside `loading()` the load
runs meanwhile, and the store's `get_snapshot` of that snapshot takes it (once). Only the
claim's holder writes a paused turn's snapshot, so the one loaded early is the one Genkit
would read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

Key = tuple[str, str]  # (team, snapshot id)


class Preload:
    """One load under way, taken once by the read it was started for."""

    def __init__(self, key: Key, task: asyncio.Future[Any]) -> None:
        self.key = key
        self.task: asyncio.Future[Any] | None = task

    def take(self, key: Key) -> asyncio.Future[Any] | None:
        if key != self.key:
            return None
        task, self.task = self.task, None
        return task


_preload: ContextVar[Preload | None] = ContextVar("greenlight_preload", default=None)


def taken(key: Key) -> asyncio.Future[Any] | None:
    """The load under way of `key` for this context, if any (then it is no one else's)."""
    preload = _preload.get()
    return preload.take(key) if preload is not None else None


@contextlib.asynccontextmanager
async def loading(key: Key, load: Callable[[], Awaitable[Any]]) -> AsyncIterator[None]:
    """Start `load` now, its statement sent before the block goes on; a read of `key` inside
    the block takes it. One not taken is cancelled at the end (the resume failed first)."""
    task = asyncio.ensure_future(load())
    preload = Preload(key, task)
    token = _preload.set(preload)
    try:
        await asyncio.sleep(0)  # the load runs up to its round trip
        yield
    finally:
        _preload.reset(token)
        if preload.task is not None:
            preload.task.cancel()
            # Whatever it ended with is no one's: retrieved, so asyncio does not report it.
            preload.task.add_done_callback(lambda t: t.cancelled() or t.exception())
