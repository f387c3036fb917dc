"""The App Home tab: each person's inbox, standing approvals to revoke, own requests and (for
admins) the policy, kept fresh as approvals change.

Published per person with views.publish. Its buttons are the approval card's own (the same
action ids and values, bot/card.py), so a decision made here goes through the very
listeners, rules and writes a card's does (bot/listeners/actions.py); and on one's own
requests, the Withdraw of the note in their thread, likewise. Which Home shows
what is remembered per process, boundedly: a replica refreshes only the Homes it published.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent.workflow import Workflow
from bot.background import Background
from bot.block_kit import (
    SECTION_MAX,
    Block,
    chunks,
    code,
    context,
    date,
    link,
    mention,
    section,
    summary,
    utc,
)
from bot.card import (
    answer_button,
    calls_ran,
    decision_buttons,
    quorum_text,
    revoke_button,
    withdraw_button,
)
from bot.people import People
from bot.safe_text import escape, fit
from storage.domain import Approval, Approved, Thread

log = logging.getLogger(__name__)

ITEMS = 10  # per list; the rest are counted ("and 4 more")
INBOX_SCAN = 100  # oldest pending requests looked at for one person's inbox
OWN_SCAN = 50  # of one person's own open requests
GRANTS_SCAN = 50  # live standing approvals looked at for one person's Revoke buttons
DEBOUNCE = 1.5  # seconds: changes within it publish a person's Home once
KEPT = 10_000  # people whose Home this process remembers; the least recent are forgotten
RECENT = 15 * 60.0  # seconds: a Home opened longer ago is not refreshed (it is on reopening)
PUBLISHES_PER_MINUTE = 60  # refreshes by this process; the rest wait (views.publish: Tier 4)
MAX_BLOCKS = 100  # Slack's limit for a Home view
Key = tuple[str, str]  # (team, user)
Links = Callable[[AsyncWebClient, Thread], Awaitable[str | None]]


def _ago(at: datetime) -> str:
    """'5 minutes ago', in the reader's Slack (the fallback is UTC)."""
    u = utc(at)
    return f"<!date^{int(u.timestamp())}^{{ago}}|{u:%Y-%m-%d %H:%M} UTC>"


def _question(a: Approval) -> str | None:
    asked = a.request.input.get("question")
    return fit(asked, 300)[0] if isinstance(asked, str) else None


def hidden_mark(a: Approval) -> str:
    """`  ·  🔒 hidden by policy: password`: a request's redacted fields, after its summary."""
    if not a.request.secrets:
        return ""
    names = ", ".join(code(escape(s.name)) for s in a.request.secrets[:5])
    return f"  ·  🔒 hidden by policy: {names}"


def inbox_item(a: Approval, *, card_link: str | None, editable: bool) -> list[Block]:
    """One request to decide: tool, requester, key arguments, age; the card's buttons."""
    r = a.request
    who = f"{code(r.tool)} for {mention(r.requester)}"
    line = f"{who}  ·  asked {_ago(r.requested_at)}"
    if shown := link(card_link, "open the card"):
        line += f"  ·  {shown}"
    if (asked := _question(a)) is not None:
        line += f"\n_The agent asks:_ {asked}"
    elif taste := summary(a.current.input):  # the version a click decides
        line += f"\n{taste}" + hidden_mark(a)
    if a.edit is not None:
        line += f"\n✏️ _changed by {mention(a.edit.by)} (version {a.version})_"
    if r.approvals_needed > 1:
        line += f"\n{quorum_text(a)}"
    buttons = [answer_button(a)] if r.question else decision_buttons(a, editable=editable)
    # Block ids are unique within a view: one per request.
    return [
        section(line),
        {"type": "actions", "block_id": f"home:{a.id}", "elements": buttons},
    ]


def standing_item(a: Approval, *, card_link: str | None) -> list[Block]:
    """One live standing approval its reader may end: tool, requester, until when, how many
    calls ran under it; the card's Revoke."""
    r, g = a.request, a.standing
    assert g is not None
    line = f"{code(r.tool)} for {mention(r.requester)}  ·  until {date(g.until)}"
    if shown := link(card_link, "open the card"):
        line += f"  ·  {shown}"
    line += f"\n{calls_ran(g.uses)}"
    if isinstance(a.decision, Approved):
        line += f" (granted by {mention(a.decision.by)})"
    return [
        section(line),
        {"type": "actions", "block_id": f"home-standing:{a.id}", "elements": [revoke_button(a)]},
    ]


def status(a: Approval, turn_waits: bool) -> str:
    """Where one's own request is: waiting, how many approved, asked, or running."""
    r = a.request
    if a.decision is not None:
        return "decided; waits for the turn's other requests" if turn_waits else "running"
    if r.asks == "requester":
        return "the agent asks you: waiting for your answer"
    if r.question:
        return "question waiting for an answer"
    if r.approvals_needed > 1:
        return f"{len(a.votes)} of {r.approvals_needed} approvals"
    return "waiting for approval"


