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
