"""Slack messages as data: pure functions from workflow facts to Block Kit payloads.

Everything untrusted (tool input, model output, user text, reasons) is escaped so it can never
ping (`<!channel>`, `<@U…>`) or forge links, with every hidden character (controls,
bidirectional overrides, zero-width and other invisible code points) shown as a visible
escape, and clipped so Slack never rejects a message for length. Text goes out `verbatim`, so
Slack links nothing it finds in it by itself. Only ids that look like Slack ids become
mentions.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from agent.context import Line
from storage.domain import (
    Answered,
    Approval,
    Approved,
    Denied,
    Expired,
    Finished,
    History,
    NotStarted,
    Request,
    Said,
    Source,
    Started,
)

if TYPE_CHECKING:
    from agent.outcomes import Busy

Block = dict[str, Any]
Message = dict[str, Any]

SECTION_MAX = 3000
FIELDS_MAX = 10
HEADER_MAX = 150
KEY_MAX = 100  # a field is KEY_MAX + VALUE_MAX + 4 chars, well under Slack's 2000
VALUE_MAX = 300  # enough to read at a glance; the full JSON follows when a value is longer
REPLY_MAX = 39000
ELLIPSIS = "…"
UNKNOWN_OUTCOME = (
    "⚠️ Outcome unknown: the call started but its result was never recorded. "
    "It was not run again — check whether it took effect."
)

_USER = re.compile(r"[UW][A-Z0-9]{1,30}")
_CHANNEL = re.compile(r"[CG][A-Z0-9]{1,30}")
_URL = re.compile(r"https://[^\s<>|]{1,500}")


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


def _clip(escaped: str, limit: int) -> str:
    """Shorten already-escaped text to `limit` chars, marked, cutting no escape in half."""
    if len(escaped) <= limit:
        return escaped
    return escaped[: _safe_cut(escaped, limit - len(ELLIPSIS))] + ELLIPSIS


def _safe_cut(escaped: str, cut: int) -> int:
    """`cut`, or earlier so that no `&amp;` or `\\u202e` is cut in half."""
    amp = escaped.rfind("&", max(0, cut - 4), cut)
    if amp != -1 and ";" not in escaped[amp:cut]:
        cut = amp
    for mark, length in (("\\u", 6), ("\\U", 10)):
        at = escaped.rfind(mark, max(0, cut - length + 1), cut)
        if at != -1 and at + length > cut:
            cut = at
    return cut


def _fit(raw: str, limit: int) -> tuple[str, bool]:
    """Escape and clip; cheap on huge input because escaping never shortens text."""
    out = escape(raw[: limit + 1])
    return _clip(out, limit), len(out) > limit


def _json_head(value: Any, limit: int, indent: int | None = None) -> str:
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


def _show(value: Any, limit: int) -> str:
    """A value as a person reads it: strings bare, everything else as compact JSON."""
    return value[: limit + 1] if isinstance(value, str) else _json_head(value, limit)


def _no_fence(text: str) -> str:
    """Keep untrusted text from closing our ``` code block early."""
    return text.replace("```", "``\u200b`")


# What lets a value restyle itself in mrkdwn: bold, italics, strike-through, code, a line of
# its own (a forged field) or a block quote (`>`, escaped, at its start).
_MARKUP = re.compile(r"[*_~`\n]|^\s*&gt;")


def _inert(escaped: str) -> str:
    """An escaped value as it is, or as a code block when it holds markup: Slack formats
    nothing inside one, so the value reads as written and cannot pass for the card's own."""
    if not _MARKUP.search(escaped):
        return escaped
    return f"```\n{_no_fence(escaped)}\n```"


def mention(user_id: str | None) -> str:
    """A user mention for real Slack ids only; anything else is shown as escaped text."""
    if not user_id:
        return "someone"
    return f"<@{user_id}>" if _USER.fullmatch(user_id) else escape(user_id)


def _channel(channel_id: str | None) -> str:
    if channel_id and _CHANNEL.fullmatch(channel_id):
        return f"<#{channel_id}>"
    return "the approvals channel"


def _link(url: str | None, label: str) -> str:
    return f"<{url.replace('&', '&amp;')}|{label}>" if url and _URL.fullmatch(url) else ""


def _utc(dt: datetime) -> datetime:
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def date(dt: datetime) -> str:
    """Slack shows this in each reader's own time zone; the fallback is UTC."""
    u = _utc(dt)
    fallback = u.strftime("%Y-%m-%dT%H:%MZ")
    return f"<!date^{int(u.timestamp())}^{{date_short_pretty}} at {{time}}|{fallback}>"


