"""Facts about Slack people and channels that say who may decide: admins, group members,
whether an approver channel is private. Cached, since users.info, usergroups.users.list and
conversations.info are rate limited, but briefly: a demoted admin, a member removed from an
approver group or a channel made public loses the power within CACHE_TTL.

What Slack says of a person (a guest? an admin? of which organisation?) is also kept for
every replica in the people directory (storage/people.py), when one is set up: users.list
fills it every sync, Slack's user_change and team_join events keep it current in between,
and users.info is asked only of a person it does not know (or knew too long ago)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent.policy import ApproverFacts, Policy
from agent.scope import Outside
from bot.background import detached
from storage.domain import Approval
from storage.people import PeopleStore

log = logging.getLogger(__name__)
T = TypeVar("T")

CACHE_TTL = timedelta(seconds=60)
CACHE_KEPT = 10_000  # entries per cache at most: past it the oldest go
# What users.info's `user` is kept for (`is_admin`, `outsider_kind`): the rest of it (the
# profile, its image links, the time zone) is a few KB a person that nothing here reads.
USER_FIELDS = (
    "team_id",
    "is_admin",
    "is_owner",
    "is_primary_owner",
    "is_restricted",
    "is_ultra_restricted",
    "is_stranger",
)
MEMBER_PAGES = 10  # of conversations.members (1000 each): an approver channel is smaller
SYNC_PAGE = 200  # people a users.list page (Slack advises at most 200)
Outsider = Literal["guest", "external"]


@dataclass(frozen=True)
class Directory:
    """The people directory, synced about `every` by one replica (whichever claims it)."""

    store: PeopleStore
    every: timedelta

    @property
    def trusted(self) -> timedelta:
        """How long a row is believed without Slack saying it again: a sync refreshes every
        member's row, and a row outlives one failed sync, not two (then users.info)."""
        return 2 * self.every


