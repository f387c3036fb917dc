"""Logging: one line per event on stderr, as text or as JSON (LOG_FORMAT).

JSON lines are python-json-logger's: time, level, logger, message, the exception's traceback
as `exception` when there is one, and the ids a log call passes in `extra=` (turn_id,
approval_id, conversation_id), so a log search finds everything about one approval.
"""

from __future__ import annotations

import logging
from typing import Literal

LogFormat = Literal["text", "json"]
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str, fmt: LogFormat = "text") -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter  # ~35 ms, for LOG_FORMAT=json only

        handler.setFormatter(
            JsonFormatter(
                "%(levelname)s %(name)s %(message)s",
                timestamp="time",  # ISO 8601, UTC
                rename_fields={
                    "levelname": "level",
                    "name": "logger",
                    "exc_info": "exception",
                },
            )
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # Alembic (1.18 and later) logs each of its seven built-in plugins at INFO as it is
    # imported: nothing an operator can act on, on every start. Its own logs stay.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
