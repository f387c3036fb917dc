"""The people directory (bot/people.py, storage/people.py): who is a guest, known to every
replica from users.list and Slack's user_change and team_join events, and users.info asked
only of a person it does not know (issue 23: Slack calls, against issue 21's guest checks)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.people import Directory, People
from bot.server import Service
from storage.db import SessionFactory
from storage.models import PersonRow
from storage.people import PeopleStore
from tests import ledger_tools
from tests.agent.conftest import Clock
from tests.bot.conftest import SlackClient, settle
from tests.bot.test_e2e import BOSS, ask, text_of
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini
from tests.fakes.slack_api import FakeSlack

EVERY = timedelta(hours=1)  # PEOPLE_SYNC_MINUTES=60's
TRUSTED = 2 * EVERY


def replica(sessions: SessionFactory, clock: Clock) -> People:
    """Another process's People, on the same database."""
    return People(admin_users=[], clock=clock, directory=Directory(PeopleStore(sessions), EVERY))


def asked_of_slack(fake_slack: FakeSlack, user: str) -> int:
    return len([c for c in fake_slack.calls_to("users.info") if c.args.get("user") == user])


@pytest.fixture
def workspace(fake_slack: FakeSlack, team: str) -> list[str]:
    """This test's workspace as users.list lists it; asked for before `service`, so the
    service's first sync, at start-up, finds it."""
    fake_slack.team_id = team
    fake_slack.listed = [BOSS, "UCFO"]
    return fake_slack.listed


async def synced_at_start(sessions: SessionFactory, team: str, workspace: list[str]) -> None:
    async def synced() -> bool:
        async with sessions() as db:
            rows = await db.scalars(sa.select(PersonRow.user_id).where(PersonRow.team_id == team))
            return sorted(rows) == sorted(workspace)

    await poll(synced, "the start-up sync")


async def test_the_workspace_is_synced_at_start_and_its_people_need_no_users_info(
    workspace: list[str],
    fake_slack: FakeSlack,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
) -> None:
    await synced_at_start(bot_sessions, team, workspace)
    assert service.deps is not None and service.app is not None
    client = service.app.client
    assert not await service.deps.people.is_outsider(client, BOSS, team)
    assert fake_slack.calls_to("users.info") == []


@pytest.mark.parametrize("kind", ["user_change", "team_join"])
async def test_a_member_made_a_guest_cannot_approve_once_slack_says_so(
    workspace: list[str],
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
    kind: str,
) -> None:
    """The event reaches the directory at once, for every replica, and this process's cache;
    users.info, which still calls them a member, is never asked of them."""
    assert service.deps is not None and service.app is not None
    people = service.deps.people
    await synced_at_start(bot_sessions, team, workspace)
    assert await people.sync(service.app.client) is None  # synced: not due again yet
    assert not await people.is_outsider(service.app.client, BOSS, team)  # cached: a member
    asked = await ask(client, fake_slack, gemini, team)
    guest = {"id": BOSS, "team_id": team, "is_restricted": True, "profile": {"title": "x"}}
    assert (await client.send(sp.user_event(team, guest, kind=kind)))[0] == 200

    async def heard() -> bool:  # asked by a new replica each time: its cache is empty
        other = replica(bot_sessions, Clock())
        return await other.is_outsider(service.app.client, BOSS, team) if service.app else False

    await poll(heard, "the event in the directory")
    assert (await client.click(team, BOSS, "approve", asked.card))[0] == 200
    (ephemeral,) = await fake_slack.wait_for("chat.postEphemeral")
    assert "Guests and people of other organisations" in text_of(ephemeral)
    await settle(service)
    still = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert still is not None and still.decision is None and ledger_tools.entries() == []
    assert asked_of_slack(fake_slack, BOSS) == 0


async def test_a_retried_event_older_than_the_last_sync_leaves_the_syncs_word(
    workspace: list[str],
    client: SlackClient,
    fake_slack: FakeSlack,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
) -> None:
    """Slack retries an event it could not deliver minutes later: what it said then is older
    than the sync since, which already has the person as they are now."""
    assert service.deps is not None and service.app is not None
    sent = time.time() - 300
    await synced_at_start(bot_sessions, team, workspace)  # BOSS: a member
    guest = {"id": BOSS, "team_id": team, "is_restricted": True}
    assert (await client.send(sp.user_event(team, guest, sent=sent)))[0] == 200
    now = {"id": "UCFO", "team_id": team, "is_restricted": True}  # the same word, sent now
    assert (await client.send(sp.user_event(team, now)))[0] == 200
    await settle(service)  # both events' listeners have run
    assert await replica(bot_sessions, Clock()).is_outsider(service.app.client, "UCFO", team)
    assert not await replica(bot_sessions, Clock()).is_outsider(service.app.client, BOSS, team)
    assert not await service.deps.people.is_outsider(service.app.client, BOSS, team)
    assert asked_of_slack(fake_slack, BOSS) == 0


