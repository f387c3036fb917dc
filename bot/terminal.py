"""A card as a person reads it in a terminal (the offline demo): Slack's markup undone."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_DATE = re.compile(r"<!date\^\d+\^[^|>]*\|([^>]*)>")
_LINK = re.compile(r"<(https?://[^|>]+)\|([^>]*)>")
_MENTION = re.compile(r"<([@#])([A-Z0-9]+)>")


def _plain(text: str) -> str:
    """Undo Slack markup for a terminal: dates, links, mentions, bold, escapes."""
    text = _DATE.sub(r"\1", text)
    text = _LINK.sub(lambda m: f"{m[2]} ({m[1].replace('&amp;', '&')})", text)
    text = _MENTION.sub(r"\1\2", text)
    text = re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"\1", text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def card_as_text(card: Mapping[str, Any]) -> str:
    """A card as a person reads it, for terminals (the offline demo)."""
    out: list[str] = []
    for block in card.get("blocks", []):
        kind = block.get("type")
        if kind == "header":
            title = _plain(block["text"]["text"])
            out += [title, "=" * min(len(title), 60)]
        elif kind == "section":
            if "text" in block:
                out.append(_plain(block["text"]["text"]))
            out += [_plain(f["text"]).replace("\n", ": ", 1) for f in block.get("fields", [])]
        elif kind == "context":
            out.append(" · ".join(_plain(e.get("text", "")) for e in block["elements"]))
        elif kind == "actions":
            buttons = [e for e in block["elements"] if e.get("type") == "button"]
            out.append("  ".join(f"[ {e['text']['text']} ]" for e in buttons))
        elif kind == "divider":
            out.append("-" * 40)
    return "\n".join(out)
