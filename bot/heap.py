"""The garbage collector: paused while start-up builds what lasts as long as the process, that
heap kept out of every later collection once it is built, and the generations sized for a
service's short-lived objects once it serves."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Allocations between collections of the youngest generation (CPython's default: 700), and
# how many collections of each generation come before one of the next (its default: 10, 10).
THRESHOLDS = (10_000, 3, 3)


@contextlib.contextmanager
def building(*, collect: bool = False) -> Iterator[None]:
    """No collection while this lasts, then what was built frozen: kept out of every later
    collection (`collect`: its garbage collected first, once).

    Importing the service and starting it make modules, classes, schemas and Genkit's
    registry, all kept for good. The full collections their numbers set off walked every one
    of them to free almost nothing (three full passes in `import bot.server` freed 74
    objects), the interpreter walked them once more at exit, and once the service ran, each
    full collection paused the event loop for 200 ms and more under load while Slack's
    acknowledgements waited (bench/bot.py). Whole processes, alternating (issue 23, load 3
    to 4): `import bot.server` 1.09 s of CPU against 1.84 (0.96 against 1.20 leaving by
    `os._exit`, the import alone). Whatever the caller had set comes back after."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collect:
            gc.collect()
        gc.freeze()
        if collecting:
            gc.enable()


def serving() -> None:
    """Collect the young generation every 10,000 allocations instead of every 700, and the
    older ones after 3 collections of the one below instead of 10.

    A conversation allocates tens of thousands of objects that live for milliseconds
    (Genkit's and pydantic's models, SQL rows, JSON); at 700, collections ran every few
    hundred microseconds of work and promoted many of them while still in use, to be walked
    again by the costlier older collections. Full collections still come about as often,
    counted in allocations (every 3 x 3 x 10,000 against 10 x 10 x 700): collected less
    often, the cyclic garbage that reaches the oldest stayed longer and the heap grew (RSS
    after 2,000 conversations 1.099x RSS after 200 with 10,000 / 10 / 10; 1.056x at the
    defaults and with these). bench/bot.py, alternating (issue 23, a noisy machine):
    collector pauses 4.02 / 3.79 ms a conversation at the defaults, 1.92 / 1.75 with
    these; the longest under saturation 96 / 95 ms against 55 / 51."""
    gc.set_threshold(*THRESHOLDS)
