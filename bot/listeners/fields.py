"""Checks for the payload fields listeners read: Bolt hands payloads on as they came.

Slack's ids are short upper-case letters and digits, and a message ts is digits, a dot and
digits. Anything else (another type, a NUL byte, a megabyte) is refused here, before it can
reach the database, whose id columns hold 32 characters and no NUL.
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

SLACK_ID = re.compile(r"[A-Z0-9]{1,32}")  # team, enterprise, user and channel ids
MESSAGE_TS = re.compile(r"[0-9]{1,16}\.[0-9]{1,15}")


def obj(value: object) -> dict[str, Any]:
    """A field that should be an object; {} when it is anything else."""
    return value if isinstance(value, dict) else {}


def slack_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and SLACK_ID.fullmatch(value) is not None


def message_ts(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and MESSAGE_TS.fullmatch(value) is not None
