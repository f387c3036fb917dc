"""The garbage collector: paused while start-up builds what lasts as long as the process, that
heap kept out of every later collection once it is built, and the young generation sized
for a service's short-lived objects once it serves."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

# Allocations between collections of the youngest generation (CPython's default: 700).
YOUNG = 10_000


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
    """Collect the young generation every YOUNG allocations instead of every 700.

    A conversation allocates tens of thousands of objects that live for milliseconds
    (Genkit's and pydantic's models, SQL rows, JSON); at 700, collections ran every few
    hundred microseconds of work and promoted many of them while still in use, to be walked
    again by the costlier older collections. bench/bot.py, three alternating pairs (issue
    23): garbage collection 2.75 / 3.72 / 3.70 ms of pauses a conversation at 700, 1.06 /
    1.10 / 1.32 at 10,000; the longest pause under saturation 78 / 90 / 83 ms against 30 /
    45 / 61. The older generations keep their thresholds."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
