"""The per-person, per-card click limit."""

from __future__ import annotations

from bot.clicks import CLICKS, WINDOW, ClickLimit
from tests.agent.conftest import Clock


def test_a_few_clicks_then_one_warning_then_quiet_until_the_window_passes() -> None:
    clock = Clock()
    limit = ClickLimit(clock=clock)
    verdicts = [limit.check("U1", "card") for _ in range(CLICKS + 3)]
    assert verdicts == ["ok"] * CLICKS + ["warn", "quiet", "quiet"]
    assert limit.check("U2", "card") == "ok"  # someone else
    assert limit.check("U1", "another card") == "ok"
    clock.advance(seconds=WINDOW.total_seconds())
    assert limit.check("U1", "card") == "ok"


def test_only_pairs_clicked_within_the_window_are_kept() -> None:
    """A pair last clicked a window ago counts no click any more: it is forgotten, so a
    process that sees ever more cards keeps only those of the last window, not KEPT pairs."""
    clock = Clock()
    limit = ClickLimit(clock=clock)
    for _ in range(CLICKS):
        limit.check("U1", "card")
    for n in range(100):
        limit.check(f"U{n}", f"card {n}")
    clock.advance(seconds=WINDOW.total_seconds() - 1)
    assert limit.check("U1", "card") == "warn"  # its clicks within the window still count
    assert len(limit._seen) == 101
    clock.advance(seconds=1)
    assert limit.check("U2", "another card") == "ok"
    assert len(limit._seen) == 2  # U1's card (clicked a second ago) and this one
    clock.advance(seconds=WINDOW.total_seconds())
    assert limit.check("U3", "card") == "ok"
    assert list(limit._seen) == [("U3", "card")]