def own_item(a: Approval, *, thread_link: str | None, turn_waits: bool) -> Block:
    """One of the person's own requests: where it is, and while it waits, theirs to answer
    (a question to them) or to withdraw (a request for approval). `thread_link`: its thread,
    or for a gateway request (no thread behind it), its card."""
    r, via = a.request, a.request.context.via
    line = f"{code(r.tool)}  ·  asked {_ago(r.requested_at)}  ·  *{status(a, turn_waits)}*"
    if shown := link(thread_link, "the thread" if via is None else "the card"):
        line += f"  ·  {shown}"
    if via is not None:
        line += f"  ·  through key `{escape(via.key)}`"
    if (asked := _question(a)) is not None:
        line += f"\n{asked}"
    elif taste := summary(a.current.input):  # what will run, edits included
        line += f"\n{taste}" + hidden_mark(a)
    item = section(line)
    if r.asks == "requester" and a.decision is None:  # theirs to answer, here too
        item["accessory"] = answer_button(a)
    elif not r.question and a.decision is None:  # theirs to take back
        item["accessory"] = withdraw_button(a)
    return item


def _where(a: Approval) -> Thread | None:
    """Where one's own request is seen: its thread, or a gateway request's card."""
    if a.request.context.via is None:
        return a.thread
    return Thread("", a.card.channel, a.card.ts) if a.card and a.card.ts else None


def _more(shown: int, found: int, scanned: int) -> Block | None:
    if found <= shown:
        return None
    plus = "+" if found >= scanned else ""
    return context(f"…and {found - shown}{plus} more — see `/approvals pending`")


def home_view(
    *,
    inbox: Sequence[Approval],
    own: Sequence[Approval],
    grants: Sequence[Approval] = (),
    card_links: Mapping[str, str | None],
    thread_links: Mapping[str, str | None],
    editable: Callable[[str], bool],
    policy: str | None,
    notice: str | None,
) -> dict[str, Any]:
    """The whole Home tab of one person (at most MAX_BLOCKS blocks)."""
    out: list[Block] = []
    if notice:
        out.append(section(f"⚠️ {notice}"))
    out.append({"type": "header", "text": {"type": "plain_text", "text": "Waiting for you"}})
    for a in inbox[:ITEMS]:
        out += inbox_item(a, card_link=card_links.get(a.id), editable=editable(a.request.tool))
    if not inbox:
        out.append(context("_Nothing waits for your decision._"))
    if more := _more(ITEMS, len(inbox), INBOX_SCAN):
        out.append(more)
    if grants:
        title = "Standing approvals you may revoke"
        out += [
            {"type": "divider"},
            {"type": "header", "text": {"type": "plain_text", "text": title}},
        ]
        for a in grants[:ITEMS]:
            out += standing_item(a, card_link=card_links.get(a.id))
        if len(grants) > ITEMS:
            out.append(context(f"…and {len(grants) - ITEMS} more — on their cards"))
    out += [
        {"type": "divider"},
        {"type": "header", "text": {"type": "plain_text", "text": "Your requests"}},
    ]
    waiting_turns = {a.turn_id for a in own if a.decision is None}
    for a in own[:ITEMS]:
        turn_waits = a.turn_id in waiting_turns
        out.append(own_item(a, thread_link=thread_links.get(a.id), turn_waits=turn_waits))
    if not own:
        out.append(context("_None of your requests is open._"))
    if more := _more(ITEMS, len(own), OWN_SCAN):
        out.append(more)
    if policy is not None:
        out += [
            {"type": "divider"},
            {"type": "header", "text": {"type": "plain_text", "text": "Policy (admins)"}},
        ]
        out += [section(c) for c in chunks(policy, SECTION_MAX)]
    if len(out) > MAX_BLOCKS:
        out = [*out[: MAX_BLOCKS - 1], context("…the rest: `/approvals list`")]
    return {"type": "home", "blocks": out}