async def test_a_person_the_directory_does_not_know_is_asked_once_for_every_replica(
    fake_slack: FakeSlack, web_api: AsyncWebClient, bot_sessions: SessionFactory, team: str
) -> None:
    """Until their row is older than a sync's interval twice over: then Slack is asked again."""
    clock = Clock()
    fake_slack.team_id = team  # users.info: a person of this workspace
    fake_slack.users["UNEW"] = {"is_ultra_restricted": True}
    assert await replica(bot_sessions, clock).outsider_kind(web_api, "UNEW", team) == "guest"
    assert await replica(bot_sessions, clock).outsider_kind(web_api, "UNEW", team) == "guest"
    assert asked_of_slack(fake_slack, "UNEW") == 1
    fake_slack.users["UNEW"] = {}
    clock.advance(seconds=TRUSTED.total_seconds() + 1)
    assert await replica(bot_sessions, clock).outsider_kind(web_api, "UNEW", team) is None
    assert asked_of_slack(fake_slack, "UNEW") == 2
    # Another workspace's word on the same person is not this one's.
    assert await replica(bot_sessions, clock).is_outsider(web_api, "UNEW", "T0ELSEWHERE")
    assert asked_of_slack(fake_slack, "UNEW") == 3


async def test_one_replica_lists_the_workspace_each_time_its_sync_is_due(
    fake_slack: FakeSlack, web_api: AsyncWebClient, bot_sessions: SessionFactory, team: str
) -> None:
    """Whichever replica asks first once the sync is due lists the workspace for all; a
    sync cut short (Slack failing) is due again at once, for the next to ask."""
    clock = Clock()
    fake_slack.team_id, fake_slack.listed = team, [BOSS, "UCFO", "UNEW"]
    a, b = replica(bot_sessions, clock), replica(bot_sessions, clock)
    assert await a.sync(web_api) == 3
    assert await b.sync(web_api) is None and await a.sync(web_api) is None
    assert len(fake_slack.calls_to("users.list")) == 1
    clock.advance(seconds=EVERY.total_seconds())
    fake_slack.fail_next("users.list", error="internal_error")
    with pytest.raises(SlackApiError):
        await b.sync(web_api)
    assert await a.sync(web_api) == 3  # due again: b's failed
    assert await b.sync(web_api) is None
    assert len(fake_slack.calls_to("users.list")) == 3
    # PEOPLE_SYNC_MINUTES lowered: a due time further off than the new interval is due now.
    sooner = People(
        admin_users=[],
        clock=clock,
        directory=Directory(PeopleStore(bot_sessions), EVERY / 4),
    )
    assert await sooner.sync(web_api) == 3
    assert await a.sync(web_api) is None  # due in a quarter hour now, for everyone
    assert len(fake_slack.calls_to("auth.test")) == 3  # once a replica: its workspace


async def test_an_older_word_never_overwrites_a_newer_one(
    bot_sessions: SessionFactory, team: str
) -> None:
    """A sync's page read before an event, written after it, leaves the event's word."""
    store, clock = PeopleStore(bot_sessions), Clock()
    read_at = clock()
    clock.advance(seconds=1)
    await store.record(team, {"UX": {"is_restricted": True}}, clock())  # the event
    await store.record(team, {"UX": {}, "UY": {}}, read_at)  # the page
    assert await store.fresh(team, "UX", since=read_at) == {"is_restricted": True}
    assert await store.fresh(team, "UY", since=read_at) == {}
    clock.advance(seconds=1)
    await store.record(team, {"UX": {}}, clock())  # a later word
    assert await store.fresh(team, "UX", since=read_at) == {}
    assert await store.fresh(team, "UX", since=clock() + timedelta(seconds=1)) is None


@pytest.mark.parametrize("service_overrides", [{"PEOPLE_SYNC_MINUTES": 0}])
async def test_without_a_directory_every_new_person_is_asked_of_users_info(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
    service_overrides: dict[str, Any],
) -> None:
    fake_slack.users["UEMP"] = {"is_restricted": True}
    asked = await ask(client, fake_slack, gemini, team)
    assert "a guest of this workspace" in str(asked.card.args["blocks"])
    await settle(service)
    assert asked_of_slack(fake_slack, "UEMP") == 1 and fake_slack.calls_to("users.list") == []
    async with bot_sessions() as db:
        kept = sa.select(sa.func.count()).where(PersonRow.team_id == team)
        assert await db.scalar(kept) == 0
