"""How often one person may press one card's buttons: a few clicks, then a pause.

Every click costs Slack look-ups and database reads; a held-down Enter or a script must not
turn a card into a way to load the bot. Counted per process (a replica counts its own).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Literal

CLICKS = 5
WINDOW = timedelta(seconds=10)
KEPT = 10_000  # (user, card) pairs remembered at most; the oldest are forgotten first


class ClickLimit:
    def __init__(
        self,
        *,
        clock: Callable[[], datetime],
        clicks: int = CLICKS,
        window: timedelta = WINDOW,
    ) -> None:
        self._clock = clock
        self._clicks = clicks
        self._window = window
        self._seen: OrderedDict[tuple[str, str], deque[datetime]] = OrderedDict()

    def check(self, user: str, approval_id: str) -> Literal["ok", "warn", "quiet"]:
        """ "ok" for a click to handle; past the limit "warn" once per window, then "quiet"."""
        now = self._clock()
        key = (user, approval_id)
        times = self._seen.pop(key, None) or deque()
        while times and now - times[0] >= self._window:
            times.popleft()
        times.append(now)
        self._forget_idle(now)
        self._seen[key] = times
        if len(self._seen) > KEPT:
            self._seen.popitem(last=False)
        if len(times) <= self._clicks:
            return "ok"
        return "warn" if len(times) == self._clicks + 1 else "quiet"

    def _forget_idle(self, now: datetime) -> None:
        """Forget the pairs last clicked a window ago or more: their clicks no longer count
        (their next one would find none left), so only pairs clicked within the window are
        kept, not the last KEPT. The pairs are in the order of their last click (each is
        re-inserted as the newest), so those are the first ones."""
        while self._seen:
            first = next(iter(self._seen.values()))
            if now - first[-1] < self._window:
                return
            self._seen.popitem(last=False)
