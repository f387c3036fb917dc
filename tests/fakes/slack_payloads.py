"""Slack's inbound request shapes, signed the way Slack signs them, for Bolt's HTTP endpoint.

The shapes follow what Slack really sends (event_callback envelopes, `payload=<json>` forms for
interactivity, flat forms for slash commands), so handlers are tested against the real thing.
Each builder returns a `Payload(body, content_type)`; send it with `post_signed`.
"""

from __future__ import annotations

import itertools
import json
import re
import time
import uuid
from typing import Any, NamedTuple
from urllib.parse import urlencode

import aiohttp
from slack_sdk.signature import SignatureVerifier

from .slack_api import APP_ID, BOT_ID, BOT_USER_ID

JSON_CT = "application/json"
FORM_CT = "application/x-www-form-urlencoded"
VERIFICATION_TOKEN = "legacy-verification-token"  # deprecated by Slack, still sent

_ids = itertools.count(1)


class Payload(NamedTuple):
    body: bytes
    content_type: str


def signed_headers(
    secret: str, body: bytes, timestamp: int | None = None, *, content_type: str = JSON_CT
) -> dict[str, str]:
    """Headers Slack attaches: `v0=` HMAC of `v0:{timestamp}:{body}` (Bolt rejects > 5 min)."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    assert signature is not None
    return {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature,
        "Content-Type": content_type,
    }


async def post_signed(
    session: aiohttp.ClientSession,
    url: str,
    secret: str,
    body: bytes,
    content_type: str,
    *,
    timestamp: int | None = None,
    extra_headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """POST like Slack does; `extra_headers` win, e.g. to replay a signature over a new body."""
    headers = signed_headers(secret, body, timestamp, content_type=content_type)
    headers.update(extra_headers or {})
    async with session.post(url, data=body, headers=headers) as response:
        return response.status, await response.text()


def _json(data: dict[str, Any]) -> Payload:
    return Payload(json.dumps(data).encode(), JSON_CT)


def _form(data: dict[str, str]) -> Payload:
    return Payload(urlencode(data).encode(), FORM_CT)


def _rich_text(text: str) -> list[dict[str, Any]]:
    """The rich_text block Slack adds to user messages, with `<@U…>` as user elements."""
    elements: list[dict[str, Any]] = []
    for part in re.split(r"(<@[A-Z0-9]+>)", text):
        if mention := re.fullmatch(r"<@([A-Z0-9]+)>", part):
            elements.append({"type": "user", "user_id": mention.group(1)})
        elif part:
            elements.append({"type": "text", "text": part})
    section = {"type": "rich_text_section", "elements": elements}
    return [{"type": "rich_text", "block_id": uuid.uuid4().hex[:5], "elements": [section]}]


def _event_callback(
    team: str,
    event: dict[str, Any],
    event_id: str | None,
    app_id: str,
    bot_user_id: str,
    event_time: int | None = None,
) -> Payload:
    return _json(
        {
            "token": VERIFICATION_TOKEN,
            "team_id": team,
            "context_team_id": team,
            "context_enterprise_id": None,
            "api_app_id": app_id,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{next(_ids):010d}",
            "event_time": int(time.time()) if event_time is None else event_time,
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": team,
                    "user_id": bot_user_id,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": f"4-{uuid.uuid4().hex}",
        }
    )


def _user_message(
    kind: str, team: str, user: str, channel: str, text: str, ts: str, thread_ts: str | None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": kind,
        "user": user,
        "text": text,
        "ts": ts,
        "client_msg_id": str(uuid.uuid4()),
        "team": team,
        "blocks": _rich_text(text),
        "channel": channel,
        "event_ts": ts,
    }
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    return event


def message_im_event(
    team: str,
    user: str,
    channel: str,
    text: str,
    ts: str,
    thread_ts: str | None = None,
    event_id: str | None = None,
    *,
    app_id: str = APP_ID,
    bot_user_id: str = BOT_USER_ID,
) -> Payload:
    """A user's direct message to the bot (`message.im`)."""
    event = _user_message("message", team, user, channel, text, ts, thread_ts)
    event["channel_type"] = "im"
    return _event_callback(team, event, event_id, app_id, bot_user_id)


