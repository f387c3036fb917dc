"""A tool's policy and its rules, defined once: as POLICY_FILE writes them and storage keeps them.

A leaf (pydantic only): agent/policy_file.py reads the file into these types,
agent/policy.py evaluates them (the effective `Policy` of one call), storage/policies.py
keeps a `StoredPolicy` in a row. Each field's name, type and check are written here and
nowhere else.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

DURATION = re.compile(r"^(\d{1,6})([smhd])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
CHANNEL = re.compile(r"^[CG][A-Z0-9]{2,}$")
PRINCIPAL = re.compile(r"^[UWS][A-Z0-9]{2,}$")  # a user (U, W) or a user group (S)


def duration(value: object) -> timedelta:
    """`45s`, `15m`, `4h`, `2d` (or a timedelta, as an admin's command gives it)."""
    if isinstance(value, timedelta):
        return value
    match = DURATION.match(str(value).strip()) if isinstance(value, str | int) else None
    if match is None:
        raise ValueError(f"{value!r} is not a duration such as 45s, 15m, 4h or 2d")
    return timedelta(**{UNITS[match.group(2)]: int(match.group(1))})


def _channel(value: object) -> str:
    if not (isinstance(value, str) and CHANNEL.match(value)):
        raise ValueError(f"{value!r} is not a channel ID such as C0123ABCD")
    return value


def _principals(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError("must be a list of user and user group IDs")
    bad = [v for v in value if not (isinstance(v, str) and PRINCIPAL.match(v))]
    if bad:
        raise ValueError(f"not user (U…) or user group (S…) IDs: {bad}")
    users, groups = split_principals(value)
    return (*users, *groups)  # as storage keeps them: users, then groups


def split_principals(ids: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(users, user groups) of a list of both: groups' ids start with S."""
    return tuple(i for i in ids if not i.startswith("S")), tuple(
        i for i in ids if i.startswith("S")
    )


Duration = Annotated[timedelta, BeforeValidator(duration)]
Channel = Annotated[str, BeforeValidator(_channel)]
Principals = Annotated[tuple[str, ...], BeforeValidator(_principals)]
Quorum = Annotated[int, Field(ge=1, le=20)]
STANDING_MAX = timedelta(hours=24)


def _standing(value: object) -> timedelta:
    span = duration(value)
    if not timedelta(0) < span <= STANDING_MAX:
        raise ValueError(f"{value!r}: a standing approval lasts at most 24h")
    return span


StandingSpan = Annotated[timedelta, BeforeValidator(_standing)]
FIELD = re.compile(r"^[A-Za-z0-9_$@-]{1,128}$")  # a key as written: no dots, no paths


def _fields(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError("must be a list of field names, e.g. [password, apiToken]")
    bad = [v for v in value if not (isinstance(v, str) and FIELD.match(v))]
    if bad:
        raise ValueError(f"not field names (a key of the tool's input, at any depth): {bad}")
    if len(value) > 50:
        raise ValueError("at most 50 fields")
    return tuple(dict.fromkeys(value))


Fields = Annotated[tuple[str, ...], BeforeValidator(_fields)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rule(Strict):
    """`when` a call matches (a CEL expression over `args`, `tool` and `requester`), what
    changes for it; None: unchanged. First match wins; `name` is how cards,
    `/approvals explain` and `greenlight policy test` refer to it."""

    name: Annotated[str, Field(min_length=1, max_length=80)] | None = None
    when: str
    allow: bool | None = None
    approvals: Quorum | None = None
    channel: Channel | None = None
    approvers: Principals | None = None
    timeout: Duration | None = None

    def label(self, number: int) -> str:
        """`rule 2 (large transfers)`: how cards and replies name it."""
        return f"rule {number} ({self.name})" if self.name else f"rule {number}"


class ToolPolicy(Strict):
    """A tool's policy, as POLICY_FILE's `tools.<tool>` writes it (agent/policy_file.py
    `ToolSpec`) and storage keeps it (`StoredPolicy`): where a call's request goes, who
    decides, how many, how long it waits, its follow-ups, its rules."""

    channel: Channel | None = None
    approvers: Principals = ()
    approvals: Quorum | None = None
    timeout: Duration | None = None  # to decide (the approval's)
    remind_after: Duration | None = None
    escalate_after: Duration | None = None
    escalate_to: Channel | None = None
    escalate_approvers: Principals = ()
    rules: tuple[Rule, ...] = ()
    # "required": an Approve takes a note (the card's Approve opens a modal for it).
    note: Literal["required", "optional"] | None = None
    # Cards offer Approve for <standing>: later calls like the approved one run without a
    # card that long (storage/lifecycle.py GRANT, USE). Not with a quorum, nor a note.
    standing: StandingSpan | None = None
    # Keys of the tool's input (at any depth) whose values nobody is shown: cards, the Home,
    # the modals, the audit trail and the logs show `•••• (N characters)`; the tool gets
    # the value; no approver edits it (storage/redaction.py).
    redact: Fields = ()


class StoredPolicy(ToolPolicy):
    """A tool's policy as storage keeps it: what the file or an admin set, and whether the
    tool runs freely (`allowed`: POLICY_FILE's `allow`, `/approvals allow`). None and ()
    mean "the configured default"."""

    tool: str
    allowed: bool = False


# The fields an admin or the policy file may change.
CHANGEABLE = ("allowed", *ToolPolicy.model_fields)
