"""The garbage collector at start-up: paused while start-up builds what lasts as long as the
process, and that heap kept out of every later collection once it is built."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


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
