"""The Slack doubles behave like Slack for the real clients: slack_sdk's AsyncWebClient against
FakeSlack, and Bolt's signature check and routing against signed payloads."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond, AsyncSay
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from tests.fakes import slack_payloads as sp
from tests.fakes.slack_api import BOT_ID, BOT_USER_ID, TEAM_ID, FakeSlack, serve_local

SECRET = "test-signing-secret"
TOKEN = "xoxb-test"


@pytest_asyncio.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


@pytest.fixture
def client(slack: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(base_url=slack.base_url, token=TOKEN)


# -- Web API -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_web_api_methods_answer_like_slack(slack: FakeSlack, client: AsyncWebClient) -> None:
    auth = await client.auth_test()
    assert (auth["user_id"], auth["team_id"], auth["bot_id"]) == (BOT_USER_ID, TEAM_ID, BOT_ID)

    first = await client.chat_postMessage(channel="C1", text="one")
    second = await client.chat_postMessage(channel="C1", text="two", thread_ts=first["ts"])
    assert first["ts"] != second["ts"] and float(first["ts"]) < float(second["ts"])
    assert first["message"]["text"] == "one" and second["message"]["thread_ts"] == first["ts"]

    updated = await client.chat_update(channel="C1", ts=first["ts"], text="one, decided")
    assert updated["message"]["text"] == slack.messages[first["ts"]]["text"] == "one, decided"

    slack.users["U1"] = {"is_admin": True}
    assert (await client.users_info(user="U1"))["user"]["is_admin"] is True
    assert (await client.users_info(user="U2"))["user"]["is_admin"] is False

    slack.usergroups["S1"] = ["U1", "U2"]
    assert (await client.usergroups_users_list(usergroup="S1"))["users"] == ["U1", "U2"]

    link = await client.chat_getPermalink(channel="C1", message_ts=first["ts"])
    p_ts = first["ts"].replace(".", "")
    assert link["permalink"] == f"https://example.slack.com/archives/C1/p{p_ts}"

    eph = await client.chat_postEphemeral(channel="C1", user="U1", text="psst")
    view = await client.views_open(trigger_id="t", view={"type": "modal", "callback_id": "cb"})
    assert eph["message_ts"] and view["view"]["callback_id"] == "cb"

    assert [c.method for c in slack.calls][:2] == ["auth.test", "chat.postMessage"]
    assert all(c.token == TOKEN for c in slack.calls)


@pytest.mark.asyncio
async def test_form_bodies_missing_token_and_unknown_methods(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}]
    data = {"channel": "C1", "text": "hi", "blocks": json.dumps(blocks)}
    await client.api_call("chat.postMessage", data=data)  # form-encoded path of slack_sdk
    assert slack.calls_to("chat.postMessage")[0].args["blocks"] == blocks

    with pytest.raises(SlackApiError) as unknown:
        await client.api_call("nope.nothing")
    assert unknown.value.response["error"] == "unknown_method"

    with pytest.raises(SlackApiError) as unauthenticated:
        await AsyncWebClient(base_url=slack.base_url).chat_postMessage(channel="C1", text="x")
    assert unauthenticated.value.response["error"] == "invalid_auth"


@pytest.mark.asyncio
async def test_conversations_and_assistant_methods(
    slack: FakeSlack, client: AsyncWebClient
) -> None:
    slack.members["C1"] = ["U1", BOT_USER_ID]
    assert (await client.conversations_members(channel="C1"))["members"] == ["U1", BOT_USER_ID]
    assert (await client.conversations_info(channel="D1"))["channel"]["is_im"] is True
    await client.assistant_threads_setStatus(channel_id="D1", thread_ts="1.2", status="thinking")
    prompts = [{"title": "Status", "message": "What is pending?"}]
    await client.assistant_threads_setSuggestedPrompts(
        channel_id="D1", thread_ts="1.2", prompts=prompts
    )
    assert slack.calls_to("assistant.threads.setSuggestedPrompts")[0].args["prompts"] == prompts


@pytest.mark.asyncio
async def test_chat_stream_start_append_stop(slack: FakeSlack, client: AsyncWebClient) -> None:
    streamer = await client.chat_stream(
        channel="D1",
        thread_ts="1.2",
        recipient_team_id=TEAM_ID,
        recipient_user_id="U1",
        buffer_size=5,
    )
    await streamer.append(markdown_text="hello ")  # over the buffer: chat.startStream
    await streamer.append(markdown_text="wor")  # buffered
    await streamer.append(markdown_text="ld")  # flushed: chat.appendStream
    await streamer.stop(markdown_text="!")  # chat.stopStream
    methods = [c.method for c in slack.calls]
    assert methods == ["chat.startStream", "chat.appendStream", "chat.stopStream"]
    assert streamer.ts is not None and slack.messages[streamer.ts]["text"] == "hello world!"
    with pytest.raises(SlackApiError):  # a stopped stream takes no more text
        await client.chat_appendStream(channel="D1", ts=streamer.ts, markdown_text="late")


@pytest.mark.asyncio
async def test_rate_limit_is_retried_after_retry_after(slack: FakeSlack) -> None:
    client = AsyncWebClient(
        base_url=slack.base_url,
        token=TOKEN,
        retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)],
    )
    slack.fail_next("chat.postMessage", status=429, retry_after=1)
    assert (await client.chat_postMessage(channel="C1", text="hi"))["ok"] is True
    attempts = slack.calls_to("chat.postMessage")
    assert [c.injected for c in attempts] == [True, False]


@pytest.mark.asyncio
async def test_server_errors_raise_or_are_retried(slack: FakeSlack, client: AsyncWebClient) -> None:
    slack.fail_next("chat.update", status=500)
    with pytest.raises(SlackApiError) as failed:
        await client.chat_update(channel="C1", ts="1.2", text="x")
    assert failed.value.response.status_code == 500

    retrying = AsyncWebClient(
        base_url=slack.base_url, token=TOKEN, retry_handlers=[AsyncServerErrorRetryHandler()]
    )
    slack.fail_next("chat.update", status=503)
    assert (await retrying.chat_update(channel="C1", ts="1.2", text="x"))["ok"] is True
    assert len(slack.calls_to("chat.update")) == 3


@pytest.mark.asyncio
async def test_api_error_injection(slack: FakeSlack, client: AsyncWebClient) -> None:
    slack.fail_next("conversations.info", error="channel_not_found", times=2)
    for _ in range(2):
        with pytest.raises(SlackApiError) as failed:
            await client.conversations_info(channel="C404")
        assert failed.value.response.status_code == 200
        assert failed.value.response["error"] == "channel_not_found"
    assert (await client.conversations_info(channel="C404"))["ok"] is True


@pytest.mark.asyncio
async def test_wait_for_and_response_url(slack: FakeSlack, client: AsyncWebClient) -> None:
    task = asyncio.create_task(client.chat_postMessage(channel="C9", text="later"))
    (call,) = await slack.wait_for(
        "chat.postMessage", predicate=lambda c: c.args["channel"] == "C9"
    )
    assert call.args["text"] == "later"
    await task

    webhook = AsyncWebhookClient(slack.response_url("r1"))
    assert (await webhook.send(text="done", replace_original=True)).status_code == 200
    assert slack.calls_to("response_url:r1")[0].args["replace_original"] is True

    with pytest.raises(AssertionError, match=r"(?s)chat\.update.*received:.*chat\.postMessage"):
        await slack.wait_for("chat.update", timeout=0.05)


# -- Bolt over HTTP ------------------------------------------------------------------------


@dataclass
class BoltServer:
    url: str
    seen: asyncio.Queue[tuple[str, dict[str, Any]]]
    session: aiohttp.ClientSession

    async def post(self, payload: sp.Payload, **kwargs: Any) -> tuple[int, str]:
        return await sp.post_signed(self.session, self.url, SECRET, *payload, **kwargs)

    async def next_seen(self) -> tuple[str, dict[str, Any]]:
        return await asyncio.wait_for(self.seen.get(), timeout=5)


@pytest_asyncio.fixture
async def bolt(slack: FakeSlack) -> AsyncIterator[BoltServer]:
    """A minimal Bolt app with one listener per kind, served over real HTTP."""
    app = AsyncApp(
        signing_secret=SECRET, client=AsyncWebClient(base_url=slack.base_url, token=TOKEN)
    )
    seen: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any], say: AsyncSay) -> None:
        await say(text="on it", thread_ts=event["ts"])
        seen.put_nowait(("app_mention", event))

    @app.action("approve")
    async def on_approve(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        await respond(text="approved", replace_original=True)
        seen.put_nowait(("approve", body))

    @app.command("/greenlight")
    async def on_command(ack: AsyncAck, command: dict[str, Any]) -> None:
        await ack(text=f"got {command['text']}")
        seen.put_nowait(("/greenlight", command))

    @app.view("reason")
    async def on_view(ack: AsyncAck, view: dict[str, Any]) -> None:
        await ack()
        seen.put_nowait(("reason", view))

    async with serve_local(app.web_app(path="/slack/events")) as url, aiohttp.ClientSession() as s:
        yield BoltServer(f"{url}/slack/events", seen, s)


def _mention(slack: FakeSlack) -> sp.Payload:
    return sp.app_mention_event(
        TEAM_ID, "U1", "C1", f"<@{BOT_USER_ID}> deploy", "1700000000.000001"
    )


@pytest.mark.asyncio
async def test_bolt_accepts_signed_event(slack: FakeSlack, bolt: BoltServer) -> None:
    status, _ = await bolt.post(_mention(slack))
    assert status == 200
    kind, event = await bolt.next_seen()
    assert kind == "app_mention" and event["text"].endswith("deploy")
    (reply,) = await slack.wait_for("chat.postMessage")
    assert reply.args["thread_ts"] == "1700000000.000001"
    assert len(slack.calls_to("auth.test")) == 1  # Bolt authorizes lazily, on the first request

    status, text = await bolt.post(sp.url_verification("abc"))
    assert (status, json.loads(text)) == (200, {"challenge": "abc"})


@pytest.mark.asyncio
async def test_bolt_rejects_tampered_and_stale_requests(slack: FakeSlack, bolt: BoltServer) -> None:
    body, content_type = _mention(slack)
    signed = sp.signed_headers(SECRET, body)
    tampered = body.replace(b"deploy", b"deplox")
    assert await bolt.post(sp.Payload(tampered, content_type), extra_headers=signed) == (
        401,
        '{"error": "invalid request"}',
    )
    stale = int(time.time()) - 6 * 60
    status, _ = await bolt.post(sp.Payload(body, content_type), timestamp=stale)
    assert status == 401
    assert bolt.seen.empty() and slack.calls == []


@pytest.mark.asyncio
async def test_bolt_routes_actions_commands_and_views(slack: FakeSlack, bolt: BoltServer) -> None:
    click = sp.block_actions(
        TEAM_ID,
        "U1",
        "C1",
        "1700000000.000100",
        "approve",
        "req-1",
        "1.2.t",
        slack.response_url("a"),
    )
    assert (await bolt.post(click))[0] == 200
    kind, body = await bolt.next_seen()
    assert kind == "approve" and body["actions"][0]["value"] == "req-1"
    (responded,) = await slack.wait_for("response_url:a")
    assert responded.args["text"] == "approved"

    command = sp.slash_command(
        TEAM_ID, "U1", "/greenlight", "status all", "C1", slack.response_url("c"), "1.2.t"
    )
    status, text = await bolt.post(command)
    assert (status, text) == (200, "got status all")  # Bolt answers a text-only ack as text
    assert (await bolt.next_seen())[1]["text"] == "status all"

    values = {"b": {"why": {"type": "plain_text_input", "value": "risky"}}}
    submit = sp.view_submission(TEAM_ID, "U1", "reason", '{"request": 1}', values)
    assert (await bolt.post(submit))[0] == 200
    kind, view = await bolt.next_seen()
    assert view["state"]["values"]["b"]["why"]["value"] == "risky"
