"""Facts about Slack people and channels that say who may decide: admins, group members,
whether an approver channel is private. Cached, since users.info, usergroups.users.list and
conversations.info are rate limited, but briefly: a demoted admin, a member removed from an
approver group or a channel made public loses the power within CACHE_TTL."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime, timedelta

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent.policy import ApproverFacts, Policy

log = logging.getLogger(__name__)

CACHE_TTL = timedelta(seconds=60)


class People:
    def __init__(
        self,
        *,
        admin_users: Collection[str],
        clock: Callable[[], datetime],
        ttl: timedelta = CACHE_TTL,
    ) -> None:
        self._admins = frozenset(admin_users)
        self._clock = clock
        self._ttl = ttl
        self._admin_cache: dict[str, tuple[datetime, bool]] = {}
        self._group_cache: dict[str, tuple[datetime, frozenset[str]]] = {}
        self._private_cache: dict[str, tuple[datetime, bool]] = {}

    async def is_admin(self, client: AsyncWebClient, user: str) -> bool:
        """ADMIN_USERS, or a workspace admin or owner according to users.info."""
        if user in self._admins:
            return True
        cached = self._admin_cache.get(user)
        if cached and cached[0] > self._clock():
            return cached[1]
        try:
            info = (await client.users_info(user=user))["user"]
        except SlackApiError as exc:
            log.warning("users.info failed for %s: %s", user, exc.response.get("error"))
            return False  # fail closed: no policy change on a doubt
        admin = bool(info.get("is_admin") or info.get("is_owner") or info.get("is_primary_owner"))
        self._admin_cache[user] = (self._clock() + self._ttl, admin)
        return admin

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
        self._group_cache[group] = (self._clock() + self._ttl, members)
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
        self._private_cache[channel] = (self._clock() + self._ttl, private)
        return private

    async def approver_facts(
        self,
        client: AsyncWebClient,
        user: str,
        policy: Policy,
        *,
        clicked_in: str | None,
        card_channel: str | None,
        escalation_channel: str | None = None,
    ) -> ApproverFacts:
        """Groups the policy names that `user` is in, whether they clicked on the card's own
        channel (or, once escalated, the escalation channel's card), and whether such a
        channel, whose members decide when the policy names nobody, is public."""
        named = {*policy.approver_groups, *policy.escalate_groups}
        groups = frozenset([g for g in named if user in await self.group_members(client, g)])
        in_channel = clicked_in is not None and clicked_in == card_channel
        public = False
        if not policy.names_approvers and card_channel is not None:
            public = not await self.is_private(client, card_channel)
        in_escalation = clicked_in is not None and clicked_in == escalation_channel
        public_escalation = False
        if escalation_channel and not (policy.escalate_users or policy.escalate_groups):
            public_escalation = not await self.is_private(client, escalation_channel)
        return ApproverFacts(
            groups=groups,
            in_channel=in_channel,
            public_channel=public,
            in_escalation_channel=in_escalation,
            public_escalation_channel=public_escalation,
        )
