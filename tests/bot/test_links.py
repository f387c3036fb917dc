"""Links to Slack messages: built once the workspace's address is known, nothing kept; asked
of chat.getPermalink otherwise, each once, in a bounded store that holds no conversation."""

from __future__ import annotations

import gc
import weakref
from contextvars import ContextVar

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot import links as links_module
from bot.links import Links
from storage.domain import Thread
from tests.fakes.slack_api import FakeSlack


def thread(n: int) -> Thread:
    return Thread("T1", f"C{n:07d}", f"1700000000.{n:06d}")


async def test_with_the_workspace_address_links_are_built_and_none_is_kept(
    fake_slack: FakeSlack, web_api: AsyncWebClient
) -> None:
    links = Links()
    for n in range(50):
        links.warm(web_api, thread(n))
        got = await links.link(web_api, thread(n))
        assert got == f"https://example.slack.com/archives/C{n:07d}/p1700000000{n:06d}"
    reply = await links.link(web_api, thread(99), in_thread="1600000000.000001")
    assert reply == (
        "https://example.slack.com/archives/C0000099/p1700000000000099"
        "?thread_ts=1600000000.000001&cid=C0000099"
    )
    assert len(fake_slack.calls_to("auth.test")) == 1
    assert fake_slack.calls_to("chat.getPermalink") == []
    assert len(links._permalinks) <= 1  # the one asked before the address came back


async def test_without_it_each_link_is_asked_once_and_so_many_are_kept(
    fake_slack: FakeSlack, web_api: AsyncWebClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(links_module, "KEPT", 3)
    fake_slack.fail_next("auth.test", error="invalid_auth", times=1000)
    links = Links()
    for _ in range(2):
        got = await links.link(web_api, thread(1))
        assert got == "https://example.slack.com/archives/C0000001/p1700000000000001"
    assert len(fake_slack.calls_to("chat.getPermalink")) == 1  # asked once, then kept
    for n in range(2, 10):
        await links.link(web_api, thread(n))
        assert len(links._permalinks) <= 3


async def test_a_kept_lookup_keeps_nothing_of_the_conversation_that_asked_alive(
    fake_slack: FakeSlack, web_api: AsyncWebClient
) -> None:
    """The lookup is a task, kept for whoever asks next; the context it ran in (the turn,
    the piece of background work: a conversation's worth of objects) is not kept with it."""

    class Turn:
        pass

    turn: ContextVar[Turn | None] = ContextVar("turn", default=None)
    fake_slack.fail_next("auth.test", error="invalid_auth", times=1000)
    links = Links()
    asking = Turn()
    gone = weakref.ref(asking)
    turn.set(asking)
    assert await links.link(web_api, thread(1)) is not None
    turn.set(None)
    del asking
    gc.collect()
    assert len(links._permalinks) == 1
    assert gone() is None
