"""A turn's new snapshot held back, to be written by the statement that ends the turn.

Genkit saves a turn's snapshot (`SqlSessionStore.save_snapshot`) just before the workflow
pauses, completes or releases the turn, each one statement. Inside `holding()`, the store
keeps the first new row it would create instead (a `Held`: the statement's parameters), and
storage/turns.py writes it in the same statement as the turn's end: one round trip a turn
fewer, and a paused turn never exists without its snapshot. What the ending statement did
not write (it matched nothing, or nothing ended the turn) the workflow flushes, or drops
when the turn failed and nothing will point at the snapshot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Held:
    """A new snapshot's row and messages as CREATE's parameters (storage/session_store.py).
    `written`: the turn's statement wrote it (`resumable`: a pause, whose resume will load
    it); `flush`: write it on its own (Genkit's save, with its retries), when the turn's
    statement did not."""

    snapshot_id: str
    params: dict[str, Any]
    written: Callable[[bool], None]
    flush: Callable[[], Awaitable[None]]


class Holding:
    """The save a running turn holds back: at most one (a second save flushes the first)."""

    def __init__(self) -> None:
        self.held: Held | None = None

    def take(self, snapshot_id: str | None) -> Held | None:
        """The held save of `snapshot_id` (the turn's last), handed to whoever writes it;
        None (and any other kept, for `flush`) if that is not the one held."""
        held = self.held
        if held is None or held.snapshot_id != snapshot_id:
            return None
        self.held = None
        return held

    async def flush(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            await held.flush()


_holding: ContextVar[Holding | None] = ContextVar("greenlight_holding", default=None)


def current() -> Holding | None:
    return _holding.get()


@contextlib.contextmanager
def holding() -> Iterator[Holding]:
    """Hold back the new snapshot the turn run inside saves (Genkit's tasks see the same
    holder: they copy the context, and the holder is shared by reference)."""
    hold = Holding()
    token = _holding.set(hold)
    try:
        yield hold
    finally:
        _holding.reset(token)