def message_channel_event(
    team: str,
    user: str,
    channel: str,
    text: str,
    ts: str,
    thread_ts: str | None = None,
    event_id: str | None = None,
    *,
    app_id: str = APP_ID,
    bot_user_id: str = BOT_USER_ID,
) -> Payload:
    """A message in a channel the bot is in (`message.channels`), e.g. a reply in a thread."""
    event = _user_message("message", team, user, channel, text, ts, thread_ts)
    event["channel_type"] = "channel"
    return _event_callback(team, event, event_id, app_id, bot_user_id)


def app_mention_event(
    team: str,
    user: str,
    channel: str,
    text: str,
    ts: str,
    thread_ts: str | None = None,
    event_id: str | None = None,
    *,
    app_id: str = APP_ID,
    bot_user_id: str = BOT_USER_ID,
) -> Payload:
    """`@bot` in a channel; Slack sends no `channel_type` on app_mention events."""
    event = _user_message("app_mention", team, user, channel, text, ts, thread_ts)
    return _event_callback(team, event, event_id, app_id, bot_user_id)


def assistant_thread_event(
    kind: str,
    team: str,
    user: str,
    channel: str,
    thread_ts: str,
    viewing: str | None = None,
    *,
    app_id: str = APP_ID,
    bot_user_id: str = BOT_USER_ID,
) -> Payload:
    """`assistant_thread_started` or `assistant_thread_context_changed`: an assistant thread
    in the app's DM `channel`, opened (or followed) beside channel `viewing`."""
    context = {"channel_id": viewing, "team_id": team, "enterprise_id": None} if viewing else {}
    event = {
        "type": kind,
        "assistant_thread": {
            "user_id": user,
            "context": context,
            "channel_id": channel,
            "thread_ts": thread_ts,
        },
        "event_ts": thread_ts,
    }
    return _event_callback(team, event, None, app_id, bot_user_id)


def app_home_opened_event(
    team: str,
    user: str,
    *,
    tab: str = "home",
    event_id: str | None = None,
    app_id: str = APP_ID,
    bot_user_id: str = BOT_USER_ID,
) -> Payload:
    """The person opened the app's Home (or its Messages tab: `tab`)."""
    event = {
        "type": "app_home_opened",
        "user": user,
        "channel": "D0HOME",
        "tab": tab,
        "event_ts": f"{time.time():.6f}",
    }
    return _event_callback(team, event, event_id, app_id, bot_user_id)


def user_event(
    team: str,
    user: dict[str, Any],
    *,
    kind: str = "user_change",
    sent: float | None = None,
    event_id: str | None = None,
    app_id: str = APP_ID,
    bot_user_id: str = BOT_USER_ID,
) -> Payload:
    """Slack's word that a person changed (`user_change`) or joined (`team_join`), sent at
    `sent` (default: now; a retried delivery's is its first attempt's)."""
    at = time.time() if sent is None else sent
    event = {"type": kind, "user": user, "event_ts": f"{at:.6f}"}
    return _event_callback(team, event, event_id, app_id, bot_user_id, int(at))


def url_verification(challenge: str = "challenge-token") -> Payload:
    """Sent once when the Request URL is saved; the app must echo `challenge`."""
    return _json({"token": VERIFICATION_TOKEN, "challenge": challenge, "type": "url_verification"})


def _user(team: str, user: str) -> dict[str, str]:
    name = f"user-{user.lower()}"
    return {"id": user, "username": name, "name": name, "team_id": team}