def _code(text: str) -> str:
    """Inline code for a tool name (never contains a backtick or control character)."""
    return "`" + _fit(text.replace("`", "'"), KEY_MAX)[0] + "`"


def _mrkdwn(text: str) -> Block:
    """Our markup around escaped text; `verbatim`: Slack auto-links nothing in it."""
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def _section(text: str) -> Block:
    return {"type": "section", "text": _mrkdwn(_clip(text, SECTION_MAX))}


def _context(text: str) -> Block:
    return {"type": "context", "elements": [_mrkdwn(_clip(text, SECTION_MAX))]}


def _text_message(text: str) -> Message:
    """A message of escaped text: `text` for notifications, the same in verbatim sections."""
    return {"text": text, "blocks": [_section(chunk) for chunk in _chunks(text, SECTION_MAX)]}


def _chunks(escaped: str, size: int) -> list[str]:
    """Escaped text in pieces of at most `size`, cut at a line or a space where one is near,
    never inside an escape."""
    chunks = []
    while len(escaped) > size:
        space = max(escaped.rfind("\n", size // 2, size), escaped.rfind(" ", size // 2, size))
        cut = space + 1 if space > 0 else _safe_cut(escaped, size)  # nothing is dropped
        chunks.append(escaped[:cut])
        escaped = escaped[cut:]
    return [*chunks, escaped]


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


def origin_notes(key: str, sources: Mapping[str, Source]) -> list[str]:
    """Where the values under `key` came from, when not from a human's message: a hint for
    the approver (prompt injection puts an attacker's values in tool results)."""
    notes = []
    for path, source in sources.items():
        if source.origin == "human" or not (path == key or path.startswith(f"{key}.")):
            continue
        where = "" if path == key else f"{_fit(path[len(key) + 1 :], KEY_MAX)[0]}: "
        if source.origin == "tool" and source.tool:
            what = f"from {_fit(source.tool, KEY_MAX)[0]}'s result"
        else:
            what = "not in the conversation"
        notes.append(f"🔎 _{where}{what}_")
    notes = list(dict.fromkeys(notes))
    return notes if len(notes) <= 3 else [*notes[:2], f"🔎 _…and {len(notes) - 2} more_"]


def _input_fields(
    data: Mapping[str, Any], sources: Mapping[str, Source]
) -> tuple[list[Block], bool]:
    """One field per top-level key (at most 10); True when anything had to be shortened."""
    items = list(data.items())
    shown = items if len(items) <= FIELDS_MAX else items[: FIELDS_MAX - 1]
    fields: list[Block] = []
    shortened = len(shown) < len(items)
    for key, value in shown:
        k, k_cut = _fit(str(key), KEY_MAX)
        v, v_cut = _fit(_show(value, VALUE_MAX), VALUE_MAX)
        v = _inert(v)
        shortened = shortened or k_cut or v_cut
        if v_cut:
            whole = len(value) if isinstance(value, str) else len(_json_head(value, 10**6))
            v += f" _(shortened: {whole:,} characters in all)_"
        notes = "".join(
            f"\n{w}" for w in (*warnings(str(key), value), *origin_notes(str(key), sources))
        )
        label = _inert(k) if _MARKUP.search(k) else f"*{k}*"
        fields.append(_mrkdwn(f"{label}\n{v or ' '}{notes}"))
    if len(shown) < len(items):
        fields.append(_mrkdwn(f"_…and {len(items) - len(shown)} more keys_"))
    return fields, shortened


def _full_input(data: Mapping[str, Any]) -> Block:
    """The whole input as JSON, for when the fields had to leave something out."""
    head, tail, note = "*Full input*\n```\n", "\n```", "\n_(truncated: too long to show here)_"
    body = _no_fence(escape(_json_head(dict(data), SECTION_MAX, indent=2)[: SECTION_MAX + 1]))
    budget = SECTION_MAX - len(head) - len(tail)
    if len(body) <= budget:
        return _section(head + body + tail)
    return _section(head + _clip(body, budget - len(note)) + tail + note)


QUOTE_MAX = 2000  # escaped characters of a quote on a card (one per section)
QUOTE_LINES = 12


def _quote(said: Said) -> str:
    """Someone's words, escaped, as a block quote; a shortened one says how long it was."""
    body, cut = _fit(said.text, QUOTE_MAX)
    lines = body.splitlines() or [""]
    if len(lines) > QUOTE_LINES:  # each line costs a quote mark: the rest share the last
        lines = [*lines[: QUOTE_LINES - 1], " ".join(lines[QUOTE_LINES - 1 :])]
    if cut or said.length > len(said.text):
        lines[-1] += f" _(shortened: {said.length:,} characters in all)_"
    return "\n".join(f"&gt; {line}" for line in lines)


UNQUOTED = (
    "_The conversation is not quoted here: this channel is public. "
    "Show conversation has it, for those who may decide._"
)


def request_sections(r: Request, quotes: bool = True) -> list[Block]:
    """What led to the call: the message that started the conversation, the last human
    message before the call, and the agent's words just before it, each labelled; in a
    public channel (`quotes` False), only a note that they are left out."""
    if not quotes:
        return [_context(UNQUOTED)]
    c = r.context
    said = [
        (c.first, f"*{mention(c.first.by if c.first else None)} asked:*"),
        (c.latest, f"*Then {mention(c.latest.by if c.latest else None)} wrote:*"),
        (c.agent, "*The agent said before the call:*"),
    ]
    return [_section(f"{label}\n{_quote(words)}") for words, label in said if words is not None]


def history_text(r: Request) -> str | None:
    """The requester's earlier requests for this tool, so an unusual one stands out."""
    h: History | None = r.context.history
    if h is None:
        return None
    counts = [(h.approved, "approved"), (h.denied, "denied"), (h.expired, "expired")]
    ended = ", ".join(f"{n} {label}" for n, label in counts if n) or "no requests"
    return (
        f"Earlier {_code(r.tool)} requests: {mention(r.requester)}: {ended} in the last "
        f"{h.days} days"
    )


def as_seen(a: Approval) -> str:
    """A decision button's value: the approval, and the version it shows (so a click on a
    view drawn before a change decides nothing it did not show)."""
    return f"{a.id}~{a.version}"


def edit_text(a: Approval) -> str:
    """An approver's changes: each field, struck through and replaced."""
    assert a.edit is not None
    lines = []
    changes = a.edit.changes(a.request.input)
    for key, change in list(changes.items())[:20]:
        old, new = (_fit(_show(change[k], 200), 200)[0] for k in ("from", "to"))
        was = f"~{old}~" if change["from"] is not None else "_(none)_"
        now = new if change["to"] is not None else "_(removed)_"
        lines.append(f"• *{_fit(str(key), KEY_MAX)[0]}*: {was} → {now}")
    who = f"✏️ *Changed by {mention(a.edit.by)}* at {date(a.edit.at)} (version {a.version})"
    if not changes:
        return f"{who}: back to the call as the agent asked it; the arguments above are it"
    what = "the call runs with the arguments above, changed from what the agent asked"
    return f"{who}: {what}:\n" + "\n".join(lines)


def quorum_text(a: Approval) -> str:
    """How far a request that needs several approvers got: '1 of 2 approvals: @alice'."""
    needed = a.request.approvals_needed
    who = ", ".join(mention(v.by) for v in a.votes) or "none yet"
    return f"*{len(a.votes)} of {needed} approvals:* {who}"


def decision_text(a: Approval) -> str:
    """The card's closing line once the request is no longer pending."""
    match a.decision:
        case Approved(by=by, at=at):
            voters = [v.by for v in a.votes] or [by]
            line = f"✅ Approved by {' and '.join(mention(v) for v in voters)} at {date(at)}"
            if isinstance(a.execution, Finished):
                line += "\nRan."
            elif isinstance(a.execution, Started):
                line += "\n" + UNKNOWN_OUTCOME
            return line
        case Denied(by=by, at=at, reason=reason):
            why = f": {_fit(reason, 1000)[0]}" if reason else ""
            return f"❌ Denied by {mention(by)} at {date(at)}{why}"
        case Expired(at=at):
            if a.request.question:
                return f"⌛ Expired at {date(at)} — nobody answered; the agent was told"
            return f"⌛ Expired at {date(at)} — the request was denied automatically"
        case Answered(by=by, at=at, answer=answer):
            return f"💬 Answered by {mention(by)} at {date(at)}:\n{_quote(_said(answer))}"
        case None:
            return "Waiting for a decision."


def approval_card(
    a: Approval,
    *,
    description: str,
    thread_link: str | None,
    now: datetime,
    editable: bool = True,
    note: str = "",
    quotes: bool = True,
) -> Message:
    """The approvers' card: what, who, why, until when; buttons only while still pending.

    `description`: the tool's own, so the approver knows what the call does; `editable`:
    its input has a schema to edit it by (Edit & approve); `note`: where the tool comes from
    (an MCP server's, with the server's read-only / destructive hint).
    """
    r = a.request
    pending = a.decision is None
    title = "Approval needed" if pending else a.state.value.capitalize()
    header = _fit(f"{title}: {r.tool}", HEADER_MAX)[0]
    who = f"*Requested by* {mention(r.requester)}"
    if others := [p for p in dict.fromkeys(r.participants) if p != r.requester][:20]:
        who += f"  ·  also in the conversation: {', '.join(mention(p) for p in others)}"
    if link := _link(thread_link, "View the conversation"):
        who += f"  ·  {link}"
    if (via := r.context.via) is not None:
        who += f"  ·  through key `{escape(via.key)}`"
        if via.client:
            who += f"  ·  MCP client `{escape(via.client)}`"
    blocks: list[Block] = [
        {"type": "header", "text": {"type": "plain_text", "text": header}},
        _section(who + (f"\n{_fit(description, 2000)[0]}" if description else "")),
    ]
    if via is not None and via.gone:
        gone = "⚠️ The caller went away while this waited: nothing will run"
        ran = isinstance(a.execution, NotStarted)
        blocks.append(_context(gone + (" (the result has nowhere to go)." if ran else ".")))
    if note:
        blocks.append(_context(escape(note)))
    blocks += request_sections(r, quotes)
    # The current version, whole: an edit is shown with the same care as the agent's call.
    v = a.current
    fields, shortened = _input_fields(v.input, v.sources)
    blocks.append({"type": "section", "fields": fields} if fields else _section("_No input._"))
    if shortened:
        blocks.append(_full_input(v.input))
    preview, preview_cut = _preview(v.preview)
    if history := history_text(r):
        blocks.append(_context(history))
    shows = [_button("Show conversation", "show_conversation", a.id)]
    if shortened or preview_cut:
        shows.append(_button("Show full request", "show_request", a.id))
    blocks.append({"type": "actions", "block_id": "request", "elements": shows})
    if a.edit is not None:
        blocks.append(_section(edit_text(a)))
    if r.approvals_needed > 1:
        blocks.append(_section(quorum_text(a)))
    if pending and a.escalated and a.escalation is not None:
        where = _channel(a.escalation.channel)
        blocks.append(_context(f"⏫ Escalated to {where}: people there may decide too"))
    if preview is not None:
        blocks.append(preview)
    if r.why:
        blocks.append(_section(f"*Why approval is needed:* {_fit(r.why, 2000)[0]}"))
    if pending:
        verb = "Expired" if _utc(now) >= _utc(r.expires_at) else "Expires"
        blocks.append(_context(f"Requested {date(r.requested_at)}  ·  {verb} {date(r.expires_at)}"))
        blocks.append(
            {
                "type": "actions",
                "block_id": "approval",
                "elements": [
                    _button("Approve", "approve", as_seen(a), "primary"),
                    *([_button("Edit & approve", "edit_approve", as_seen(a))] * editable),
                    _button("Deny", "deny", as_seen(a), "danger"),
                ],
            }
        )
    else:
        blocks.append(_section(decision_text(a)))
    return {"text": f"{title}: {escape(r.tool)}", "blocks": blocks}


ANSWER_MAX = 2000  # characters of an answer quoted on its card


def _said(answer: Any) -> Said:
    text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
    return Said(text[:ANSWER_MAX], length=len(text))


def question_card(
    a: Approval, *, description: str, thread_link: str | None, now: datetime, quotes: bool = True
) -> Message:
    """A question the agent asks (askHuman, or an interrupt a tool defines): what it asks,
    of whom, why; an Answer button while it waits. A question to the requester is posted in
    their thread; one to the approvers goes to their channel with the same context as an
    approval card."""
    r = a.request
    pending = a.decision is None
    question = r.input.get("question") if isinstance(r.input.get("question"), str) else None
    title = "Question" if r.tool == "askHuman" else f"Question: {r.tool}"
    blocks: list[Block] = [
        {"type": "header", "text": {"type": "plain_text", "text": _fit(title, HEADER_MAX)[0]}}
    ]
    if r.asks == "requester":
        blocks.append(_section(f"{mention(r.requester)}, the agent asks you:"))
    else:
        who = f"The agent asks the approvers, for {mention(r.requester)}"
        if link := _link(thread_link, "View the conversation"):
            who += f"  ·  {link}"
        blocks.append(_section(who + (f"\n{_fit(description, 2000)[0]}" if description else "")))
        blocks += request_sections(r, quotes)
    if question is not None:
        blocks.append(_section(_quote(_said(question))))
    else:  # a tool's own interrupt: what it says, and its input
        blocks.append(_section(f"*{_fit(r.why, 2000)[0]}*"))
        fields, shortened = _input_fields(r.input, r.context.sources)
        blocks.append({"type": "section", "fields": fields} if fields else _section("_No input._"))
        if shortened:
            blocks.append(_full_input(r.input))
    if pending:
        how = "Reply in this thread, or click Answer." if r.asks == "requester" else "Click Answer."
        blocks.append(_context(f"{how}  ·  Expires {date(r.expires_at)}"))
        elements = [_button("Answer", "answer", a.id, "primary")]
        if r.asks != "requester":
            elements.append(_button("Show conversation", "show_conversation", a.id))
        blocks.append({"type": "actions", "block_id": "question", "elements": elements})
    else:
        blocks.append(_section(decision_text(a)))
    return {"text": f"{title}: {escape(question or r.tool)[:200]}", "blocks": blocks}


def answer_modal(a: Approval, form: list[Block] | None) -> dict[str, Any]:
    """The answer to a question: free text, or the form its tool gives (bot/forms.py)."""
    r = a.request
    asks = r.input.get("question") if isinstance(r.input.get("question"), str) else r.tool
    inputs = form or [
        {
            "type": "input",
            "block_id": "answer",
            "label": {"type": "plain_text", "text": "Your answer"},
            "element": {
                "type": "plain_text_input",
                "action_id": "value",
                "multiline": True,
                "max_length": 3000,
            },
        }
    ]
    return {
        "type": "modal",
        "callback_id": "answer",
        "title": {"type": "plain_text", "text": "Answer the agent"},
        "submit": {"type": "plain_text", "text": "Answer"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [_section(_quote(_said(asks))), *inputs],
    }


PREVIEW_SHOWN = 2500  # characters of a many-line preview (a file's diff) on the card


def _preview(text: str | None) -> tuple[Block | None, bool]:
    """The tool's preview of the call: a line, or many (a diff) in a code block; and whether
    the card had to shorten it (Show full request then has it whole)."""
    if text is None:
        return None, False
    if text == "":
        return _context("_Preview unavailable: it failed or took longer than 2 s._"), False
    if "\n" not in text.strip():
        return _section(f"*Preview:* {_fit(text, 1000)[0]}"), False
    body, cut = _fit(text, PREVIEW_SHOWN)
    note = f"\n_(shortened: {len(text):,} characters in all)_" if cut else ""
    return _section(f"*Preview:*\n```\n{_no_fence(body)}\n```{note}"), cut


def _button(label: str, action_id: str, value: str, style: str | None = None) -> Block:
    button = {
        "type": "button",
        "text": {"type": "plain_text", "text": label},
        "action_id": action_id,
        "value": value,
    }
    return button | ({"style": style} if style else {})


def _summary(data: Mapping[str, Any], limit: int = 120) -> str:
    """A one-line taste of the input for the requester, e.g. `to: bob, amount: 12`; as
    inline code when it holds markup (with `'` for a backtick), so no value restyles it."""
    parts = []
    for key, value in list(data.items())[:5]:
        v = " ".join(_show(value, 40).split())
        parts.append(f"{' '.join(str(key).split())}: {v if len(v) <= 40 else v[:39] + ELLIPSIS}")
    taste = _fit(", ".join(parts) + (", …" if len(data) > 5 else ""), limit)[0]
    return "`" + taste.replace("`", "'") + "`" if _MARKUP.search(taste) else taste


def requester_note(
    approvals: Approval | Sequence[Approval],
    *,
    card_link: str | None = None,
    card_links: Sequence[str | None] = (),
) -> Message:
    """Tell the requester, in their thread, what the agent waits for and where to look.

    Takes one approval (with `card_link`) or all a turn stopped on (`card_links` in order).
    """
    every = [approvals] if isinstance(approvals, Approval) else list(approvals)
    links = [card_link] if isinstance(approvals, Approval) else list(card_links)
    asked = [a for a in every if a.request.question]
    if asked:
        return _question_note(asked, [a for a in every if not a.request.question])
    many = every
    where = " and ".join(
        dict.fromkeys(_channel(a.card.channel if a.card else None) for a in many[:20])
    )
    items = []
    for i, a in enumerate(many[:20]):
        url = links[i] if i < len(links) else None
        summary = f" ({s})" if (s := _summary(a.request.input)) else ""
        link = _link(url, "see the request")
        items.append((f"{_code(a.request.tool)}{summary}", f" ({link})" if link else ""))
    if len(items) == 1:
        (what, link), done = items[0], "I'll continue here once someone decides."
        return _text_message(f"I need approval to run {what}. I've asked in {where}{link} — {done}")
    lines = "".join(f"\n• {what}{link}" for what, link in items)
    more = f"\n…and {len(many) - 20} more" if len(many) > 20 else ""
    done = "I'll continue here once they're decided."
    text = f"I need approval for {len(many)} actions:{lines}{more}"
    return _text_message(f"{text}\nI've asked in {where or _channel(None)} — {done}")


def _question_note(asked: Sequence[Approval], approvals: Sequence[Approval]) -> Message:
    """What a turn that asks waits for: the requester's answer (the question follows in
    the thread), the approvers' answer, and approvals."""
    lines = []
    if any(a.request.asks == "requester" for a in asked):
        lines.append("I have a question for you, just below: reply in this thread or click Answer.")
    if theirs := [a for a in asked if a.request.asks == "approvers"]:
        where = " and ".join(
            dict.fromkeys(_channel(a.card.channel if a.card else None) for a in theirs)
        )
        lines.append(f"I've asked the approvers a question in {where}.")
    if approvals:
        tools = ", ".join(dict.fromkeys(_code(a.request.tool) for a in approvals[:20]))
        lines.append(f"I also need approval for {tools}.")
    return _text_message(" ".join(lines) + " I'll continue here once I have what I need.")


def reminder_text(a: Approval, users: Sequence[str], groups: Sequence[str]) -> Message:
    """In the card's thread: still waiting, naming whoever the policy names as approvers."""
    named = [mention(u) for u in users] + [
        f"<!subteam^{g}>" for g in groups if re.fullmatch(r"S[A-Z0-9]{1,30}", g)
    ]
    who = f"{' '.join(named)}: " if named else ""
    return _text_message(
        f"⏰ {who}{_code(a.request.tool)} for {mention(a.request.requester)} still waits for a "
        f"decision (it expires {date(a.request.expires_at)})."
    )


def reminder_dm(a: Approval, card_link: str | None) -> Message:
    """To each approver the policy names: a nudge, with the way to the card."""
    link = _link(card_link, "the request")
    where = (
        f" See {link}." if link else f" It is in {_channel(a.card.channel if a.card else None)}."
    )
    return _text_message(
        f"⏰ {_code(a.request.tool)} for {mention(a.request.requester)} is waiting for your "
        f"decision.{where}"
    )


def card_failed_message(a: Approval) -> Message:
    """To the requester, when Slack refused the approval card for good."""
    where = _channel(a.card.channel if a.card else None)
    return _text_message(
        f"I couldn't post the approval request for {_code(a.request.tool)} to {where}, so no "
        "approver has seen it yet. It stays open until it expires; an admin can find it with "
        "`/approvals pending`."
    )


def answer_taken() -> Message:
    """In the thread, for the requester's reply that answered the agent's question."""
    return {"text": "_Got it — continuing._"}


def thinking_message() -> Message:
    """Placeholder posted at once, replaced by the streamed reply."""
    return {"text": "_Thinking…_"}


def reply_message(text: str) -> Message:
    """The agent's answer; model output is untrusted, so it is escaped like any input."""
    if not text.strip():
        return {"text": "_(I have nothing to add.)_"}
    body, cut = _fit(text, REPLY_MAX)
    note = "\n\n_(reply shortened: too long for one Slack message)_"
    return _text_message(body + note if cut else body)


def busy_message(outcome: Busy) -> Message:
    """Answer to a message that arrives while the thread is already busy."""
    if outcome.waiting_on:
        tools = ", ".join(dict.fromkeys(_code(a.request.tool) for a in outcome.waiting_on))
        return _text_message(
            f"Still waiting for approval of {tools} — I'll continue when it's decided."
        )
    return {"text": "I'm still working on your previous message."}


def slow_down_message(over: Literal["user", "team"]) -> Message:
    """To a message over a limit per minute (agent/limits.py); sent once a minute at most."""
    who = "You're" if over == "user" else "Your workspace is"
    return {
        "text": f"{who} sending me messages faster than I can take them, so I skipped this "
        "one. Please wait a minute, then send it again."
    }


def overloaded_message() -> Message:
    """To a new message that finds this process's backlog full (MAX_QUEUED_TURNS)."""
    return {"text": "I'm busy right now and didn't start on this. Please try again in a minute."}


MODEL_UNAVAILABLE = "The model is unavailable right now. Try again in a few minutes."


def failure_message(retrying: bool, model_unavailable: bool = False) -> Message:
    """Deliberately vague: exception text can leak internals and means nothing to the reader.
    An outage of the model is the exception: the reader can do something (wait)."""
    if model_unavailable and not retrying:
        return {"text": MODEL_UNAVAILABLE}
    then = "I'll retry automatically." if retrying else "Please try again in a moment."
    return {"text": f"Sorry — something went wrong on my side, so I couldn't finish that. {then}"}


def refusal_text(reason: str, a: Approval | None) -> str:
    """Ephemeral answer to a click that changed nothing."""
    if reason == "self_approval":
        return "You asked for this, so someone else has to approve it."
    if reason == "already_voted" and a is not None:
        needed = a.request.approvals_needed
        return f"You've already approved this; it needs {needed} approvals from different people."
    if reason == "participant":
        return (
            "You took part in the conversation that led to this request, so someone else "
            "has to approve it."
        )
    if reason == "outsider":
        return (
            "Guests and people of other organisations cannot approve requests here; ask "
            "one of the workspace's approvers."
        )
    tool = _code(a.request.tool) if a else "this tool"
    if reason == "not_an_approver":
        return f"You're not one of the approvers for {tool}. Ask someone on its approver list."
    if reason == "public_channel":
        command = _code(f"/approvals approvers {a.request.tool if a else '<tool>'} @user @group")
        return (
            f"Approvals for {tool} go to a channel anyone can join, so its members can't "
            f"approve. An admin must make the channel private or name approvers ({command})."
        )
    if reason == "changed":
        return (
            "The request was changed since you saw it, so that changed nothing. "
            "Here it is as it is now."
        )
    if reason == "a_question":
        return "This is a question, not an approval: answer it with Answer."
    if reason == "not_a_question":
        return "That request asks for an approval, not an answer."
    if reason == "not_the_requester":
        return f"The agent asked {mention(a.request.requester) if a else 'the requester'} this."
    if reason == "already_decided":
        match a.decision if a else None:
            case Answered(by=by, at=at):
                return f"Already answered by {mention(by)} at {date(at)}."
            case Expired(at=at):
                return f"Already expired at {date(at)}."
            case Approved(by=by, at=at):
                return f"Already approved by {mention(by)} at {date(at)}."
            case Denied(by=by, at=at):
                return f"Already denied by {mention(by)} at {date(at)}."
        return "Someone already decided this request."
    return "I can't find that approval request any more."


def conversation_refusal(reason: str, a: Approval | None) -> str:
    """Ephemeral answer to "Show conversation" from someone who may not decide."""
    if reason in ("not_found", "public_channel"):
        return refusal_text(reason, a)
    tool = _code(a.request.tool) if a else "this request"
    return f"Only the people who may decide {tool} can see the conversation behind it."


MODAL_BLOCKS = 100


def full_request_modal(a: Approval) -> dict[str, Any]:
    """The complete input as JSON, over as many blocks as it needs: what a card shortened is
    never out of an approver's sight."""
    v = a.current  # what would run: the latest version
    notes = "".join(f"\n{w}" for w in warnings("", v.input))
    if v.edit is not None:
        notes += f"\n✏️ Version {v.number}, changed by {mention(v.edit.by)} at {date(v.edit.at)}"
    head = _section(f"{_code(a.request.tool)} requested by {mention(a.request.requester)}{notes}")
    fence = "```\n", "\n```"
    body = _no_fence(escape(json.dumps(v.input, indent=2, ensure_ascii=False)))
    if v.preview and "\n" in v.preview.strip():  # a diff: whole, after the input
        body += "\n\n" + _no_fence(escape(v.preview))
    pieces = _chunks(body, SECTION_MAX - len(fence[0]) - len(fence[1]))
    room = MODAL_BLOCKS - 2
    sections = [_section(fence[0] + p + fence[1]) for p in pieces[:room]]
    if len(pieces) > room:
        left = sum(len(p) for p in pieces[room:])
        sections.append(_context(f"_…and {left:,} more characters, too many for one Slack view_"))
    return {
        "type": "modal",
        "title": {"type": "plain_text", "text": "Full request"},
        "close": {"type": "plain_text", "text": "Close"},
        "blocks": [head, *sections],
    }


PAGE_CHARS = 40_000  # of text per conversation page, well inside what a view may carry


def conversation_pages(lines: Sequence[Line]) -> list[list[Block]]:
    """The conversation's messages as blocks, oldest first, in pages that fit one view:
    every word of a human's or the agent's message is shown (over several sections if
    long); tool calls and results come summarised (agent/context.py)."""
    pages: list[list[Block]] = [[]]
    size = 0
    for line in lines:
        item = _line_blocks(line)
        weight = sum(len(json.dumps(b)) for b in item)
        if pages[-1] and (
            len(pages[-1]) + len(item) > MODAL_BLOCKS - 4 or size + weight > PAGE_CHARS
        ):
            pages.append([])
            size = 0
        pages[-1] += item
        size += weight
    return pages


def _line_blocks(line: Line) -> list[Block]:
    if line.kind == "tool":
        return [_context(f"🔧 {_fit(line.text, SECTION_MAX - 10)[0]}")]
    who = f"*{mention(line.by)}*" if line.kind == "human" else "*Agent*"
    when = f"  ·  {date(line.at)}" if line.at else ""
    body = _chunks(escape(line.text), SECTION_MAX) if line.text.strip() else ["_(no text)_"]
    return [_context(who + when), *(_section(chunk) for chunk in body)]


def conversation_modal(
    a: Approval, pages: Sequence[Sequence[Block]], page: int, *, channel: str | None = None
) -> dict[str, Any]:
    """One page of the conversation that led to a request, with the way to the others.
    `channel`: where it was opened from, kept for the next page's check of who may see it."""
    head = _section(
        f"The conversation that led to {_code(a.request.tool)} for "
        f"{mention(a.request.requester)}, as the agent had it when it asked (its last "
        "messages). Everything here is what people and tools wrote: untrusted."
    )
    body = list(pages[page]) if pages and pages[page] else [_context("_Nothing was recorded._")]
    nav = []
    if page > 0:
        nav.append(_button("← Earlier", "conversation_page", f"{a.id}:{page - 1}"))
    if page + 1 < len(pages):
        nav.append(_button("Later →", "conversation_page", f"{a.id}:{page + 1}"))
    if nav:
        body.append(_context(f"Page {page + 1} of {len(pages)}"))
        body.append({"type": "actions", "block_id": "pages", "elements": nav})
    return {
        "type": "modal",
        "callback_id": "conversation",
        "private_metadata": json.dumps({"approval_id": a.id, "channel": channel}),
        "title": {"type": "plain_text", "text": "Conversation"},
        "close": {"type": "plain_text", "text": "Close"},
        "blocks": [head, *body],
    }


def edit_modal(a: Approval, form: list[Block], *, note: str = "") -> dict[str, Any]:
    """Edit & approve: every argument of the call's current version, to change before
    approving it. `note`: said first (why the modal shows another version now)."""
    r = a.request
    what = (
        "Your changes count as your approval; the others who approved it will be asked again."
        if r.approvals_needed > 1
        else "The call runs with your changes, and the agent is told what you changed."
    )
    return {
        "type": "modal",
        "callback_id": "edit_approve",
        "title": {"type": "plain_text", "text": "Edit & approve"},
        "submit": {"type": "plain_text", "text": "Approve"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            *([_section(f"⚠️ {note}")] if note else []),
            _section(f"{_code(r.tool)} requested by {mention(r.requester)}. {what}"),
            *form,
        ],
    }


def not_editable(a: Approval) -> str:
    return f"{_code(a.request.tool)} declares no input schema, so it can't be edited here."


def deny_modal(a: Approval) -> dict[str, Any]:
    """Ask for an optional reason; the approval id travels in private_metadata."""
    return {
        "type": "modal",
        "callback_id": "deny_reason",
        "private_metadata": a.id,
        "title": {"type": "plain_text", "text": "Deny request"},
        "submit": {"type": "plain_text", "text": "Deny"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            _section(f"Deny {_code(a.request.tool)} requested by {mention(a.request.requester)}?"),
            {
                "type": "input",
                "block_id": "reason",
                "optional": True,
                "label": {"type": "plain_text", "text": "Reason (optional, the agent will see it)"},
                "element": {
                    "type": "plain_text_input",
                    "action_id": "reason",
                    "multiline": True,
                    "max_length": 500,
                },
            },
        ],
    }


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