class HomeTabs:
    """Publishes Home tabs and refreshes those that show a request when it changes.

    Remembers, per process and for at most KEPT people, which requests each Home showed,
    and a notice for the person (a refused click from the Home) until they open it again.
    Changes within DEBOUNCE publish each affected Home once, and only the Homes opened in
    the last RECENT seconds; at most PUBLISHES_PER_MINUTE refreshes a minute, so a busy
    channel cannot spend Slack's views.publish limit (those over it wait their turn).
    """

    def __init__(
        self,
        *,
        workflow: Workflow,
        people: People,
        background: Background,
        links: Links,
        summary: Callable[[Workflow, str], Awaitable[str]],
        delay: float = DEBOUNCE,
        recent: float = RECENT,
        per_minute: int = PUBLISHES_PER_MINUTE,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._workflow = workflow
        self._people = people
        self._background = background
        self._links = links
        self._summary = summary
        self._delay = delay
        self._recent = recent
        self._per_minute = per_minute
        self._now = now
        self._opened: dict[Key, float] = {}  # when each remembered Home was last opened
        self._spent: deque[float] = deque()  # when the refreshes of the last minute began
        self._shown: OrderedDict[Key, frozenset[str]] = OrderedDict()
        self._watchers: dict[str, set[Key]] = {}  # approval id -> Homes showing it
        self._notices: dict[Key, str] = {}
        self._due: set[Key] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._locks: dict[Key, tuple[asyncio.Lock, int]] = {}

    async def publish(
        self, client: AsyncWebClient, team: str, user: str, *, opened: bool = False
    ) -> None:
        """Build and publish `user`'s Home now; `opened`: they just opened it (the notice
        of an earlier click goes)."""
        key = (team, user)
        if opened:
            self._notices.pop(key, None)
            self._opened[key] = self._now()
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        held = False
        try:
            # One at a time per person: the last built is the last shown. Waited for without
            # a work slot: the holder gives its slot up while Slack answers (bot/app.py), and
            # must find one free when it comes back, not all of them held by its waiters.
            async with self._background.outside():
                await lock.acquire()
                held = True
            await self._publish(client, team, user)
        finally:
            if held:
                lock.release()
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    async def _publish(self, client: AsyncWebClient, team: str, user: str) -> None:
        facts = self._people.deciding(client, user, team=team, clicked_in=None, home=True)
        inbox = await self._workflow.reads.inbox(team, user, facts, scan=INBOX_SCAN)
        grants = await self._workflow.reads.revocable(team, user, facts, scan=GRANTS_SCAN)
        own = await self._workflow.reads.requested_by(team, user, limit=OWN_SCAN)
        admin = await self._people.is_admin(client, user, team)
        policy = await self._summary(self._workflow, team) if admin else None
        cards = [
            (a.id, Thread("", a.card.channel, a.card.ts))
            for a in (*inbox[:ITEMS], *grants[:ITEMS])
            if a.card and a.card.ts
        ]
        threads = [(a.id, t) for a in own[:ITEMS] if (t := _where(a)) is not None]
        found = await asyncio.gather(*(self._links(client, t) for _, t in (*cards, *threads)))
        card_links = dict(zip([i for i, _ in cards], found[: len(cards)], strict=True))
        thread_links = dict(zip([i for i, _ in threads], found[len(cards) :], strict=True))
        view = home_view(
            inbox=inbox,
            own=own,
            grants=grants,
            card_links=card_links,
            thread_links=thread_links,
            editable=lambda tool: self._workflow.runtime.edit_form(tool) is not None,
            policy=policy,
            notice=self._notices.get((team, user)),
        )
        try:
            await client.views_publish(user_id=user, view=view)
        except SlackApiError as exc:
            log.warning("could not publish the Home of %s: %s", user, exc.response.get("error"))
            return
        self._remember(
            (team, user), {a.id for a in (*inbox[:ITEMS], *grants[:ITEMS], *own[:ITEMS])}
        )

    def _remember(self, key: Key, ids: set[str]) -> None:
        self._forget(key)
        self._shown[key] = frozenset(ids)
        for approval_id in ids:
            self._watchers.setdefault(approval_id, set()).add(key)
        while len(self._shown) > KEPT:
            oldest = next(iter(self._shown))
            self._forget(oldest)
            self._notices.pop(oldest, None)
            self._opened.pop(oldest, None)

    def _forget(self, key: Key) -> None:
        for approval_id in self._shown.pop(key, ()):
            watching = self._watchers.get(approval_id)
            if watching is not None:
                watching.discard(key)
                if not watching:
                    del self._watchers[approval_id]

    async def tell(self, client: AsyncWebClient, team: str, user: str, text: str) -> None:
        """Say something to the person on their Home (where they clicked), at its top."""
        self._notices[(team, user)] = text
        self._opened[(team, user)] = self._now()  # they are looking at it
        await self.publish(client, team, user)

    def changed(self, client: AsyncWebClient, approval: Approval) -> None:
        """A request changed state: refresh, once DEBOUNCE has passed, the Homes this
        process published that show it, and its requester's."""
        requester = (approval.thread.team_id, approval.request.requester)
        due = set(self._watchers.get(approval.id, ()))
        if requester in self._shown:
            due.add(requester)
        since = self._now() - self._recent
        due = {key for key in due if self._opened.get(key, since - 1) >= since}
        if not due:
            return
        self._due |= due
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self._flush, client)

    def _flush(self, client: AsyncWebClient) -> None:
        self._timer = None
        now = self._now()
        while self._spent and self._spent[0] <= now - 60:
            self._spent.popleft()
        for _ in range(min(len(self._due), self._per_minute - len(self._spent))):
            team, user = self._due.pop()
            self._spent.append(now)
            self._background.spawn(self.publish(client, team, user), name="home")
        if self._due:  # over the limit: the rest when the oldest refresh is a minute old
            wait = max(self._delay, self._spent[0] + 60 - now)
            self._timer = asyncio.get_running_loop().call_later(wait, self._flush, client)

    def close(self) -> None:
        """Stop a refresh that is waiting for its time (at shutdown)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
