"""Helpers the listeners share: payload checks, the parsed Interaction, what follows a
decision.

A click or a modal's submission is parsed into an Interaction; after a decision the turn
resumes and the card is redrawn (`settled`).
Bolt hands payloads on as they came. Slack's ids are short upper-case letters and digits,
and a message ts is digits, a dot and digits. Anything else (another type, a NUL byte, a
megabyte) is refused here, before it can reach the database, whose id columns hold 32
characters and no NUL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from slack_sdk.web.async_client import AsyncWebClient

from agent.outcomes import Decided
from agent.policy import ApproverFacts, Policy
from bot.deps import Deps
from storage.domain import Approval, Approved, NotStarted

SLACK_ID = re.compile(r"[A-Z0-9]{1,32}")  # team, enterprise, user and channel ids
MESSAGE_TS = re.compile(r"[0-9]{1,16}\.[0-9]{1,15}")


def obj(value: object) -> dict[str, Any]:
    """A field that should be an object; {} when it is anything else."""
    return value if isinstance(value, dict) else {}


def slack_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and SLACK_ID.fullmatch(value) is not None


def message_ts(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and MESSAGE_TS.fullmatch(value) is not None


APPROVAL_ID = re.compile(r"^[0-9a-f-]{8,64}$")
# A decision button names the version of the request its view showed: `<id>~<version>`.
AS_SEEN = re.compile(r"^(?P<id>[0-9a-f-]{8,64})(?:~(?P<seen>[0-9]{1,19}))?$")
VERSION_MAX = 2**31 - 1  # the column's range; anything above names no version there is


@dataclass(frozen=True)
class Interaction:
    """A click on, or a modal submitted about, one request: by whom, in which workspace,
    in which channel (None: in none, as on the Home tab or in a modal)."""

    team: str
    user: str
    channel: str | None
    approval_id: str


def clicked(body: dict[str, Any]) -> Interaction | None:
    """The Interaction of a block_actions payload, or None if malformed."""
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
    return Interaction(team, user, channel if slack_id(channel) else None, match["id"])


def in_modal(body: dict[str, Any]) -> Interaction | None:
    """The Interaction of an action in, or the submission of, one of our modals: the
    approval and the channel it was opened from are in its private_metadata, which only we
    write."""
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
    return Interaction(team, user, channel, approval_id)


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


def facts_for(
    deps: Deps, client: AsyncWebClient, asked: Interaction, *, home: bool = False
) -> Callable[[Approval, Policy], Awaitable[ApproverFacts]]:
    """What Slack knows about the clicker, asked only once the workflow knows the request."""
    return deps.people.deciding(
        client, asked.user, team=asked.team, clicked_in=asked.channel, home=home
    )


async def settled(deps: Deps, client: AsyncWebClient, decided: Decided) -> None:
    """After a decision or an answer: resume the turn if that was the last thing it waited
    for (first: the requester waits on it), then redraw the card.

    An Approve that resumes the turn here redraws its card once its call has run, saying
    so (a moment later, usually), or after REDRAW_WITHIN if the call takes longer: one
    redraw, not "Approved" and then "Ran." (the resume's own, as drawn already, is skipped).
    It waits for the turn's reply to be out, up to REPLY_FIRST: the requester waits on the
    reply, nobody waits on the card.
    """
    approval, ran = decided.approval, None
    if decided.turn_ready:
        turn_id = decided.turn_id
        if runs_here(approval):
            ran = Ran(approval)
            deps.background.spawn(redraw_when_run(deps, client, ran), name="redraw")

        async def resume() -> None:
            streams = deps.delivery.streams(client)
            on_ran = ran.done if ran is not None else None
            resumed = await deps.workflow.turns.resume(
                turn_id, on_text=streams, on_ran=on_ran, claim=decided.claim
            )
            try:
                if resumed is not None:
                    await deps.delivery.resumed(client, resumed, streams)
                await streams.close_rest()
            finally:
                if ran is not None:
                    ran.replied.set()

        deps.background.spawn(resume(), name=f"resume {turn_id}")
    if ran is None:
        # As the decision's write returned it (no read): what changes it next, the call
        # running, is the resume's, which redraws the card itself when it ends.
        await deps.delivery.refresh_card(client, approval, current=True)


REDRAW_WITHIN = 2.0  # seconds an approved call's card waits for the call to have run
# Seconds it then waits for the turn's reply to be out first. Drawn at once, the redraw
# (Block Kit and a chat.update: about 0.6 ms of the loop here) ran between the call and the
# model's answer, and a quick reply waited for it (at one conversation, alternated
# conversation by conversation, Approve → reply p50 5% slower). A slower model's card is
# redrawn while it thinks, a tenth of a second after the call ran.
REPLY_FIRST = 0.1


def runs_here(approval: Approval) -> bool:
    """Whether the approval's call runs in the resume this decision starts (an edited one
    is run by the resume itself, untold: its card is redrawn as decided, as before)."""
    return (
        isinstance(approval.decision, Approved)
        and isinstance(approval.execution, NotStarted)
        and approval.edit is None
    )


class Ran:
    """An approval whose call the resume will run, and whether it has (with its record)."""

    def __init__(self, approval: Approval) -> None:
        self.approval = approval
        self.event = asyncio.Event()
        self.replied = asyncio.Event()  # the resume that runs it has ended: its reply is out

    def done(self, finished: Approval) -> None:
        """The resume's `on_ran`: a call of the turn ran, its output recorded."""
        if finished.id == self.approval.id:
            self.approval = finished
            self.event.set()


async def redraw_when_run(deps: Deps, client: AsyncWebClient, ran: Ran) -> None:
    """Redraw the card once its call ran, or after REDRAW_WITHIN (read again then), and once
    the reply is out or REPLY_FIRST has passed; waiting without a work slot."""
    async with deps.background.outside():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REDRAW_WITHIN):
                await ran.event.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REPLY_FIRST):
                await ran.replied.wait()
    await deps.delivery.refresh_card(client, ran.approval, current=ran.event.is_set())
