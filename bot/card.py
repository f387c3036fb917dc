"""The approval card and the question card: what a person deciding sees of a request, and
its buttons, as Block Kit.

The decision buttons are built here only (`decision_buttons`): the Home tab shows the very
same row, with the same action ids and values, so a click there is handled as a card's.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from bot.block_kit import (
    HEADER_MAX,
    KEY_MAX,
    SECTION_MAX,
    Block,
    Message,
    button,
    channel_mention,
    code,
    context,
    date,
    json_head,
    link,
    mention,
    mrkdwn,
    overflow,
    quote,
    said_of,
    section,
    show,
    utc,
)
from bot.safe_text import MARKUP, clip, escape, fit, inert, no_fence, warnings
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
    Source,
    Started,
    Withdrawn,
)

FIELDS_MAX = 10
VALUE_MAX = 300  # enough to read at a glance; the full JSON follows when a value is longer
PREVIEW_SHOWN = 2500  # characters of a many-line preview (a file's diff) on the card
UNKNOWN_OUTCOME = (
    "⚠️ Outcome unknown: the call started but its result was never recorded. "
    "It was not run again — check whether it took effect."
)
UNQUOTED = (
    "_The conversation is not quoted here: this channel is public. "
    "Show conversation has it, for those who may decide._"
)


def as_seen(a: Approval) -> str:
    """A decision button's value: the approval, and the version it shows (so a click on a
    view drawn before a change decides nothing it did not show)."""
    return f"{a.id}~{a.version}"


def decision_buttons(a: Approval, *, editable: bool) -> list[Block]:
    """The row that decides a request, on its card and on the Home tab: Approve (which asks
    for a note first where the tool's policy needs one), Approve for <duration> (a standing
    approval, where the policy offers one), Edit & approve (when its input has a schema to
    edit it by), Deny, and a menu: Approve with note, Show conversation. Each names the
    version shown."""
    seen, r = as_seen(a), a.request
    approve = "approve_with_note" if r.note_required else "approve"
    standing = r.standing if r.approvals_needed == 1 else None
    menu = [("Approve with note", f"note:{seen}"), ("Show conversation", f"conversation:{a.id}")]
    return [
        button("Approve", approve, seen, "primary"),
        *([button(f"Approve for {span(standing)}", "approve_standing", seen)] if standing else []),
        *([button("Edit & approve", "edit_approve", seen)] * editable),
        button("Deny", "deny", seen, "danger"),
        overflow("approve_menu", menu),
    ]


def span(duration: timedelta) -> str:
    """A standing approval's length as its button says it: `1 h`, `30 min`, `1 h 30 min`."""
    seconds = int(duration.total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "min"), (seconds, "s")]
    return " ".join(f"{n} {unit}" for n, unit in parts if n) or "0 s"


def answer_button(a: Approval) -> Block:
    """What answers a question, on its card and on the Home tab."""
    return button("Answer", "answer", a.id, "primary")


def withdraw_button(a: Approval) -> Block:
    """What takes a waiting request back, for its requester alone: on the note in their
    thread and on their Home tab. Slack asks them to confirm first: it cannot be undone."""
    tool = a.request.tool[:120]  # plain text: nothing in it is markup
    return button("Withdraw", "withdraw", a.id) | {
        "confirm": {
            "title": {"type": "plain_text", "text": "Withdraw this request?"},
            "text": {"type": "plain_text", "text": f"{tool} will not run; the agent is told."},
            "confirm": {"type": "plain_text", "text": "Withdraw"},
            "deny": {"type": "plain_text", "text": "Keep waiting"},
        }
    }


def origin_notes(key: str, sources: Mapping[str, Source]) -> list[str]:
    """Where the values under `key` came from, when not from a human's message: a hint for
    the approver (prompt injection puts an attacker's values in tool results)."""
    notes = []
    for path, source in sources.items():
        if source.origin == "human" or not (path == key or path.startswith(f"{key}.")):
            continue
        where = "" if path == key else f"{fit(path[len(key) + 1 :], KEY_MAX)[0]}: "
        if source.origin == "tool" and source.tool:
            what = f"from {fit(source.tool, KEY_MAX)[0]}'s result"
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
        k, k_cut = fit(str(key), KEY_MAX)
        v, v_cut = fit(show(value, VALUE_MAX), VALUE_MAX)
        v = inert(v)
        shortened = shortened or k_cut or v_cut
        if v_cut:
            whole = len(value) if isinstance(value, str) else len(json_head(value, 10**6))
            v += f" _(shortened: {whole:,} characters in all)_"
        notes = "".join(
            f"\n{w}" for w in (*warnings(str(key), value), *origin_notes(str(key), sources))
        )
        label = inert(k) if MARKUP.search(k) else f"*{k}*"
        fields.append(mrkdwn(f"{label}\n{v or ' '}{notes}"))
    if len(shown) < len(items):
        fields.append(mrkdwn(f"_…and {len(items) - len(shown)} more keys_"))
    return fields, shortened


