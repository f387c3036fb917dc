"""The buttons of approval cards: Approve, Deny, and what an approver may look at first.

The Home tab (bot/home.py) shows the same buttons: a click there is in no channel, so the
clicker's channel membership is asked of Slack instead, and what a card's clicker would be
told in an ephemeral message is told at the top of their Home.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent.policy import ApproverFacts, Policy
from agent.workflow import Approval, Decided, DecisionRefused
from bot import blocks, forms
from bot.deps import Deps
from bot.listeners.fields import obj, slack_id

APPROVAL_ID = re.compile(r"^[0-9a-f-]{8,64}$")
# A decision button names the version of the request its view showed: `<id>~<version>`.
AS_SEEN = re.compile(r"^(?P<id>[0-9a-f-]{8,64})(?:~(?P<seen>[0-9]{1,19}))?$")
VERSION_MAX = 2**31 - 1  # the column's range; anything above names no version there is


def clicked(body: dict[str, Any]) -> tuple[str, str, str | None, str] | None:
    """(team, user, channel, approval id) from a block_actions payload, or None if malformed."""
    actions = body.get("actions")
    user = obj(body.get("user")).get("id")
    team = obj(body.get("team")).get("id") or obj(body.get("user")).get("team_id")
    channel = obj(body.get("channel")).get("id")
    if not (isinstance(actions, list) and actions and isinstance(actions[0], dict)):
        return None
    value = actions[0].get("value")
    if not (slack_id(user) and slack_id(team) and isinstance(value, str)):
        return None
    if (match := AS_SEEN.match(value)) is None:
        return None
    return team, user, channel if slack_id(channel) else None, match["id"]


def seen_in(value: object) -> int:
    """The version of the request a button's (or a modal's) view showed: a button drawn
    before versions were named shows version 1, the request as the agent asked it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if 0 <= value <= VERSION_MAX else 0
    match = AS_SEEN.match(value) if isinstance(value, str) else None
    if match is None or match["seen"] is None:
        return 1
    seen = int(match["seen"])
    return seen if seen <= VERSION_MAX else 0


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


def facts_for(
    deps: Deps, client: AsyncWebClient, user: str, channel: str | None, *, home: bool = False
) -> Callable[[Approval, Policy], Awaitable[ApproverFacts]]:
    """What Slack knows about the clicker, asked only once the workflow knows the request."""
    return deps.people.deciding(client, user, clicked_in=channel, home=home)


async def refuse(
    deps: Deps,
    client: AsyncWebClient,
    refusal: DecisionRefused,
    parsed: tuple[str, str, str | None, str],
    *,
    home: bool,
) -> None:
    """Say why, privately; redraw the card only when its state changed (someone decided,
    or it expired) since it was drawn."""
    text = blocks.refusal_text(refusal.reason, refusal.approval)
    await tell(deps, client, parsed, text, home=home)
    if refusal.reason in ("already_decided", "changed") and refusal.approval is not None:
        await deps.delivery.refresh_card(client, refusal.approval)


async def tell(
    deps: Deps,
    client: AsyncWebClient,
    parsed: tuple[str, str, str | None, str],
    text: str,
    *,
    home: bool,
) -> None:
    """A private note to the clicker, where they clicked: ephemeral in the card's channel,
    or at the top of their Home tab (a failure is only logged)."""
    team, user, channel, _ = parsed
    if home:
        await deps.home.tell(client, team, user, text)
    elif channel is not None:
        with contextlib.suppress(SlackApiError):
            await client.chat_postEphemeral(channel=channel, user=user, text=text)


async def too_fast(
    deps: Deps,
    client: AsyncWebClient,
    parsed: tuple[str, str, str | None, str],
    *,
    home: bool = False,
) -> bool:
    """Whether the clicker is over their limit for this card (told once, then ignored)."""
    _, user, _, approval_id = parsed
    verdict = deps.clicks.check(user, approval_id)
    if verdict == "warn":
        note = "You're clicking quickly — give it a few seconds, then try again."
        await tell(deps, client, parsed, note, home=home)
    return verdict != "ok"


