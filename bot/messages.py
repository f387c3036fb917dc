"""The bot's messages other than cards and modals: to the requester, and reminders.

In the requester's thread: what the agent waits for, its reply, why it could not answer;
to approvers: reminders."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from bot.block_kit import (
    Block,
    Message,
    channel_mention,
    code,
    context,
    date,
    link,
    mention,
    section,
    summary,
    text_message,
)
from bot.card import withdraw_button
from bot.safe_text import fit
from storage.domain import Approval

if TYPE_CHECKING:
    from agent.outcomes import Busy

REPLY_MAX = 39000
WITHDRAWABLE = 20  # Withdraw buttons on one note (a Slack message has at most 50 blocks)
WITHDRAW_BLOCK = "withdraw"
MODEL_UNAVAILABLE = "The model is unavailable right now. Try again in a few minutes."


def requester_note(
    approvals: Approval | Sequence[Approval],
    *,
    card_link: str | None = None,
    card_links: Sequence[str | None] = (),
) -> Message:
    """Tell the requester, in their thread, what the agent waits for and where to look, with
    a Withdraw button for each request that waits for approval.

    Takes one approval (with `card_link`) or all a turn stopped on (`card_links` in order).
    """
    every = [approvals] if isinstance(approvals, Approval) else list(approvals)
    links = [card_link] if isinstance(approvals, Approval) else list(card_links)
    asked = [a for a in every if a.request.question]
    if asked:
        return _withdrawable(
            _question_note(asked, [a for a in every if not a.request.question]), every
        )
    many = every
    where = " and ".join(
        dict.fromkeys(channel_mention(a.card.channel if a.card else None) for a in many[:20])
    )
    items = []
    for i, a in enumerate(many[:20]):
        url = links[i] if i < len(links) else None
        shown = link(url, "see the request")
        items.append((_what(a), f" ({shown})" if shown else ""))
    if len(items) == 1:
        (what, there), done = items[0], "I'll continue here once someone decides."
        note = text_message(f"⏳ Waiting for approval in {where}{there} to run {what} — {done}")
        return _withdrawable(note, many)
    lines = "".join(f"\n• {what}{there}" for what, there in items)
    more = f"\n…and {len(many) - 20} more" if len(many) > 20 else ""
    done = "I'll continue here once they're decided."
    text = f"I need approval for {len(many)} actions:{lines}{more}"
    waiting = f"⏳ Waiting for approval in {where or channel_mention(None)} — {done}"
    return _withdrawable(text_message(f"{text}\n{waiting}"), many)


def _withdrawable(note: Message, approvals: Sequence[Approval]) -> Message:
    """The note with a Withdraw button for each request it names that waits for approval:
    one row for one, else the request's tool beside each (Slack shows at most 50 blocks)."""
    waiting = [a for a in approvals if not a.request.question][:WITHDRAWABLE]
    if len(waiting) == 1:
        button = withdraw_button(waiting[0])
        row = {"type": "actions", "block_id": WITHDRAW_BLOCK, "elements": [button]}
        return note | {"blocks": [*note["blocks"], row]}
    rows = [section(_what(a)) | {"accessory": withdraw_button(a)} for a in waiting]
    return note | {"blocks": [*note["blocks"], *rows]}


def _what(a: Approval) -> str:
    """A request as the requester knows it: its tool and a taste of its input."""
    return code(a.request.tool) + (f" ({s})" if (s := summary(a.request.input)) else "")