def _full_input(data: Mapping[str, Any]) -> Block:
    """The whole input as JSON, for when the fields had to leave something out."""
    head, tail, note = "*Full input*\n```\n", "\n```", "\n_(truncated: too long to show here)_"
    body = no_fence(escape(json_head(dict(data), SECTION_MAX, indent=2)[: SECTION_MAX + 1]))
    budget = SECTION_MAX - len(head) - len(tail)
    if len(body) <= budget:
        return section(head + body + tail)
    return section(head + clip(body, budget - len(note)) + tail + note)


def _input_blocks(
    data: Mapping[str, Any], sources: Mapping[str, Source]
) -> tuple[list[Block], bool]:
    """The input as fields, and whole as JSON when the fields had to shorten it."""
    fields, shortened = _input_fields(data, sources)
    out: list[Block] = [{"type": "section", "fields": fields} if fields else section("_No input._")]
    return [*out, _full_input(data)] if shortened else out, shortened


def request_sections(r: Request, quotes: bool = True) -> list[Block]:
    """What led to the call: the message that started the conversation, the last human
    message before the call, and the agent's words just before it, each labelled; in a
    public channel (`quotes` False), only a note that they are left out."""
    if not quotes:
        return [context(UNQUOTED)]
    c = r.context
    words = [
        (c.first, f"*{mention(c.first.by if c.first else None)} asked:*"),
        (c.latest, f"*Then {mention(c.latest.by if c.latest else None)} wrote:*"),
        (c.agent, "*The agent said before the call:*"),
    ]
    return [section(f"{label}\n{quote(said)}") for said, label in words if said is not None]


def hidden_text(r: Request) -> str | None:
    """That the tool's policy hides part of the input (storage/redaction.py): which fields,
    and what it means. None when nothing is hidden."""
    if not r.secrets:
        return None
    names = ", ".join(code(escape(s.name)) for s in r.secrets[:10])
    more = f" and {len(r.secrets) - 10} more" if len(r.secrets) > 10 else ""
    return (
        f"🔒 Hidden by the tool's policy: {names}{more} (shown as ••••, with its length). "
        "The tool gets the value; nobody can change it; the audit trail keeps its SHA-256."
    )


def history_text(r: Request) -> str | None:
    """The requester's earlier requests for this tool, so an unusual one stands out."""
    h: History | None = r.context.history
    if h is None:
        return None
    counts = [(h.approved, "approved"), (h.denied, "denied"), (h.expired, "expired")]
    ended = ", ".join(f"{n} {label}" for n, label in counts if n) or "no requests"
    return (
        f"Earlier {code(r.tool)} requests: {mention(r.requester)}: {ended} in the last "
        f"{h.days} days"
    )


def edit_text(a: Approval) -> str:
    """An approver's changes: each field, struck through and replaced."""
    assert a.edit is not None
    lines = []
    changes = a.edit.changes(a.request.input)
    for key, change in list(changes.items())[:20]:
        old, new = (fit(show(change[k], 200), 200)[0] for k in ("from", "to"))
        was = f"~{old}~" if change["from"] is not None else "_(none)_"
        now = new if change["to"] is not None else "_(removed)_"
        lines.append(f"• *{fit(str(key), KEY_MAX)[0]}*: {was} → {now}")
    who = f"✏️ *Changed by {mention(a.edit.by)}* at {date(a.edit.at)} (version {a.version})"
    if not changes:
        return f"{who}: back to the call as the agent asked it; the arguments above are it"
    what = "the call runs with the arguments above, changed from what the agent asked"
    return f"{who}: {what}:\n" + "\n".join(lines)


def quorum_text(a: Approval) -> str:
    """How far a request that needs several approvers got: '1 of 2 approvals: @alice', and
    the notes the votes carry."""
    needed = a.request.approvals_needed
    who = ", ".join(mention(v.by) for v in a.votes) or "none yet"
    return f"*{len(a.votes)} of {needed} approvals:* {who}" + notes_text(a)


def notes_text(a: Approval) -> str:
    """The approvers' notes to the agent, each quoted (escaped: an approver's words are
    untrusted text like any other)."""
    return "".join(
        f"\n💬 {mention(by)}'s note to the agent:\n{quote(said_of(note))}" for by, note in a.notes()
    )


