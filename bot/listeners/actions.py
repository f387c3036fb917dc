"""The buttons of approval cards: Approve (with a note, or for a while), Deny, Revoke, and
what an approver may look at first; and the requester's Withdraw.

The Home tab (bot/home.py) shows the same buttons: a click there is in no channel, so the
clicker's channel membership is asked of Slack instead, and what a card's clicker would be
told in an ephemeral message is told at the top of their Home.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent.outcomes import DecisionRefused
from bot import forms, messages, modals, refusals
from bot.deps import Deps
from bot.listeners.shared import (
    Interaction,
    clicked,
    facts_for,
    in_modal,
    message_ts,
    obj,
    seen_in,
    settled,
)
from storage.domain import Approval


def button(body: dict[str, Any]) -> object:
    actions = body.get("actions")
    return actions[0].get("value") if isinstance(actions, list) and actions else None


def from_home(body: dict[str, Any]) -> bool:
    """Whether the click came from the Home tab, or from a modal opened there (which says
    so in its private_metadata, which only we write)."""
    view = obj(body.get("view"))
    if view.get("type") == "home":
        return True
    try:
        return obj(json.loads(view.get("private_metadata") or "")).get("home") is True
    except (TypeError, ValueError):
        return False


async def refuse(
    deps: Deps,
    client: AsyncWebClient,
    refusal: DecisionRefused,
    asked: Interaction,
    *,
    home: bool,
) -> None:
    """Say why, privately; redraw the card only when its state changed (someone decided,
    or it expired) since it was drawn."""
    text = refusals.refusal_text(refusal.reason, refusal.approval)
    await tell(deps, client, asked, text, home=home)
    if refusal.reason in ("already_decided", "changed") and refusal.approval is not None:
        await deps.delivery.refresh_card(client, refusal.approval)


async def tell(
    deps: Deps,
    client: AsyncWebClient,
    asked: Interaction,
    text: str,
    *,
    home: bool,
) -> None:
    """A private note to the clicker, where they clicked: ephemeral in the card's channel,
    or at the top of their Home tab (a failure is only logged)."""
    if home:
        await deps.home.tell(client, asked.team, asked.user, text)
    elif asked.channel is not None:
        with contextlib.suppress(SlackApiError):
            await client.chat_postEphemeral(channel=asked.channel, user=asked.user, text=text)


async def too_fast(
    deps: Deps,
    client: AsyncWebClient,
    asked: Interaction,
    *,
    home: bool = False,
) -> bool:
    """Whether the clicker is over their limit for this card (told once, then ignored)."""
    verdict = deps.clicks.check(asked.user, asked.approval_id)
    if verdict == "warn":
        note = "You're clicking quickly — give it a few seconds, then try again."
        await tell(deps, client, asked, note, home=home)
    return verdict != "ok"


async def approve(
    deps: Deps,
    client: AsyncWebClient,
    asked: Interaction,
    seen: int,
    *,
    home: bool,
    standing: bool = False,
) -> None:
    facts = facts_for(deps, client, asked, home=home)
    try:
        decided = await deps.workflow.decisions.decide(
            asked.team,
            asked.approval_id,
            asked.user,
            approve=True,
            facts=facts,
            seen=seen,
            standing=standing,
            resume_here=True,  # `settled` resumes it
        )
    except DecisionRefused as refusal:
        await refuse(deps, client, refusal, asked, home=home)
        return
    await settled(deps, client, decided)


async def on_approve(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    await ack()
    asked, home = clicked(body), from_home(body)
    if asked is None or await too_fast(deps, client, asked, home=home):
        return
    # In line with the turns: a click waits behind the messages that came before it.
    seen = seen_in(button(body))
    deps.background.spawn(approve(deps, client, asked, seen, home=home), name="approve")


async def on_approve_standing(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Approve for <duration>: the approval, and a standing approval for later calls like it
    (agent/standing.py)."""
    await ack()
    asked, home = clicked(body), from_home(body)
    if asked is None or await too_fast(deps, client, asked, home=home):
        return
    seen = seen_in(button(body))
    work = approve(deps, client, asked, seen, home=home, standing=True)
    deps.background.spawn(work, name="approve standing")


