"""The modals an approval's buttons open: full request, conversation, Edit & approve, Deny,
Answer, Approve with note."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agent.context import Line
from bot.block_kit import (
    SECTION_MAX,
    Block,
    button,
    chunks,
    code,
    context,
    date,
    mention,
    quote,
    said_of,
    section,
)
from bot.card import hidden_text
from bot.safe_text import escape, fit, no_fence, warnings
from storage.domain import Approval

MODAL_BLOCKS = 100
PAGE_CHARS = 40_000  # of text per conversation page, well inside what a view may carry
NOTE_MAX = 500
# The note's input in Edit & approve, whose other inputs are the tool's fields: a block id
# no field name is.
EDIT_NOTE = "greenlight:note"
READ_ONLY = "Hidden by the tool's policy: leave it as it is. The tool gets the agent's value."


def full_request_modal(a: Approval) -> dict[str, Any]:
    """The complete input as JSON, over as many blocks as it needs: what a card shortened is
    never out of an approver's sight."""
    v = a.current  # what would run: the latest version
    notes = "".join(f"\n{w}" for w in warnings("", v.input))
    if hidden := hidden_text(a.request):
        notes += f"\n{hidden}"
    if v.edit is not None:
        notes += f"\n✏️ Version {v.number}, changed by {mention(v.edit.by)} at {date(v.edit.at)}"
    head = section(f"{code(a.request.tool)} requested by {mention(a.request.requester)}{notes}")
    fence = "```\n", "\n```"
    body = no_fence(escape(json.dumps(v.input, indent=2, ensure_ascii=False)))
    if v.preview and "\n" in v.preview.strip():  # a diff: whole, after the input
        body += "\n\n" + no_fence(escape(v.preview))
    pieces = chunks(body, SECTION_MAX - len(fence[0]) - len(fence[1]))
    room = MODAL_BLOCKS - 2
    sections = [section(fence[0] + p + fence[1]) for p in pieces[:room]]
    if len(pieces) > room:
        left = sum(len(p) for p in pieces[room:])
        sections.append(context(f"_…and {left:,} more characters, too many for one Slack view_"))
    return {
        "type": "modal",
        "title": {"type": "plain_text", "text": "Full request"},
        "close": {"type": "plain_text", "text": "Close"},
        "blocks": [head, *sections],
    }


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
        return [context(f"🔧 {fit(line.text, SECTION_MAX - 10)[0]}")]
    who = f"*{mention(line.by)}*" if line.kind == "human" else "*Agent*"
    when = f"  ·  {date(line.at)}" if line.at else ""
    body = chunks(escape(line.text), SECTION_MAX) if line.text.strip() else ["_(no text)_"]
    return [context(who + when), *(section(chunk) for chunk in body)]


def conversation_modal(
    a: Approval, pages: Sequence[Sequence[Block]], page: int, *, channel: str | None = None
) -> dict[str, Any]:
    """One page of the conversation that led to a request, with the way to the others.
    `channel`: where it was opened from, kept for the next page's check of who may see it."""
    head = section(
        f"The conversation that led to {code(a.request.tool)} for "
        f"{mention(a.request.requester)}, as the agent had it when it asked (its last "
        "messages). Everything here is what people and tools wrote: untrusted."
        + (
            f" Values of {', '.join(code(escape(f)) for f in a.request.redact)} are hidden by "
            "the tool's policy (••••)."
            if a.request.redact
            else ""
        )
    )
    body = list(pages[page]) if pages and pages[page] else [context("_Nothing was recorded._")]
    nav = []
    if page > 0:
        nav.append(button("← Earlier", "conversation_page", f"{a.id}:{page - 1}"))
    if page + 1 < len(pages):
        nav.append(button("Later →", "conversation_page", f"{a.id}:{page + 1}"))
    if nav:
        body.append(context(f"Page {page + 1} of {len(pages)}"))
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
            *([section(f"⚠️ {note}")] if note else []),
            section(f"{code(r.tool)} requested by {mention(r.requester)}. {what}"),
            *([context(hidden)] if (hidden := hidden_text(r)) else []),
            *_read_only(a, form),
            note_input(EDIT_NOTE, required=r.note_required),
        ],
    }


def _read_only(a: Approval, form: list[Block]) -> list[Block]:
    """The form with each input that holds a redacted field saying it is not to be
    changed (a submission that changes it is refused next to it)."""
    hidden = {str(s.path[0]) for s in a.request.secrets}
    return [
        b | {"hint": {"type": "plain_text", "text": READ_ONLY}}
        if b.get("type") == "input" and b.get("block_id") in hidden
        else b
        for b in form
    ]


def note_input(block_id: str, *, required: bool) -> dict[str, Any]:
    """The approver's note to the agent: optional unless the tool's policy needs one."""
    label = "Note to the agent" + ("" if required else " (optional)")
    return {
        "type": "input",
        "block_id": block_id,
        "optional": not required,
        "label": {"type": "plain_text", "text": label},
        "hint": {
            "type": "plain_text",
            "text": "The agent reads it with the call's result; it is kept in the audit trail.",
        },
        "element": {
            "type": "plain_text_input",
            "action_id": "note",
            "multiline": True,
            "max_length": NOTE_MAX,
        },
    }


def note_modal(a: Approval, *, note: str = "") -> dict[str, Any]:
    """Approve with note (or Approve, where the tool's policy needs a note): the request's
    current version is approved with the approver's words for the agent. `note`: said first
    (why the modal is shown again)."""
    r = a.request
    quorum = (
        f" Your approval counts as one of the {r.approvals_needed} needed."
        if r.approvals_needed > 1
        else ""
    )
    return {
        "type": "modal",
        "callback_id": "approve_note",
        "title": {"type": "plain_text", "text": "Approve with note"},
        "submit": {"type": "plain_text", "text": "Approve"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            *([section(f"⚠️ {note}")] if note else []),
            section(
                f"Approve {code(r.tool)} requested by {mention(r.requester)}, as the card "
                f"shows it (version {a.version}).{quorum}"
            ),
            note_input("note", required=r.note_required),
        ],
    }


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
            section(f"Deny {code(a.request.tool)} requested by {mention(a.request.requester)}?"),
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
        "blocks": [section(quote(said_of(asks))), *inputs],
    }
