"""What a running turn tells the session store of where it starts, sparing a lookup: a
session made just now (`starting`: nothing to find), or a paused snapshot kept (`resuming`).

Paused turns' snapshots are kept whole in the process that wrote them, for their resume.
A click usually lands in the replica that posted its card, a moment after the pause: the
resume it starts would load the snapshot the pause has just written. The pause's process
keeps it, and the resume uses it instead when its claim read the row at the version it was
written with (`resuming`): every change to a snapshot row raises its version, so the same
version is the same content, whichever replica changed it. One statement fewer on the
click's path (click → reply p50 at one conversation 14.1 → 12.6 ms, A/B of the bot
benchmark's levels, docs/contributors.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from genkit.exp import SessionSnapshot

from storage.models import SnapshotRow

# Kept: about one snapshot per request waiting on this replica, the oldest dropped first.
# A long conversation (its messages' JSON over KEPT_ONE_BYTES) is loaded as before; the
# objects kept take a few times their JSON's bytes.
KEPT = 256
KEPT_BYTES = 8 * 2**20
KEPT_ONE_BYTES = 256 * 2**10
# A new row's version: what a kept copy was written as (every change raises it).
WRITTEN_AS: int = SnapshotRow.__table__.c.version.default.arg

# The session a running turn starts, by an id it made just now (`starting`).
_starting: ContextVar[str | None] = ContextVar("greenlight_starting_session", default=None)
# The snapshot a resume continues from, with its row's version as its claim read it.
_resuming: ContextVar[tuple[str, int] | None] = ContextVar("greenlight_resuming", default=None)


@contextlib.contextmanager
def starting(session_id: str | None) -> Iterator[None]:
    """Run a turn that starts session `session_id`, an id made for it: Genkit looks a new
    chat's session up before its first turn, and one made just now has no rows to find."""
    token = _starting.set(session_id)
    try:
        yield
    finally:
        _starting.reset(token)


def started() -> str | None:
    """The session the running turn starts (`starting`), if any."""
    return _starting.get()


@contextlib.contextmanager
def resuming(snapshot_id: str | None, version: int | None) -> Iterator[None]:
    """Run a resume from `snapshot_id`, whose row its claim read at `version` (None: not
    read, so whatever is kept of it is not known to be current)."""
    token = _resuming.set(
        None if snapshot_id is None or version is None else (snapshot_id, version)
    )
    try:
        yield
    finally:
        _resuming.reset(token)


class KeptSnapshots:
    """Snapshots as a pause wrote them (new rows, at WRITTEN_AS), by (team, id)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str], tuple[SessionSnapshot, int]] = {}
        self._bytes = 0  # of the kept snapshots' messages, as JSON

    def keep(self, team: str, snapshot: SessionSnapshot, size: int) -> None:
        """Keep `snapshot`, whose messages are `size` bytes of JSON, if it is not too big."""
        if size > KEPT_ONE_BYTES:
            return
        key = (team, snapshot.snapshot_id)
        if (kept := self._kept.pop(key, None)) is not None:  # kept again: counted once
            self._bytes -= kept[1]
        self._kept[key] = (snapshot, size)
        self._bytes += size
        while len(self._kept) > KEPT or self._bytes > KEPT_BYTES:
            self._bytes -= self._kept.pop(next(iter(self._kept)))[1]  # the oldest

    def for_resume(self, team: str, snapshot_id: str) -> SessionSnapshot | None:
        """The copy kept of the snapshot the running resume continues from, if its claim
        read the row at the version the copy was written with. Taken out either way: a
        resume uses it once (Genkit may change what it loads), a retry loads afresh."""
        resume = _resuming.get()
        if resume is None or resume[0] != snapshot_id:
            return None
        kept = self._kept.pop((team, snapshot_id), None)
        if kept is None:
            return None
        self._bytes -= kept[1]
        return kept[0] if resume[1] == WRITTEN_AS else None