def calls_ran(uses: int) -> str:
    """'3 more calls ran under this approval'."""
    return f"{uses} more call{'s' if uses != 1 else ''} ran under this approval"


def standing_blocks(a: Approval, now: datetime) -> list[Block]:
    """A standing approval granted with the request: until when, what it covers, how many
    calls ran under it, and while it is live, Revoke."""
    g = a.standing
    if g is None:
        return []
    r = a.request
    what = f"later {code(r.tool)} calls by {mention(r.requester)} in that conversation"
    if g.revoked_at is not None:
        state = f"Revoked by {mention(g.revoked_by)} at {date(g.revoked_at)}"
    elif g.live(now):
        state = f"⏱️ Standing approval until {date(g.until)}: {what}, matched as this one was"
        state += ", run without a card"
    else:
        state = f"Standing approval over: its time ran out at {date(g.until)}"
    out = [section(f"{state}.\n{calls_ran(g.uses)}.")]
    if g.live(now):
        out.append({"type": "actions", "block_id": "standing", "elements": [revoke_button(a)]})
    return out


def revoke_button(a: Approval) -> Block:
    """What ends a live standing approval, on its card and on the Home tab."""
    return button("Revoke", "revoke_standing", a.id, "danger")


def decision_text(a: Approval) -> str:
    """The card's closing line once the request is no longer pending."""
    match a.decision:
        case Approved(by=by, at=at):
            voters = [v.by for v in a.votes] or [by]
            line = f"✅ Approved by {' and '.join(mention(v) for v in voters)} at {date(at)}"
            line += notes_text(a) if a.request.approvals_needed == 1 else ""
            if isinstance(a.execution, Finished):
                line += "\nRan."
            elif isinstance(a.execution, Started):
                line += "\n" + UNKNOWN_OUTCOME
            return line
        case Denied(by=by, at=at, reason=reason):
            why = f": {fit(reason, 1000)[0]}" if reason else ""
            return f"❌ Denied by {mention(by)} at {date(at)}{why}"
        case Expired(at=at):
            if a.request.question:
                return f"⌛ Expired at {date(at)} — nobody answered; the agent was told"
            return f"⌛ Expired at {date(at)} — the request was denied automatically"
        case Answered(by=by, at=at, answer=answer):
            return f"💬 Answered by {mention(by)} at {date(at)}:\n{quote(said_of(answer))}"
        case Withdrawn(by=by, at=at):
            line = f"↩️ Withdrawn by {mention(by)}, who asked for it, at {date(at)}"
            return line + " — the request was withdrawn, so nothing runs"
        case None:
            return "Waiting for a decision."


OUTSIDERS = {
    "guest": "⚠️ a guest of this workspace",
    "external": "⚠️ of another organisation (Slack Connect)",
}


def _requested_by(
    a: Approval, thread_link: str | None, description: str, requester: str | None = None
) -> Block:
    """Who asked (and whether they are a guest or of another organisation, `requester`),
    who else took part, where, through which key; what the tool does."""
    r = a.request
    who = f"*Requested by* {mention(r.requester)}"
    if requester in OUTSIDERS:
        who += f", {OUTSIDERS[requester]}"
    if others := [p for p in dict.fromkeys(r.participants) if p != r.requester][:20]:
        who += f"  ·  also in the conversation: {', '.join(mention(p) for p in others)}"
    if shown := link(thread_link, "View the conversation"):
        who += f"  ·  {shown}"
    if (via := r.context.via) is not None:
        who += f"  ·  through key `{escape(via.key)}`"
        if via.client:
            who += f"  ·  MCP client `{escape(via.client)}`"
    return section(who + (f"\n{fit(description, 2000)[0]}" if description else ""))


def _notes(a: Approval, note: str) -> list[Block]:
    """That the caller went away (nothing will run), and where the tool comes from."""
    out = []
    if (via := a.request.context.via) is not None and via.gone:
        gone = "⚠️ The caller went away while this waited: nothing will run"
        ran = isinstance(a.execution, NotStarted)
        out.append(context(gone + (" (the result has nowhere to go)." if ran else ".")))
    if note:
        out.append(context(escape(note)))
    return out


