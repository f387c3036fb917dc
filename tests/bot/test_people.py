"""Who is an admin or in a group, from Slack's API, cached for at most CACHE_TTL."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from slack_sdk.web.async_client import AsyncWebClient

from bot import people as people_module
from bot.people import CACHE_TTL, People
from bot.server import Service
from storage.db import SessionFactory
from tests.agent.conftest import Clock
from tests.bot.conftest import SlackClient, settle
from tests.bot.test_e2e import BOSS, ask, reply_in_thread, text_of
from tests.fakes.gemini import FakeGemini, text
from tests.fakes.slack_api import FakeSlack


async def test_a_demoted_admin_loses_the_power_within_a_minute(
    fake_slack: FakeSlack, web_api: AsyncWebClient
) -> None:
    clock = Clock()
    people = People(admin_users=["UCONFIGURED"], clock=clock)
    fake_slack.users["UBOSS"] = {"is_admin": True}
    assert await people.is_admin(web_api, "UBOSS")
    fake_slack.users["UBOSS"] = {"is_admin": False}
    clock.advance(seconds=CACHE_TTL.total_seconds() - 1)
    assert await people.is_admin(web_api, "UBOSS")  # cached: no second users.info yet
    assert len(fake_slack.calls_to("users.info")) == 1
    clock.advance(seconds=2)
    assert not await people.is_admin(web_api, "UBOSS")
    assert await people.is_admin(web_api, "UCONFIGURED")  # ADMIN_USERS: no lookup at all
    assert len(fake_slack.calls_to("users.info")) == 2
    assert CACHE_TTL.total_seconds() <= 60


async def test_group_membership_is_refreshed_as_often(
    fake_slack: FakeSlack, web_api: AsyncWebClient
) -> None:
    clock = Clock()
    people = People(admin_users=[], clock=clock)
    fake_slack.usergroups["SFIN"] = ["UFIN"]
    assert await people.group_members(web_api, "SFIN") == {"UFIN"}
    fake_slack.usergroups["SFIN"] = []
    clock.advance(seconds=CACHE_TTL.total_seconds() + 1)
    assert await people.group_members(web_api, "SFIN") == frozenset()


async def test_each_cache_keeps_at_most_so_many_people(
    fake_slack: FakeSlack, web_api: AsyncWebClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that meets ever more people keeps a bounded cache (the oldest go first)."""
    monkeypatch.setattr(people_module, "CACHE_KEPT", 2)
    people = People(admin_users=[], clock=Clock())
    for user in ("U1", "U2", "U3"):
        fake_slack.users[user] = {"is_admin": True}
        assert await people.is_admin(web_api, user)
    assert await people.is_admin(web_api, "U3")  # still cached
    assert len(fake_slack.calls_to("users.info")) == 3
    assert await people.is_admin(web_api, "U1")  # forgotten: asked again
    assert len(fake_slack.calls_to("users.info")) == 4


async def test_an_expired_entry_goes_when_the_next_is_kept(
    fake_slack: FakeSlack, web_api: AsyncWebClient
) -> None:
    """An entry past its TTL is never read again: the cache holds the people of the last
    TTL, not the last CACHE_KEPT of them, and of each only what is read (not the profile)."""
    clock = Clock()
    people = People(admin_users=[], clock=clock)
    for n in range(20):
        fake_slack.users[f"U{n}"] = {"is_admin": n == 3}
        await people.is_admin(web_api, f"U{n}")
    assert len(people._user_cache) == 20
    clock.advance(seconds=CACHE_TTL.total_seconds() / 2)
    assert await people.is_admin(web_api, "U3")  # cached: no users.info
    await people.is_admin(web_api, "U20")
    assert len(people._user_cache) == 21
    clock.advance(seconds=CACHE_TTL.total_seconds() / 2)
    await people.is_admin(web_api, "U21")
    assert list(people._user_cache) == ["U20", "U21"]
    assert len(fake_slack.calls_to("users.info")) == 22
    _, kept = people._user_cache["U21"]
    assert kept is not None
    assert set(kept) <= set(people_module.USER_FIELDS)
    assert kept["is_admin"] is False
    assert "profile" not in kept  # the fake's users.info has one, as Slack's does


async def test_a_lookup_under_way_is_shared_by_whoever_asks_meanwhile(
    fake_slack: FakeSlack, web_api: AsyncWebClient
) -> None:
    """A card's lookup of its requester, started as the turn starts (`warm`), is the one the
    card then awaits; two clicks of one person ask Slack once."""
    people = People(admin_users=[], clock=Clock())
    fake_slack.users["UGUEST"] = {"is_restricted": True}
    people.warm(web_api, "UGUEST", "T1")
    kinds = await asyncio.gather(
        people.outsider_kind(web_api, "UGUEST", "T1"), people.is_outsider(web_api, "UGUEST", "T1")
    )
    assert list(kinds) == ["guest", True]
    people.warm(web_api, "UGUEST", "T1")  # known now: nothing to start
    assert await people.outsider_kind(web_api, "UGUEST", "T1") == "guest"
    assert len(fake_slack.calls_to("users.info")) == 1


async def test_a_shared_lookup_that_failed_is_not_kept(
    fake_slack: FakeSlack, web_api: AsyncWebClient
) -> None:
    """Whoever shared a lookup that Slack refused gets its "cannot say"; the next question
    asks again."""
    people = People(admin_users=[], clock=Clock())
    team = fake_slack.team_id
    fake_slack.fail_next("users.info", error="user_not_found")
    people.warm(web_api, "ULATER", team)
    assert await people.outsider_kind(web_api, "ULATER", team) is None  # Slack cannot say
    assert await people.is_outsider(web_api, "ULATER", team) is False  # asked again: a member
    assert len(fake_slack.calls_to("users.info")) == 2


async def test_whether_a_clicker_is_a_guest_is_asked_while_the_request_is_read(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
) -> None:
    """Every decision asks users.info of its clicker (a guest may not decide): the lookup
    starts as the click comes, beside the request's read, not after it (issue 23). Here the
    read waits on a lock the test holds, and the lookup is made meanwhile."""
    asked = await ask(client, fake_slack, gemini, team)
    await settle(service)
    gemini.script(text("Sent 500 to 12345."))
    click = await client.click_payload(team, BOSS, "approve", asked.card)
    async with bot_sessions() as db, db.begin():
        await db.execute(sa.text("LOCK TABLE approvals IN ACCESS EXCLUSIVE MODE"))
        assert (await client.send(click))[0] == 200
        await fake_slack.wait_for("users.info", predicate=lambda c: c.args.get("user") == BOSS)
    assert text_of(await reply_in_thread(fake_slack, asked.thread_ts)) == "Sent 500 to 12345."
    await settle(service)
    assert [c.args.get("user") for c in fake_slack.calls_to("users.info")].count(BOSS) == 1
