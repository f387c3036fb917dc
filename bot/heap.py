"""The garbage collector at start-up: paused while start-up builds what lasts as long as the
process, and that heap kept out of every later collection once it is built."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def building() -> Iterator[None]:
    """No collection while this lasts, then what was built frozen (kept out of every later
    collection). Importing the service makes modules, classes and schemas that are kept for
    good; the full collections their numbers set off walked all of them to free almost
    nothing (three full passes in `import bot.server` freed 74 objects), and at exit the
    interpreter walked them once more. Whole processes, alternating (issue 23, load 3 to 4):
    `import bot.server` 1.09 s of CPU against 1.84 (0.96 against 1.20 leaving by `os._exit`,
    the import alone). Whatever the caller had set comes back after."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def freeze() -> None:
    """Keep what start-up built (modules, Genkit's registry, pydantic's schemas) out of every
    later garbage collection. Each full collection walked all of it: under load that paused
    the event loop for 200 ms and more, and Slack's acknowledgements waited (bench/bot.py)."""
    gc.collect()
    gc.freeze()
