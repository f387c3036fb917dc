"""What a person is told, privately, when their click or submission changed nothing.

One answer per refusal reason, matched exhaustively."""

from __future__ import annotations

from typing import assert_never

from bot.block_kit import code, date, mention
from storage.domain import Answered, Approval, Approved, Denied, Expired, RefusalReason, Withdrawn

NOT_FOUND = "I can't find that approval request any more."
REVOKERS = (
    "Only the approver who granted this standing approval, an approver of its tool, or an "
    "admin can revoke it."
)


def refusal_text(reason: RefusalReason, a: Approval | None) -> str:
    """Ephemeral answer to a click that changed nothing. Every reason has its own words: a
    reason added to RefusalReason fails the type check here (`assert_never`) until it does."""
    tool = code(a.request.tool) if a else "this tool"
    match reason:
        case "self_approval":
            return "You asked for this, so someone else has to approve it."
        case "already_voted":
            if a is None:
                return "You've already approved this."
            needed = a.request.approvals_needed
            return (
                f"You've already approved this; it needs {needed} approvals from different people."
            )
        case "participant":
            return (
                "You took part in the conversation that led to this request, so someone else "
                "has to approve it."
            )
        case "outsider":
            return (
                "Guests and people of other organisations cannot approve requests here; ask "
                "one of the workspace's approvers."
            )
        case "not_an_approver":
            return f"You're not one of the approvers for {tool}. Ask someone on its approver list."
        case "public_channel":
            command = code(f"/approvals approvers {a.request.tool if a else '<tool>'} @user @group")
            return (
                f"Approvals for {tool} go to a channel anyone can join, so its members can't "
                f"approve. An admin must make the channel private or name approvers ({command})."
            )
        case "changed":
            return (
                "The request was changed since you saw it, so that changed nothing. "
                "Here it is as it is now."
            )
        case "a_question":
            return "This is a question, not an approval: answer it with Answer."
        case "not_a_question":
            return "That request asks for an approval, not an answer."
        case "not_the_requester":
            return f"The agent asked {mention(a.request.requester) if a else 'the requester'} this."
        case "not_theirs":
            who = mention(a.request.requester) if a else "the person who asked for it"
            return f"Only {who}, who asked for this, can withdraw it. That changed nothing."
        case "already_decided":
            return _already_decided(a)
        case "not_found":
            return NOT_FOUND
        case "note_required" | "no_standing" | "standing_over":
            return _approver_tools(reason, tool)
        case _:
            assert_never(reason)


def _approver_tools(reason: str, tool: str) -> str:
    if reason == "note_required":
        return f"Approvals of {tool} take a note for the agent: use *Approve with note* (⋯)."
    if reason == "no_standing":
        return (
            f"{tool}'s policy offers no standing approval for this request now, so that "
            "changed nothing. Approve it on its own."
        )
    return "That standing approval is over already (revoked, or its time ran out)."


def _already_decided(a: Approval | None) -> str:
    match a.decision if a else None:
        case Answered(by=by, at=at):
            return f"Already answered by {mention(by)} at {date(at)}."
        case Expired(at=at):
            return f"Already expired at {date(at)}."
        case Approved(by=by, at=at):
            return f"Already approved by {mention(by)} at {date(at)}."
        case Denied(by=by, at=at):
            return f"Already denied by {mention(by)} at {date(at)}."
        case Withdrawn(by=by, at=at):
            return f"Already withdrawn by {mention(by)}, who asked for it, at {date(at)}."
    return "Someone already decided this request."


def conversation_refusal(reason: RefusalReason, a: Approval | None) -> str:
    """Ephemeral answer to "Show conversation" from someone who may not decide."""
    if reason in ("not_found", "public_channel"):
        return refusal_text(reason, a)
    tool = code(a.request.tool) if a else "this request"
    return f"Only the people who may decide {tool} can see the conversation behind it."