def withdrawn_note(blocks: list[Block], approval_id: str) -> list[Block]:
    """The note in the requester's thread once they withdrew `approval_id` from it: its
    Withdraw button goes, and what it was beside says it was withdrawn."""
    out: list[Block] = []
    for block in blocks:
        accessory = block.get("accessory")
        elements = block.get("elements") if block.get("type") == "actions" else None
        if isinstance(accessory, dict) and accessory.get("value") == approval_id:
            block = {k: v for k, v in block.items() if k != "accessory"}
            text = dict(block.get("text") or {})
            text["text"] = f"{text.get('text', '')}  ·  ↩️ _withdrawn_"
            out.append(block | {"text": text})
        elif isinstance(elements, list) and any(
            isinstance(e, dict) and e.get("value") == approval_id for e in elements
        ):
            out.append(context("↩️ _You withdrew this request._"))
        else:
            out.append(block)
    return out


def _question_note(asked: Sequence[Approval], approvals: Sequence[Approval]) -> Message:
    """What a turn that asks waits for: the requester's answer (the question follows in
    the thread), the approvers' answer, and approvals."""
    lines = []
    if any(a.request.asks == "requester" for a in asked):
        lines.append("I have a question for you, just below: reply in this thread or click Answer.")
    if theirs := [a for a in asked if a.request.asks == "approvers"]:
        where = " and ".join(
            dict.fromkeys(channel_mention(a.card.channel if a.card else None) for a in theirs)
        )
        lines.append(f"I've asked the approvers a question in {where}.")
    if approvals:
        tools = ", ".join(dict.fromkeys(code(a.request.tool) for a in approvals[:20]))
        lines.append(f"I also need approval for {tools}.")
    return text_message(" ".join(lines) + " I'll continue here once I have what I need.")


def reminder_text(a: Approval, users: Sequence[str], groups: Sequence[str]) -> Message:
    """In the card's thread: still waiting, naming whoever the policy names as approvers."""
    named = [mention(u) for u in users] + [
        f"<!subteam^{g}>" for g in groups if re.fullmatch(r"S[A-Z0-9]{1,30}", g)
    ]
    who = f"{' '.join(named)}: " if named else ""
    return text_message(
        f"⏰ {who}{code(a.request.tool)} for {mention(a.request.requester)} still waits for a "
        f"decision (it expires {date(a.request.expires_at)})."
    )


def reminder_dm(a: Approval, card_link: str | None) -> Message:
    """To each approver the policy names: a nudge, with the way to the card."""
    shown = link(card_link, "the request")
    where = (
        f" See {shown}."
        if shown
        else f" It is in {channel_mention(a.card.channel if a.card else None)}."
    )
    return text_message(
        f"⏰ {code(a.request.tool)} for {mention(a.request.requester)} is waiting for your "
        f"decision.{where}"
    )


def card_failed_message(a: Approval) -> Message:
    """To the requester, when Slack refused the approval card for good."""
    where = channel_mention(a.card.channel if a.card else None)
    return text_message(
        f"I couldn't post the approval request for {code(a.request.tool)} to {where}, so no "
        "approver has seen it yet. It stays open until it expires; an admin can find it with "
        "`/approvals pending`."
    )


def not_editable(a: Approval) -> str:
    """To an approver who clicked Edit & approve on a tool without an input schema."""
    return f"{code(a.request.tool)} declares no input schema, so it can't be edited here."


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
    body, cut = fit(text, REPLY_MAX)
    note = "\n\n_(reply shortened: too long for one Slack message)_"
    return text_message(body + note if cut else body)


def busy_message(outcome: Busy) -> Message:
    """Answer to a message that arrives while the thread is already busy."""
    if outcome.waiting_on:
        tools = ", ".join(dict.fromkeys(code(a.request.tool) for a in outcome.waiting_on))
        return text_message(
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


def failure_message(retrying: bool, model_unavailable: bool = False) -> Message:
    """Deliberately vague: exception text can leak internals and means nothing to the reader.
    An outage of the model is the exception: the reader can do something (wait)."""
    if model_unavailable and not retrying:
        return {"text": MODEL_UNAVAILABLE}
    then = "I'll retry automatically." if retrying else "Please try again in a moment."
    return {"text": f"Sorry — something went wrong on my side, so I couldn't finish that. {then}"}