class People:
    def __init__(
        self,
        *,
        admin_users: Collection[str],
        clock: Callable[[], datetime],
        ttl: timedelta = CACHE_TTL,
        outside: Outside = contextlib.nullcontext,
        directory: Directory | None = None,
    ) -> None:
        """`outside`: where a lookup another asker started is waited for (bot/background.py:
        without a work slot; the lookup itself runs detached, needing none). `directory`:
        where people are looked up before users.info (None: users.info alone)."""
        self._admins = frozenset(admin_users)
        self._directory = directory
        self._outside = outside
        self._clock = clock
        self._ttl = ttl
        self._user_cache: dict[str, tuple[datetime, dict[str, Any] | None]] = {}
        self._asking: dict[str, asyncio.Task[dict[str, Any] | None]] = {}  # under way
        self._group_cache: dict[str, tuple[datetime, frozenset[str]]] = {}
        self._private_cache: dict[str, tuple[datetime, bool]] = {}
        self._team: str | None = None  # the bot token's workspace, as auth.test said it
        self._member_cache: dict[str, tuple[datetime, frozenset[str]]] = {}

    def _keep(self, cache: dict[str, tuple[datetime, T]], key: str, value: T) -> None:
        """Cache `value` for the TTL, in a cache of at most CACHE_KEPT entries.

        An expired entry is never read again (it is asked afresh), so it goes now rather
        than when the cache is full: entries are kept in the order they expire (one TTL for
        all, each re-inserted as the newest), so those expired are the first ones. The cache
        then holds the people seen in the last TTL, not the last CACHE_KEPT of them."""
        now = self._clock()
        cache.pop(key, None)  # re-inserted: the newest
        while cache and next(iter(cache.values()))[0] <= now:
            del cache[next(iter(cache))]  # expired
        while len(cache) >= CACHE_KEPT:
            del cache[next(iter(cache))]  # the oldest
        cache[key] = (now + self._ttl, value)

    async def is_admin(self, client: AsyncWebClient, user: str, team: str | None = None) -> bool:
        """ADMIN_USERS, or a workspace admin or owner according to users.info; never a guest
        or a person of another organisation (Slack Connect)."""
        if user in self._admins:
            return True
        info = await self._user(client, user, team)
        if info is None or outsider(info, team):
            return False  # fail closed: no policy change on a doubt
        return bool(info.get("is_admin") or info.get("is_owner") or info.get("is_primary_owner"))

    async def is_outsider(self, client: AsyncWebClient, user: str, team: str | None) -> bool:
        """Whether `user` is a guest or of another organisation (True when Slack cannot say)."""
        info = await self._user(client, user, team)
        return info is None or outsider(info, team)

    async def outsider_kind(
        self, client: AsyncWebClient, user: str, team: str | None
    ) -> Outsider | None:
        """Whether `user` is a guest or of another organisation, for a card to say so of its
        requester; None when neither, or when Slack cannot say."""
        info = await self._user(client, user, team)
        return None if info is None else outsider_kind(info, team)

    def warm(self, client: AsyncWebClient, user: str, team: str | None) -> None:
        """Start looking `user` up now, for whoever asks next: a card for them, posted once
        the model has answered, then need not wait for users.info (bot/delivery.py)."""
        cached = self._user_cache.get(user)
        if not (cached and cached[0] > self._clock()):
            self._lookup(client, user, team)

    async def _user(
        self, client: AsyncWebClient, user: str, team: str | None
    ) -> dict[str, Any] | None:
        cached = self._user_cache.get(user)
        if cached and cached[0] > self._clock():
            return cached[1]
        # Shielded: one asker cancelled must not cancel the lookup the others wait on.
        async with self._outside():
            return await asyncio.shield(self._lookup(client, user, team))

    def _lookup(
        self, client: AsyncWebClient, user: str, team: str | None
    ) -> asyncio.Task[dict[str, Any] | None]:
        """The lookup of `user` under way, or a new one: one, however many ask meanwhile (a
        warm one and the card's; two clicks of one person)."""
        if (asking := self._asking.get(user)) is None:
            asking = self._asking[user] = detached(self._ask(client, user, team))
            asking.add_done_callback(lambda done: self._asked(user, done))
        return asking

    def _asked(self, user: str, done: asyncio.Task[dict[str, Any] | None]) -> None:
        if self._asking.get(user) is done:
            del self._asking[user]
        if not done.cancelled():
            done.exception()  # retrieved: a warm lookup nobody awaited may have failed

    async def _ask(
        self, client: AsyncWebClient, user: str, team: str | None
    ) -> dict[str, Any] | None:
        """The directory's word on `user` (asked by `team`), else users.info's (kept there)."""
        if team is not None and (known := await self._known(team, user)) is not None:
            self._keep(self._user_cache, user, known)
            return known
        at = self._clock()
        try:
            found: dict[str, Any] = (await client.users_info(user=user))["user"]
        except SlackApiError as exc:
            log.warning("users.info failed for %s: %s", user, exc.response.get("error"))
            return None
        info = user_facts(found)
        self._keep(self._user_cache, user, info)
        if team is not None:
            await self._record(team, {user: info}, at)
        return info

    async def _known(self, team: str, user: str) -> dict[str, Any] | None:
        """The directory's row of `user`, if it has one recent enough to believe."""
        if self._directory is None:
            return None
        since = self._clock() - self._directory.trusted
        try:
            return await self._directory.store.fresh(team, user, since=since)
        except Exception as exc:  # the database: Slack can still say
            log.warning("people directory unavailable: %r", exc)
            return None

    async def _record(self, team: str, people: dict[str, dict[str, Any]], at: datetime) -> None:
        if self._directory is None:
            return
        try:
            await self._directory.store.record(team, people, at)
        except Exception as exc:  # the database: the next asker asks Slack again
            log.warning("could not record %d person(s) in the directory: %r", len(people), exc)

    async def heard(self, team: str, user: Any, *, sent: datetime | None = None) -> None:
        """What a user_change or team_join event says of a person: kept in the directory
        for every replica (unless it has heard something newer of them since: a retried
        delivery comes minutes late), and what this process kept of them forgotten, so its
        next question reads the newest word. `sent`: the event's time, in whole seconds, so
        its word counts from the end of that second (a sync's page read within it is taken
        as older), or from now if that is sooner."""
        if not (isinstance(user, dict) and isinstance(user.get("id"), str)):
            return
        now = self._clock()
        at = now if sent is None else min(now, sent + timedelta(seconds=1))
        await self._record(team, {user["id"]: user_facts(user)}, at)
        self._user_cache.pop(user["id"], None)

    async def sync(self, client: AsyncWebClient) -> int | None:
        """Record everyone users.list lists in the directory, a page at a time: how many;
        None when the sync is not due, or another replica has it (one lists the workspace
        for all). Slack's rate limits are waited out (bot/app.py); any other error ends the
        pass, and the sync is due again at once."""
        if (directory := self._directory) is None:
            return 0
        if self._team is None:  # a token's workspace never changes: asked once a process
            self._team = str((await client.auth_test())["team_id"])
        team = self._team
        now = self._clock()
        due = now + directory.every
        if not await directory.store.claim_sync(team, now=now, next_due=due):
            return None
        try:
            return await self._listed(client, directory, team)
        except Exception:
            await directory.store.release_sync(team, now=self._clock(), next_due=due)
            raise

    async def _listed(self, client: AsyncWebClient, directory: Directory, team: str) -> int:
        cursor, seen = None, 0
        while True:
            at = self._clock()
            page = await client.users_list(limit=SYNC_PAGE, cursor=cursor)
            members = [m for m in page.get("members") or [] if isinstance(m, dict)]
            listed = {m["id"]: user_facts(m) for m in members if isinstance(m.get("id"), str)}
            await directory.store.record(team, listed, at)
            seen += len(listed)
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                return seen

    async def group_members(self, client: AsyncWebClient, group: str) -> frozenset[str]:
        cached = self._group_cache.get(group)
        if cached and cached[0] > self._clock():
            return cached[1]
        try:
            users = (await client.usergroups_users_list(usergroup=group))["users"]
        except SlackApiError as exc:
            log.warning("usergroups.users.list failed for %s: %s", group, exc.response.get("error"))
            return frozenset()
        members = frozenset(users)
        self._keep(self._group_cache, group, members)
        return members

    async def is_private(self, client: AsyncWebClient, channel: str) -> bool:
        """Whether only invited members can join `channel`; False when Slack cannot say
        (fail closed: a channel anyone may join is no approver group)."""
        cached = self._private_cache.get(channel)
        if cached and cached[0] > self._clock():
            return cached[1]
        try:
            info = (await client.conversations_info(channel=channel))["channel"]
        except SlackApiError as exc:
            log.warning("conversations.info failed for %s: %s", channel, exc.response.get("error"))
            return False
        private = bool(info.get("is_private"))
        self._keep(self._private_cache, channel, private)
        return private

    async def channel_members(self, client: AsyncWebClient, channel: str) -> frozenset[str]:
        """Who is in `channel` (empty when Slack cannot say: fail closed)."""
        cached = self._member_cache.get(channel)
        if cached and cached[0] > self._clock():
            return cached[1]
        members: set[str] = set()
        cursor = None
        try:
            for _ in range(MEMBER_PAGES):
                page = await client.conversations_members(
                    channel=channel, limit=1000, cursor=cursor
                )
                members.update(page["members"])
                cursor = (page.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
        except SlackApiError as exc:
            log.warning(
                "conversations.members failed for %s: %s", channel, exc.response.get("error")
            )
            return frozenset()
        found = frozenset(members)
        self._keep(self._member_cache, channel, found)
        return found

    async def approver_facts(
        self,
        client: AsyncWebClient,
        user: str,
        policy: Policy,
        *,
        clicked_in: str | None,
        card_channel: str | None,
        escalation_channel: str | None = None,
        home: bool = False,
        team: str | None = None,
    ) -> ApproverFacts:
        """Groups the policy names that `user` is in, whether they clicked on the card's own
        channel (or, once escalated, the escalation channel's card), and whether such a
        channel, whose members decide when the policy names nobody, is public.

        `home`: the click came from the Home tab, which is in no channel; there, being a
        member of that private channel is what clicking in it proves (asked of Slack only
        when the policy leaves the decision to the channel's members).
        """
        named = {*policy.approver_groups, *policy.escalate_groups}
        groups = frozenset([g for g in named if user in await self.group_members(client, g)])
        in_channel = clicked_in is not None and clicked_in == card_channel
        public = False
        if not policy.names_approvers and card_channel is not None:
            public = not await self.is_private(client, card_channel)
            if home and not public:
                in_channel = user in await self.channel_members(client, card_channel)
        in_escalation = clicked_in is not None and clicked_in == escalation_channel
        guest = await self.is_outsider(client, user, team)
        public_escalation = False
        if escalation_channel and not (policy.escalate_users or policy.escalate_groups):
            public_escalation = not await self.is_private(client, escalation_channel)
            if home and not public_escalation:
                members = await self.channel_members(client, escalation_channel)
                in_escalation = user in members
        return ApproverFacts(
            groups=groups,
            in_channel=in_channel,
            public_channel=public,
            in_escalation_channel=in_escalation,
            public_escalation_channel=public_escalation,
            outsider=guest,
        )

    def deciding(
        self,
        client: AsyncWebClient,
        user: str,
        *,
        team: str | None,
        clicked_in: str | None,
        home: bool = False,
    ) -> Callable[[Approval, Policy], Awaitable[ApproverFacts]]:
        """What Slack knows about `user` of `team`, who clicked in `clicked_in` (or on the Home
        tab), asked once the workflow knows the request and its policy; but whether they are
        a guest, which every decision asks, is looked up from now on, beside the request's
        read."""
        self.warm(client, user, team)

        async def facts(approval: Approval, policy: Policy) -> ApproverFacts:
            card_channel = approval.card.channel if approval.card else None
            escalated = approval.escalation if approval.escalated else None
            return await self.approver_facts(
                client,
                user,
                policy,
                clicked_in=clicked_in,
                card_channel=card_channel,
                escalation_channel=escalated.channel if escalated else None,
                home=home,
                team=approval.thread.team_id,
            )

        return facts


def user_facts(user: dict[str, Any]) -> dict[str, Any]:
    """What is kept of a Slack user object (USER_FIELDS)."""
    return {k: user[k] for k in USER_FIELDS if k in user}


def outsider(info: dict[str, Any], team: str | None) -> bool:
    """A guest, or a person of another organisation (`outsider_kind`): neither may approve
    or administer, whatever else they are."""
    return outsider_kind(info, team) is not None


def outsider_kind(info: dict[str, Any], team: str | None) -> Outsider | None:
    """ "guest" (`is_restricted`: multi-channel, `is_ultra_restricted`: single-channel),
    "external" (a person whose home is another organisation: a Slack Connect channel's
    member), or None."""
    if info.get("is_restricted") or info.get("is_ultra_restricted"):
        return "guest"
    home = info.get("team_id")
    if info.get("is_stranger") or (team is not None and home is not None and home != team):
        return "external"
    return None
