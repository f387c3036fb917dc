"""Redacted fields: the values a tool's policy hides (`redact:`), shown as their masks to
every reader, and whole to the tool alone.

A mask is `•••• (N characters)`. A leaf (no project imports). storage/domain.py `Request`
splits its input with `hide` as it is made: `Request.input` is the shown form, the one
every renderer, record and export reads (the card, the Home, the modals, the audit trail,
the API's JSON); the values hidden are `Request.secrets`, which only the call that runs
puts back (`reveal`, `Request.actual`).
A hidden value is named by its path ("password", "auth.password") and keeps a SHA-256, so
two requests can be compared without showing either.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

MASK = "••••"
# Free text (a quoted message, a preview, a tool's result) has a hidden value taken out
# where it appears whole; one this short would take out ordinary words and digits with it.
SCRUB_MIN = 4

Path = tuple[str | int, ...]


def masked(value: Any) -> str:
    """`•••• (8 characters)`: what is shown of a hidden value (text: its length; any other
    value: its JSON's)."""
    n = len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False))
    return f"{MASK} ({n:,} character{'' if n == 1 else 's'})"


def sha256(value: Any) -> str:
    """A hidden value's SHA-256 (text as UTF-8; any other value as compact, sorted JSON):
    equal values, equal digests."""
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    )
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Secret:
    """One hidden value, where it is in the input."""

    path: Path
    value: Any = field(repr=False)

    @property
    def name(self) -> str:
        """`auth.password`, as a card or the audit trail names it."""
        return ".".join(str(p) for p in self.path)

    @property
    def shown(self) -> str:
        return masked(self.value)

    @property
    def sha256(self) -> str:
        return sha256(self.value)

    def as_json(self) -> dict[str, Any]:
        return {"path": list(self.path), "value": self.value}

    @classmethod
    def of_json(cls, kept: Any) -> Secret:
        return cls(tuple(kept["path"]), kept["value"])


def hide(
    value: Any, fields: Collection[str], known: Sequence[Secret] = ()
) -> tuple[Any, tuple[Secret, ...]]:
    """`value` with every key named in `fields`, at any depth, showing its mask, and the
    values so hidden. A key that shows the mask of a `known` secret at its path (an input
    hidden before) keeps that secret."""
    before = {s.path: s for s in known}
    found: list[Secret] = []

    def walk(v: Any, path: Path) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, item in v.items():
                at = (*path, k)
                if k not in fields:
                    out[k] = walk(item, at)
                    continue
                old = before.get(at)
                secret = old if old is not None and item == old.shown else Secret(at, item)
                found.append(secret)
                out[k] = secret.shown
            return out
        if isinstance(v, list):
            return [walk(item, (*path, i)) for i, item in enumerate(v)]
        return v

    if not fields:
        return value, ()
    return walk(value, ()), tuple(found)


def _at(value: Any, path: Path) -> tuple[bool, Any]:
    for step in path:
        listed = isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value)
        if not (listed or (isinstance(value, dict) and step in value)):
            return False, None
        value = value[step]
    return True, value


def reveal(shown: Any, secrets: Sequence[Secret]) -> Any:
    """`shown` with each secret's value back where its mask is: the input the tool gets."""
    if not secrets:
        return shown
    out = copy.deepcopy(shown)
    for s in secrets:
        there, value = _at(out, s.path)
        if there and value == s.shown:
            _, parent = _at(out, s.path[:-1])
            parent[s.path[-1]] = s.value
    return out


def tampered(shown: Any, fields: Collection[str], secrets: Sequence[Secret]) -> list[str]:
    """The hidden fields a changed input (in its shown form) does not keep exactly: a
    mask changed or removed, or a field of that name added. An approver never edits one."""
    wrong = [s.name for s in secrets if _at(shown, s.path) != (True, s.shown)]
    paths = {s.path for s in secrets}
    wrong += [".".join(map(str, p)) for p in _named(shown, fields, ()) if p not in paths]
    return list(dict.fromkeys(wrong))


def _named(value: Any, fields: Collection[str], path: Path) -> Iterator[Path]:
    if isinstance(value, dict):
        for k, item in value.items():
            if k in fields:
                yield (*path, k)
            else:
                yield from _named(item, fields, (*path, k))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _named(item, fields, (*path, i))


def _needles(secrets: Sequence[Secret]) -> list[tuple[str, str]]:
    """(text to take out, its mask), longest first: each hidden text or number as written,
    and as JSON writes it inside a string."""
    out: dict[str, str] = {}
    for s in secrets:
        v = s.value
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            continue
        text = v if isinstance(v, str) else str(v)
        for form in (text, json.dumps(text, ensure_ascii=False)[1:-1]):
            if len(form) >= SCRUB_MIN:
                out.setdefault(form, s.shown)
    return sorted(out.items(), key=lambda pair: -len(pair[0]))


def scrub(text: str, secrets: Sequence[Secret]) -> str:
    """Free text with every hidden value in it shown as its mask."""
    for needle, mask in _needles(secrets):
        text = text.replace(needle, mask)
    return text


def scrubbed(value: Any, fields: Collection[str], secrets: Sequence[Secret]) -> Any:
    """Any JSON value (a tool's call or result in the conversation, a recorded output) as a
    reader is shown it: keys named in `fields` masked, hidden values taken out of text."""
    shown, _ = hide(value, fields)
    needles = _needles(secrets)
    if not needles:
        return shown

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            for needle, mask in needles:
                v = v.replace(needle, mask)
            return v
        if isinstance(v, dict):
            return {k: walk(item) for k, item in v.items()}
        if isinstance(v, list):
            return [walk(item) for item in v]
        return v

    return walk(shown)
