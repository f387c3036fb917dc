"""Block Kit primitives that the cards, modals, messages and the Home share.

Blocks, buttons, mentions, dates, quotes and values shown in a line, each clipped to
Slack's limits. Text goes out `verbatim`, so Slack links nothing it finds in it by itself;
only ids that look like Slack ids become mentions, and only https URLs become links.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from bot.safe_text import ELLIPSIS, MARKUP, clip, escape, fit, safe_cut
from storage.domain import Said

Block = dict[str, Any]
Message = dict[str, Any]

SECTION_MAX = 3000
HEADER_MAX = 150
KEY_MAX = 100  # a field is KEY_MAX + VALUE_MAX + 4 chars, well under Slack's 2000
QUOTE_MAX = 2000  # escaped characters of a quote on a card (one per section)
QUOTE_LINES = 12
ANSWER_MAX = 2000  # characters of an answer quoted on its card

_USER = re.compile(r"[UW][A-Z0-9]{1,30}")
_CHANNEL = re.compile(r"[CG][A-Z0-9]{1,30}")
_URL = re.compile(r"https://[^\s<>|]{1,500}")


def json_head(value: Any, limit: int, indent: int | None = None) -> str:
    """The first `limit`+ chars of `value` as JSON, without serialising all of a huge value."""
    enc = json.JSONEncoder(indent=indent, ensure_ascii=False, default=str)
    parts: list[str] = []
    size = 0
    for chunk in enc.iterencode(value):
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return "".join(parts)


def show(value: Any, limit: int) -> str:
    """A value as a person reads it: strings bare, everything else as compact JSON."""
    return value[: limit + 1] if isinstance(value, str) else json_head(value, limit)


def mention(user_id: str | None) -> str:
    """A user mention for real Slack ids only; anything else is shown as escaped text."""
    if not user_id:
        return "someone"
    return f"<@{user_id}>" if _USER.fullmatch(user_id) else escape(user_id)


def channel_mention(channel_id: str | None) -> str:
    if channel_id and _CHANNEL.fullmatch(channel_id):
        return f"<#{channel_id}>"
    return "the approvals channel"


def link(url: str | None, label: str) -> str:
    return f"<{url.replace('&', '&amp;')}|{label}>" if url and _URL.fullmatch(url) else ""


def utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def date(dt: datetime) -> str:
    """Slack shows this in each reader's own time zone; the fallback is UTC."""
    u = utc(dt)
    fallback = u.strftime("%Y-%m-%dT%H:%MZ")
    return f"<!date^{int(u.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>"


def code(text: str) -> str:
    """Inline code for a tool name (never contains a backtick or control character)."""
    return "`" + fit(text.replace("`", "'"), KEY_MAX)[0] + "`"


def mrkdwn(text: str) -> Block:
    """Our markup around escaped text; `verbatim`: Slack auto-links nothing in it."""
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def section(text: str) -> Block:
    return {"type": "section", "text": mrkdwn(clip(text, SECTION_MAX))}


def context(text: str) -> Block:
    return {"type": "context", "elements": [mrkdwn(clip(text, SECTION_MAX))]}


def button(label: str, action_id: str, value: str, style: str | None = None) -> Block:
    element = {
        "type": "button",
        "text": {"type": "plain_text", "text": label},
        "action_id": action_id,
        "value": value,
    }
    return element | ({"style": style} if style else {})


def overflow(action_id: str, options: list[tuple[str, str]]) -> Block:
    """A ⋯ menu of (label, value) options: a click sends the chosen option's value."""
    return {
        "type": "overflow",
        "action_id": action_id,
        "options": [
            {"text": {"type": "plain_text", "text": label}, "value": value}
            for label, value in options
        ],
    }


def text_message(text: str) -> Message:
    """A message of escaped text: `text` for notifications, the same in verbatim sections."""
    return {"text": text, "blocks": [section(chunk) for chunk in chunks(text, SECTION_MAX)]}


def chunks(escaped: str, size: int) -> list[str]:
    """Escaped text in pieces of at most `size`, cut at a line or a space where one is near,
    never inside an escape."""
    pieces = []
    while len(escaped) > size:
        space = max(escaped.rfind("\n", size // 2, size), escaped.rfind(" ", size // 2, size))
        cut = space + 1 if space > 0 else safe_cut(escaped, size)  # nothing is dropped
        pieces.append(escaped[:cut])
        escaped = escaped[cut:]
    return [*pieces, escaped]


def quote(said: Said) -> str:
    """Someone's words, escaped, as a block quote; a shortened one says how long it was."""
    body, cut = fit(said.text, QUOTE_MAX)
    lines = body.splitlines() or [""]
    if len(lines) > QUOTE_LINES:  # each line costs a quote mark: the rest share the last
        lines = [*lines[: QUOTE_LINES - 1], " ".join(lines[QUOTE_LINES - 1 :])]
    if cut or said.length > len(said.text):
        lines[-1] += f" _(shortened: {said.length:,} characters in all)_"
    return "\n".join(f"&gt; {line}" for line in lines)


def said_of(answer: Any) -> Said:
    """An answer (text, or a form's values) as words to quote, its whole length kept."""
    text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
    return Said(text[:ANSWER_MAX], length=len(text))


def summary(data: Mapping[str, Any], limit: int = 120) -> str:
    """A one-line taste of the input for the requester, e.g. `to: bob, amount: 12`; as
    inline code when it holds markup (with `'` for a backtick), so no value restyles it."""
    parts = []
    for key, value in list(data.items())[:5]:
        v = " ".join(show(value, 40).split())
        parts.append(f"{' '.join(str(key).split())}: {v if len(v) <= 40 else v[:39] + ELLIPSIS}")
    taste = fit(", ".join(parts) + (", …" if len(data) > 5 else ""), limit)[0]
    return "`" + taste.replace("`", "'") + "`" if MARKUP.search(taste) else taste
