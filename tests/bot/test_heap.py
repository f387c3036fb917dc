"""bot/heap.py: the collector's settings once the service serves."""

from __future__ import annotations

import gc

from bot import heap


def test_serving_collects_the_young_generation_less_often_and_leaves_the_older_ones() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 7, 9)
        heap.serving()
        assert gc.get_threshold() == (heap.YOUNG, 7, 9)
    finally:
        gc.set_threshold(*before)
