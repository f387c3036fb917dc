"""Untrusted text made safe to show in Slack: escaped, hidden characters revealed,
look-alikes flagged, clipped.

Everything untrusted (tool input, model output, user text, reasons) goes through `escape`
so it can never ping (`<!channel>`, `<@U…>`) or forge links, with every hidden character
(controls, bidirectional overrides, zero-width and other invisible code points) shown as a
visible escape.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

ELLIPSIS = "…"

# Code points a reader cannot see, or that change how what follows them is shown: controls
# (but the line break), format characters (bidirectional overrides and isolates, zero-width
# spaces and joiners, the byte-order mark, tags), separators other than the plain space,
# invisible letters and fillers, variation selectors, private use, lone surrogates.
HIDDEN = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u00a0\u00ad\u034f\u061c\u115f\u1160\u1680"
    "\u17b4\u17b5\u180b-\u180f\u2000-\u200f\u2028-\u202f\u205f-\u206f\u2800\u3000"
    "\u3164\ud800-\udfff\ue000-\uf8ff\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb"
    "\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff\U000f0000-\U0010ffff]"
)
_WORD = re.compile(r"\w+")
_LOOKALIKE_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK")


def reveal(text: str) -> str:
    """Hidden characters as visible escapes: 1234, U+202E, 98765 is shown `1234\\u202e98765`,
    not as 123456789."""
    return HIDDEN.sub(_visible, text)


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def has_hidden(text: str) -> bool:
    return HIDDEN.search(text) is not None


def mixes_scripts(text: str) -> bool:
    """Whether a word mixes Latin, Cyrillic and Greek letters (paypal with a Cyrillic a)."""
    for word in _WORD.findall(text):
        if word.isascii():
            continue
        scripts = {
            name.split(" ", 1)[0]
            for ch in word
            if ch.isalpha() and (name := unicodedata.name(ch, "")).startswith(_LOOKALIKE_SCRIPTS)
        }
        if len(scripts) > 1:
            return True
    return False


def looks_latin(text: str) -> bool:
    """Whether a word is written wholly in letters of another alphabet that look like Latin
    ones (EXT999 spelt with Cyrillic letters): each letter one that Unicode's confusables
    list gives a plain ASCII look-alike. Ordinary Russian or Greek words have letters with
    none (Москва, Ελλάδα), so they are not flagged."""
    from confusable_homoglyphs import confusables  # its tables load on first use

    for word in _WORD.findall(text):
        if word.isascii():
            continue
        found = confusables.is_confusable(word, greedy=True, preferred_aliases=["latin"]) or []
        ascii_twin = {
            f["character"]
            for f in found
            if any(
                len(h["c"]) == 1 and h["c"].isascii() and h["c"].isalnum() for h in f["homoglyphs"]
            )
        }
        if all(ch.isascii() or ch in ascii_twin for ch in word):
            return True
    return False


def _strings(value: Any) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def warnings(key: str, value: Any) -> list[str]:
    """What a reader of this field should know that the text alone would hide from them."""
    found = []
    texts = [key, *_strings(value)]
    if any(has_hidden(t) for t in texts):
        found.append("⚠️ _contains hidden characters (shown as \\u…)_")
    if any(mixes_scripts(t) for t in texts):
        found.append("⚠️ _mixes alphabets in one word (look-alike letters)_")
    elif any(looks_latin(t) for t in texts):
        found.append(
            "⚠️ _a word in another alphabet's letters that look Latin (look-alike letters)_"
        )
    return found


def escape(text: str) -> str:
    """Neutralise Slack's control characters (mentions and links then render as plain text)
    and show hidden characters."""
    return reveal(text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))


# A URL or something Slack would link as one: scheme://…, www.…, a domain with a path, or
# a bare domain (`evil.example`: a name ending in two letters or more).
_LINKISH = re.compile(
    r"\S*(?:://|www\.)\S*|[\w-]+(?:\.[\w-]+)+/\S*|[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}(?![\w-])"
)
# A markdown link, `[text](target)`: shown as its text and its target, the target inert.
MARKDOWN_LINK = re.compile(r"\[([^\]\n]*)\]\(([^)\s]*)\)")


def inert_links(escaped: str) -> str:
    """Streamed markdown has no `verbatim` and no unfurl switch: a URL the model writes
    (perhaps injected, for Slack's unfurler to fetch with data in its query), a bare domain
    or a markdown link's target goes out as code, which Slack neither links nor unfurls."""
    unlinked = MARKDOWN_LINK.sub(lambda m: f"{m.group(1)} ({m.group(2)})", escaped)
    return _LINKISH.sub(lambda m: "`" + m.group(0).replace("`", "'") + "`", unlinked)


def clip(escaped: str, limit: int) -> str:
    """Shorten already-escaped text to `limit` chars, marked, cutting no escape in half."""
    if len(escaped) <= limit:
        return escaped
    return escaped[: safe_cut(escaped, limit - len(ELLIPSIS))] + ELLIPSIS


def safe_cut(escaped: str, cut: int) -> int:
    """`cut`, or earlier so that no `&amp;` or `\\u202e` is cut in half."""
    amp = escaped.rfind("&", max(0, cut - 4), cut)
    if amp != -1 and ";" not in escaped[amp:cut]:
        cut = amp
    for mark, length in (("\\u", 6), ("\\U", 10)):
        at = escaped.rfind(mark, max(0, cut - length + 1), cut)
        if at != -1 and at + length > cut:
            cut = at
    return cut


def fit(raw: str, limit: int) -> tuple[str, bool]:
    """Escape and clip; cheap on huge input because escaping never shortens text."""
    out = escape(raw[: limit + 1])
    return clip(out, limit), len(out) > limit


def no_fence(text: str) -> str:
    """Keep untrusted text from closing our ``` code block early."""
    return text.replace("```", "``\u200b`")


# What lets a value restyle itself in mrkdwn: bold, italics, strike-through, code, a line of
# its own (a forged field) or a block quote (`>`, escaped, at its start).
MARKUP = re.compile(r"[*_~`\n]|^\s*&gt;")


def inert(escaped: str) -> str:
    """An escaped value as it is, or as a code block when it holds markup: Slack formats
    nothing inside one, so the value reads as written and cannot pass for the card's own."""
    if not MARKUP.search(escaped):
        return escaped
    return f"```\n{no_fence(escaped)}\n```"
