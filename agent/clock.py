"""The real clock and id source, which the composition roots (the service, the demo, the
CLIs) inject. Apart from agent/assemble, so a command that needs no agent (`greenlight
keys`) does not import Genkit to get them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_uuid() -> str:
    return str(uuid.uuid4())
