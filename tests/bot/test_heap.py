"""bot/heap.py: the collector's settings once the service serves."""

from __future__ import annotations

import gc

from bot import heap


def test_serving_collects_the_young_generation_less_often() -> None:
    before = gc.get_threshold()
    try:
        heap.serving()
        assert gc.get_threshold() == heap.THRESHOLDS
        assert heap.THRESHOLDS[0] > 700  # CPython's default
    finally:
        gc.set_threshold(*before)