def block_actions(
    team: str,
    user: str,
    channel: str,
    message_ts: str,
    action_id: str,
    value: str,
    trigger_id: str,
    response_url: str,
    *,
    block_id: str = "actions",
    message_text: str = "",
    message_blocks: list[dict[str, Any]] | None = None,
    app_id: str = APP_ID,
    bot_user_id: str = BOT_USER_ID,
    bot_id: str = BOT_ID,
    overflow: bool = False,
) -> Payload:
    """A button click on a bot message, form-encoded as `payload=<json>`; `overflow`: the
    choice of an overflow menu's option whose value is `value`."""
    button: dict[str, Any] = {
        "type": "button",
        "action_id": action_id,
        "text": {"type": "plain_text", "text": value, "emoji": True},
        "value": value,
    }
    if overflow:
        button = {
            "type": "overflow",
            "action_id": action_id,
            "selected_option": {"text": {"type": "plain_text", "text": value}, "value": value},
        }
    blocks = message_blocks or [{"type": "actions", "block_id": block_id, "elements": [button]}]
    action = {**button, "block_id": block_id, "action_ts": f"{time.time():.6f}"}
    payload: dict[str, Any] = {
        "type": "block_actions",
        "user": _user(team, user),
        "api_app_id": app_id,
        "token": VERIFICATION_TOKEN,
        "container": {
            "type": "message",
            "message_ts": message_ts,
            "channel_id": channel,
            "is_ephemeral": False,
        },
        "trigger_id": trigger_id,
        "team": {"id": team, "domain": "example"},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel, "name": channel.lower()},
        "message": {
            "type": "message",
            "user": bot_user_id,
            "bot_id": bot_id,
            "app_id": app_id,
            "team": team,
            "text": message_text,
            "ts": message_ts,
            "blocks": blocks,
        },
        "state": {"values": {}},
        "response_url": response_url,
        "actions": [action],
    }
    return _form({"payload": json.dumps(payload)})


def view_block_actions(
    team: str,
    user: str,
    view: dict[str, Any],
    action_id: str,
    value: str,
    *,
    block_id: str = "actions",
    app_id: str = APP_ID,
) -> Payload:
    """A button click inside a modal the app opened, or its Home tab (`view` as views.open
    or views.publish returned it): a view container, and no channel or message."""
    button = {
        "type": "button",
        "action_id": action_id,
        "text": {"type": "plain_text", "text": value, "emoji": True},
        "value": value,
    }
    payload: dict[str, Any] = {
        "type": "block_actions",
        "user": _user(team, user),
        "api_app_id": app_id,
        "token": VERIFICATION_TOKEN,
        "container": {"type": "view", "view_id": view["id"]},
        "trigger_id": f"{time.time():.6f}.trigger",
        "team": {"id": team, "domain": "example"},
        "enterprise": None,
        "is_enterprise_install": False,
        "view": view,
        "actions": [{**button, "block_id": block_id, "action_ts": f"{time.time():.6f}"}],
    }
    return _form({"payload": json.dumps(payload)})


def view_submission(
    team: str,
    user: str,
    callback_id: str,
    private_metadata: str,
    state_values: dict[str, Any],
    *,
    view_id: str = "V0000VIEW",
    trigger_id: str = "1111.2222.abcd",
    app_id: str = APP_ID,
    bot_id: str = BOT_ID,
) -> Payload:
    """A modal's Submit; `state_values` is `{block_id: {action_id: {type, value...}}}`."""
    view: dict[str, Any] = {
        "id": view_id,
        "team_id": team,
        "type": "modal",
        "blocks": [],
        "private_metadata": private_metadata,
        "callback_id": callback_id,
        "state": {"values": state_values},
        "hash": f"{view_id}.hash",
        "title": {"type": "plain_text", "text": "Greenlight", "emoji": True},
        "close": None,
        "submit": {"type": "plain_text", "text": "Submit", "emoji": True},
        "clear_on_close": False,
        "notify_on_close": False,
        "previous_view_id": None,
        "root_view_id": view_id,
        "app_id": app_id,
        "external_id": "",
        "app_installed_team_id": team,
        "bot_id": bot_id,
    }
    payload = {
        "type": "view_submission",
        "team": {"id": team, "domain": "example"},
        "user": _user(team, user),
        "api_app_id": app_id,
        "token": VERIFICATION_TOKEN,
        "trigger_id": trigger_id,
        "view": view,
        "response_urls": [],
        "is_enterprise_install": False,
        "enterprise": None,
    }
    return _form({"payload": json.dumps(payload)})


def slash_command(
    team: str,
    user: str,
    command: str,
    text: str,
    channel: str,
    response_url: str,
    trigger_id: str,
    *,
    app_id: str = APP_ID,
) -> Payload:
    """A slash command: a flat form, everything after the command name in `text`."""
    return _form(
        {
            "token": VERIFICATION_TOKEN,
            "team_id": team,
            "team_domain": "example",
            "channel_id": channel,
            "channel_name": channel.lower(),
            "user_id": user,
            "user_name": f"user-{user.lower()}",
            "command": command,
            "text": text,
            "api_app_id": app_id,
            "is_enterprise_install": "false",
            "response_url": response_url,
            "trigger_id": trigger_id,
        }
    )