async def on_approve_with_note(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Approve with note (or Approve, where the policy needs a note): a modal for the note,
    showing the version the click was on (bot/listeners/views.py approves it)."""
    await ack()
    if (opened := await opening(deps, client, body)) is None:
        return
    view = modals.note_modal(opened.approval)
    view["private_metadata"] = opened.metadata()
    await client.views_open(trigger_id=opened.trigger, view=view)


async def on_approve_menu(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """The decision row's ⋯ menu: Approve with note, or Show conversation, as their own
    buttons would be (the chosen option's value is theirs, after its prefix)."""
    actions = body.get("actions")
    action = actions[0] if isinstance(actions, list) and actions else None
    value = obj(obj(action).get("selected_option")).get("value")
    kind, _, rest = str(value).partition(":")
    as_button = body | {"actions": [obj(action) | {"value": rest}]}
    if kind == "note":
        await on_approve_with_note(ack, as_button, client, deps)
    elif kind == "conversation":
        await on_show_conversation(ack, as_button, client, deps)
    else:
        await ack()


async def on_revoke_standing(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Revoke a standing approval: its approver, an approver of the tool, or an admin."""
    await ack()
    asked, home = clicked(body), from_home(body)
    if asked is None or await too_fast(deps, client, asked, home=home):
        return
    deps.background.spawn(revoke(deps, client, asked, home=home), name="revoke")


async def revoke(deps: Deps, client: AsyncWebClient, asked: Interaction, *, home: bool) -> None:
    async def is_admin() -> bool:
        return await deps.people.is_admin(client, asked.user, asked.team)

    try:
        revoked = await deps.workflow.standing.revoke(
            asked.team,
            asked.approval_id,
            asked.user,
            facts=facts_for(deps, client, asked, home=home),
            is_admin=is_admin,
        )
    except DecisionRefused as refusal:
        text = refusals.refusal_text(refusal.reason, refusal.approval)
        if refusal.reason not in ("standing_over", "not_found"):  # who may decide, or not
            text = refusals.REVOKERS
        await tell(deps, client, asked, text, home=home)
        if refusal.reason == "standing_over" and refusal.approval is not None:
            await deps.delivery.refresh_card(client, refusal.approval)
        return
    await deps.delivery.refresh_card(client, revoked)


async def on_withdraw(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Withdraw: the requester takes back a request that waits, from the note in their
    thread or from their Home tab (agent/decisions.py `withdraw`)."""
    await ack()
    asked, home = clicked(body), from_home(body)
    if asked is None or await too_fast(deps, client, asked, home=home):
        return
    note = None if home else obj(body.get("message"))
    deps.background.spawn(withdraw(deps, client, asked, note, home=home), name="withdraw")


async def withdraw(
    deps: Deps,
    client: AsyncWebClient,
    asked: Interaction,
    note: dict[str, Any] | None,
    *,
    home: bool,
) -> None:
    """Withdraw, and then as after any decision; `note`: the message clicked in the thread,
    which loses that button."""
    try:
        decided = await deps.workflow.decisions.withdraw(asked.team, asked.approval_id, asked.user)
    except DecisionRefused as refusal:
        await refuse(deps, client, refusal, asked, home=home)
        return
    note = note or {}
    blocks, ts = note.get("blocks"), note.get("ts")
    if asked.channel is not None and message_ts(ts) and isinstance(blocks, list):
        shown = messages.withdrawn_note([obj(b) for b in blocks], asked.approval_id)
        with contextlib.suppress(SlackApiError):
            await client.chat_update(
                channel=asked.channel, ts=ts, text=str(note.get("text", "")), blocks=shown
            )
    await settled(deps, client, decided)


@dataclass(frozen=True)
class Opening:
    """A click that opens a modal about a request, by someone the checks let through."""

    approval: Approval
    asked: Interaction
    home: bool
    trigger: str

    def metadata(self, **extra: object) -> str:
        """What the modal's submission needs: which request, where it was clicked, and the
        version of it the modal shows (its submission decides that version or nothing)."""
        asked = self.asked
        seen = {
            "approval_id": asked.approval_id,
            "channel": asked.channel,
            "seen": self.approval.version,
        }
        return json.dumps(seen | extra | {"home": self.home})


async def opening(
    deps: Deps, client: AsyncWebClient, body: dict[str, Any], *, answers: bool = False
) -> Opening | None:
    """The request a modal-opening button is about, if the clicker may decide it (or, with
    `answers`, answer it); else None, the clicker told why."""
    asked, home = clicked(body), from_home(body)
    trigger = body.get("trigger_id")
    if asked is None or not isinstance(trigger, str):
        return None
    if await too_fast(deps, client, asked, home=home):
        return None
    facts = facts_for(deps, client, asked, home=home)
    decisions = deps.workflow.decisions
    check = decisions.check_answerer if answers else decisions.check_decider
    try:
        approval = await check(asked.team, asked.approval_id, asked.user, facts)
        if not answers and seen_in(button(body)) != approval.version:
            raise DecisionRefused("changed", approval)  # a modal of a version it did not show
    except DecisionRefused as refusal:
        await refuse(deps, client, refusal, asked, home=home)
        return None
    return Opening(approval, asked, home, trigger)


async def on_edit_approve(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Edit & approve: the call's input in a form from the tool's schema, prefilled with what
    the card showed (bot/listeners/views.py approves with the changes)."""
    await ack()
    if (opened := await opening(deps, client, body)) is None:
        return
    approval = opened.approval
    form = deps.workflow.runtime.edit_form(approval.request.tool, approval.current.input)
    if form is None:
        await tell(deps, client, opened.asked, messages.not_editable(approval), home=opened.home)
        return
    view = modals.edit_modal(approval, forms.form_blocks(form, approval.current.input))
    view["private_metadata"] = opened.metadata()
    await client.views_open(trigger_id=opened.trigger, view=view)


async def on_deny(ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps) -> None:
    """Ask for a reason in a modal (bot/listeners/views.py records the denial)."""
    await ack()
    if (opened := await opening(deps, client, body)) is None:
        return
    view = modals.deny_modal(opened.approval)
    view["private_metadata"] = opened.metadata()
    await client.views_open(trigger_id=opened.trigger, view=view)


async def on_show_request(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """The whole input of a card that had to shorten it, in a modal."""
    await ack()
    asked, home = clicked(body), from_home(body)
    trigger = body.get("trigger_id")
    if asked is None or not isinstance(trigger, str):
        return
    if await too_fast(deps, client, asked, home=home):
        return
    approval = await deps.workflow.reads.approval(asked.team, asked.approval_id)
    if approval is None:
        await tell(deps, client, asked, refusals.refusal_text("not_found", None), home=home)
        return
    await client.views_open(trigger_id=trigger, view=modals.full_request_modal(approval))


async def on_show_conversation(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """The conversation that led to a request, in a modal, for those who may decide it."""
    await ack()
    asked, home = clicked(body), from_home(body)
    trigger = body.get("trigger_id")
    if asked is None or not isinstance(trigger, str):
        return
    if await too_fast(deps, client, asked, home=home):
        return
    view = await conversation_view(deps, client, asked, page=0, home=home)
    if view is not None:
        await client.views_open(trigger_id=trigger, view=view)


async def on_conversation_page(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Another page of that conversation, in the same modal (checked again: pages are
    not a way around who may see it)."""
    await ack()
    asked, actions = in_modal(body), body.get("actions")
    value = actions[0].get("value") if isinstance(actions, list) and actions else None
    view_id = obj(body.get("view")).get("id")
    approval_id, _, page = str(value).rpartition(":")
    if asked is None or asked.approval_id != approval_id or not page.isdigit():
        return
    view = await conversation_view(deps, client, asked, page=int(page), home=from_home(body))
    if view is not None and isinstance(view_id, str):
        await client.views_update(view_id=view_id, view=view)


async def conversation_view(
    deps: Deps,
    client: AsyncWebClient,
    asked: Interaction,
    *,
    page: int,
    home: bool,
) -> dict[str, Any] | None:
    """The modal's page `page`, or None (and the person told why) if they may not see it."""
    facts = facts_for(deps, client, asked, home=home)
    try:
        approval, lines = await deps.workflow.reads.conversation(
            asked.team, asked.approval_id, asked.user, facts
        )
    except DecisionRefused as refusal:
        text = refusals.conversation_refusal(refusal.reason, refusal.approval)
        await tell(deps, client, asked, text, home=home)
        return None
    pages = modals.conversation_pages(lines)
    return modals.conversation_modal(
        approval, pages, min(page, len(pages) - 1), channel=asked.channel
    )


async def on_answer(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Answer a question in a modal: free text, or the form its tool gives."""
    await ack()
    if (opened := await opening(deps, client, body, answers=True)) is None:
        return
    form = deps.workflow.runtime.question_form(opened.approval.request.tool)
    view = modals.answer_modal(opened.approval, forms.form_blocks(form) if form else None)
    view["private_metadata"] = opened.metadata()
    await client.views_open(trigger_id=opened.trigger, view=view)


async def ack_first(ack: AsyncAck, next_: Callable[[], Awaitable[None]]) -> None:
    """Acknowledge a click before its listener starts. A listener's own `ack()` is seen by
    Bolt only when it next polls for it (every 10 ms), and until then the work the listener
    began runs first (a decision, the card's redraw, the Slack calls they make); acked here,
    Bolt answers at once, and the listener's own `ack()` changes nothing."""
    await ack()
    await next_()


def register(app: AsyncApp) -> None:
    listeners = {
        "answer": on_answer,
        "approve": on_approve,
        "approve_standing": on_approve_standing,
        "approve_with_note": on_approve_with_note,
        "approve_menu": on_approve_menu,
        "revoke_standing": on_revoke_standing,
        "withdraw": on_withdraw,
        "edit_approve": on_edit_approve,
        "deny": on_deny,
        "show_request": on_show_request,
        "show_conversation": on_show_conversation,
        "conversation_page": on_conversation_page,
    }
    for action, listener in listeners.items():  # each acks plainly, first thing
        app.action(action, middleware=[ack_first])(listener)