async def settled(deps: Deps, client: AsyncWebClient, decided: Decided) -> None:
    """After a decision or an answer: resume the turn if that was the last thing it waited
    for (first: the requester waits on it), then redraw the card."""
    if decided.turn_ready:
        turn_id = decided.turn_id

        async def resume() -> None:
            streams = deps.delivery.streams(client)
            resumed = await deps.workflow.continue_turn(turn_id, on_text=streams)
            if resumed is not None:
                await deps.delivery.resumed(client, resumed, streams)
            await streams.close_rest()

        deps.background.spawn(resume(), name=f"resume {turn_id}")
    await deps.delivery.refresh_card(client, decided.approval)


async def approve(
    deps: Deps,
    client: AsyncWebClient,
    parsed: tuple[str, str, str | None, str],
    seen: int,
    *,
    home: bool,
) -> None:
    team, user, channel, approval_id = parsed
    facts = facts_for(deps, client, user, channel, home=home)
    try:
        decided = await deps.workflow.decide(
            team, approval_id, user, approve=True, facts=facts, seen=seen
        )
    except DecisionRefused as refusal:
        await refuse(deps, client, refusal, parsed, home=home)
        return
    await settled(deps, client, decided)


async def on_approve(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    await ack()
    parsed, home = clicked(body), from_home(body)
    if parsed is None or await too_fast(deps, client, parsed, home=home):
        return
    # In line with the turns: a click waits behind the messages that came before it.
    seen = seen_in(button(body))
    deps.background.spawn(approve(deps, client, parsed, seen, home=home), name="approve")


@dataclass(frozen=True)
class Opening:
    """A click that opens a modal about a request, by someone the checks let through."""

    approval: Approval
    parsed: tuple[str, str, str | None, str]
    home: bool
    trigger: str

    def metadata(self, **extra: object) -> str:
        """What the modal's submission needs: which request, where it was clicked, and the
        version of it the modal shows (its submission decides that version or nothing)."""
        _, _, channel, approval_id = self.parsed
        seen = {"approval_id": approval_id, "channel": channel, "seen": self.approval.version}
        return json.dumps(seen | extra | {"home": self.home})


async def opening(
    deps: Deps, client: AsyncWebClient, body: dict[str, Any], *, answers: bool = False
) -> Opening | None:
    """The request a modal-opening button is about, if the clicker may decide it (or, with
    `answers`, answer it); else None, the clicker told why."""
    parsed, home = clicked(body), from_home(body)
    trigger = body.get("trigger_id")
    if parsed is None or not isinstance(trigger, str):
        return None
    if await too_fast(deps, client, parsed, home=home):
        return None
    team, user, channel, approval_id = parsed
    facts = facts_for(deps, client, user, channel, home=home)
    check = deps.workflow.check_answerer if answers else deps.workflow.check_decider
    try:
        approval = await check(team, approval_id, user, facts)
        if not answers and seen_in(button(body)) != approval.version:
            raise DecisionRefused("changed", approval)  # a modal of a version it did not show
    except DecisionRefused as refusal:
        await refuse(deps, client, refusal, parsed, home=home)
        return None
    return Opening(approval, parsed, home, trigger)


async def on_edit_approve(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Edit & approve: the call's input in a form from the tool's schema, prefilled with what
    the card showed (bot/listeners/views.py approves with the changes)."""
    await ack()
    if (opened := await opening(deps, client, body)) is None:
        return
    approval = opened.approval
    form = deps.workflow.edit_form(approval.request.tool, approval.current.input)
    if form is None:
        await tell(deps, client, opened.parsed, blocks.not_editable(approval), home=opened.home)
        return
    view = blocks.edit_modal(approval, forms.form_blocks(form, approval.current.input))
    view["private_metadata"] = opened.metadata()
    await client.views_open(trigger_id=opened.trigger, view=view)


async def on_deny(ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps) -> None:
    """Ask for a reason in a modal (bot/listeners/views.py records the denial)."""
    await ack()
    if (opened := await opening(deps, client, body)) is None:
        return
    view = blocks.deny_modal(opened.approval)
    view["private_metadata"] = opened.metadata()
    await client.views_open(trigger_id=opened.trigger, view=view)


async def on_show_request(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """The whole input of a card that had to shorten it, in a modal."""
    await ack()
    parsed, home = clicked(body), from_home(body)
    trigger = body.get("trigger_id")
    if parsed is None or not isinstance(trigger, str):
        return
    if await too_fast(deps, client, parsed, home=home):
        return
    team, _, _, approval_id = parsed
    approval = await deps.workflow.approval(team, approval_id)
    if approval is None:
        await tell(deps, client, parsed, blocks.refusal_text("not_found", None), home=home)
        return
    await client.views_open(trigger_id=trigger, view=blocks.full_request_modal(approval))


async def on_show_conversation(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """The conversation that led to a request, in a modal, for those who may decide it."""
    await ack()
    parsed, home = clicked(body), from_home(body)
    trigger = body.get("trigger_id")
    if parsed is None or not isinstance(trigger, str):
        return
    if await too_fast(deps, client, parsed, home=home):
        return
    view = await conversation_view(deps, client, parsed, page=0, home=home)
    if view is not None:
        await client.views_open(trigger_id=trigger, view=view)


async def on_conversation_page(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Another page of that conversation, in the same modal (checked again: pages are
    not a way around who may see it)."""
    await ack()
    parsed, actions = in_modal(body), body.get("actions")
    value = actions[0].get("value") if isinstance(actions, list) and actions else None
    view_id = obj(body.get("view")).get("id")
    approval_id, _, page = str(value).rpartition(":")
    if parsed is None or parsed[3] != approval_id or not page.isdigit():
        return
    view = await conversation_view(deps, client, parsed, page=int(page), home=from_home(body))
    if view is not None and isinstance(view_id, str):
        await client.views_update(view_id=view_id, view=view)


def in_modal(body: dict[str, Any]) -> tuple[str, str, str | None, str] | None:
    """(team, user, channel, approval id) of an action in, or the submission of, one of our
    modals: the approval and the channel it was opened from are in its private_metadata,
    which only we write."""
    view = obj(body.get("view"))
    user = obj(body.get("user")).get("id")
    team = obj(body.get("team")).get("id") or obj(body.get("user")).get("team_id")
    try:
        meta = obj(json.loads(view.get("private_metadata") or ""))
    except (TypeError, ValueError):
        return None
    approval_id, channel = meta.get("approval_id"), meta.get("channel")
    if not (slack_id(user) and slack_id(team) and isinstance(approval_id, str)):
        return None
    if not APPROVAL_ID.match(approval_id) or not (channel is None or slack_id(channel)):
        return None
    return team, user, channel, approval_id


async def conversation_view(
    deps: Deps,
    client: AsyncWebClient,
    parsed: tuple[str, str, str | None, str],
    *,
    page: int,
    home: bool,
) -> dict[str, Any] | None:
    """The modal's page `page`, or None (and the person told why) if they may not see it."""
    team, user, channel, approval_id = parsed
    facts = facts_for(deps, client, user, channel, home=home)
    try:
        approval, lines = await deps.workflow.conversation(team, approval_id, user, facts)
    except DecisionRefused as refusal:
        text = blocks.conversation_refusal(refusal.reason, refusal.approval)
        await tell(deps, client, parsed, text, home=home)
        return None
    pages = blocks.conversation_pages(lines)
    return blocks.conversation_modal(approval, pages, min(page, len(pages) - 1), channel=channel)


async def on_answer(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, deps: Deps
) -> None:
    """Answer a question in a modal: free text, or the form its tool gives."""
    await ack()
    if (opened := await opening(deps, client, body, answers=True)) is None:
        return
    form = deps.workflow.question_form(opened.approval.request.tool)
    view = blocks.answer_modal(opened.approval, forms.form_blocks(form) if form else None)
    view["private_metadata"] = opened.metadata()
    await client.views_open(trigger_id=opened.trigger, view=view)


def register(app: AsyncApp) -> None:
    app.action("answer")(on_answer)
    app.action("approve")(on_approve)
    app.action("edit_approve")(on_edit_approve)
    app.action("deny")(on_deny)
    app.action("show_request")(on_show_request)
    app.action("show_conversation")(on_show_conversation)
    app.action("conversation_page")(on_conversation_page)