def _call_blocks(a: Approval) -> list[Block]:
    """The current version, whole (an edit is shown with the same care as the agent's
    call), then what else bears on it: history, edits, quorum, escalation, preview, why."""
    r, v = a.request, a.current
    out, shortened = _input_blocks(v.input, v.sources)
    preview, preview_cut = _preview(v.preview)
    if hidden := hidden_text(r):
        out.append(context(hidden))
    if history := history_text(r):
        out.append(context(history))
    shows = [button("Show conversation", "show_conversation", a.id)]
    if shortened or preview_cut:
        shows.append(button("Show full request", "show_request", a.id))
    out.append({"type": "actions", "block_id": "request", "elements": shows})
    if a.edit is not None:
        out.append(section(edit_text(a)))
    if r.approvals_needed > 1:
        out.append(section(quorum_text(a)))
    if a.decision is None and a.escalated and a.escalation is not None:
        where = channel_mention(a.escalation.channel)
        out.append(context(f"⏫ Escalated to {where}: people there may decide too"))
    if preview is not None:
        out.append(preview)
    if r.why:
        out.append(section(f"*Why approval is needed:* {fit(r.why, 2000)[0]}"))
    return out


def approval_card(
    a: Approval,
    *,
    description: str,
    thread_link: str | None,
    now: datetime,
    editable: bool = True,
    note: str = "",
    quotes: bool = True,
    requester: str | None = None,
) -> Message:
    """The approvers' card: what, who, why, until when; buttons only while still pending.

    `description`: the tool's own, so the approver knows what the call does; `editable`:
    its input has a schema to edit it by (Edit & approve); `note`: where the tool comes from
    (an MCP server's, with the server's read-only / destructive hint); `requester`: "guest"
    or "external" when the requester is one (bot/people.py `outsider_kind`).
    """
    r = a.request
    pending = a.decision is None
    title = "Approval needed" if pending else a.state.value.capitalize()
    header = fit(f"{title}: {r.tool}", HEADER_MAX)[0]
    blocks: list[Block] = [
        {"type": "header", "text": {"type": "plain_text", "text": header}},
        _requested_by(a, thread_link, description, requester),
        *_notes(a, note),
        *request_sections(r, quotes),
        *_call_blocks(a),
    ]
    if pending:
        verb = "Expired" if utc(now) >= utc(r.expires_at) else "Expires"
        blocks.append(context(f"Requested {date(r.requested_at)}  ·  {verb} {date(r.expires_at)}"))
        row = decision_buttons(a, editable=editable)
        blocks.append({"type": "actions", "block_id": "approval", "elements": row})
    else:
        blocks.append(section(decision_text(a)))
        blocks += standing_blocks(a, now)
    return {"text": f"{title}: {escape(r.tool)}", "blocks": blocks}


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
        {"type": "header", "text": {"type": "plain_text", "text": fit(title, HEADER_MAX)[0]}}
    ]
    if r.asks == "requester":
        blocks.append(section(f"{mention(r.requester)}, the agent asks you:"))
    else:
        who = f"The agent asks the approvers, for {mention(r.requester)}"
        if shown := link(thread_link, "View the conversation"):
            who += f"  ·  {shown}"
        blocks.append(section(who + (f"\n{fit(description, 2000)[0]}" if description else "")))
        blocks += request_sections(r, quotes)
    if question is not None:
        blocks.append(section(quote(said_of(question))))
    else:  # a tool's own interrupt: what it says, and its input
        blocks.append(section(f"*{fit(r.why, 2000)[0]}*"))
        blocks += _input_blocks(r.input, r.context.sources)[0]
    if pending:
        how = "Reply in this thread, or click Answer." if r.asks == "requester" else "Click Answer."
        blocks.append(context(f"{how}  ·  Expires {date(r.expires_at)}"))
        elements = [answer_button(a)]
        if r.asks != "requester":
            elements.append(button("Show conversation", "show_conversation", a.id))
        blocks.append({"type": "actions", "block_id": "question", "elements": elements})
    else:
        blocks.append(section(decision_text(a)))
    return {"text": f"{title}: {escape(question or r.tool)[:200]}", "blocks": blocks}


def _preview(text: str | None) -> tuple[Block | None, bool]:
    """The tool's preview of the call: a line, or many (a diff) in a code block; and whether
    the card had to shorten it (Show full request then has it whole)."""
    if text is None:
        return None, False
    if text == "":
        return context("_Preview unavailable: it failed or took longer than 2 s._"), False
    if "\n" not in text.strip():
        return section(f"*Preview:* {fit(text, 1000)[0]}"), False
    body, cut = fit(text, PREVIEW_SHOWN)
    note = f"\n_(shortened: {len(text):,} characters in all)_" if cut else ""
    return section(f"*Preview:*\n```\n{no_fence(body)}\n```{note}"), cut
