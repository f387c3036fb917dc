"""A fake Slack Web API on 127.0.0.1, so tests drive the real slack_sdk and Bolt clients offline.

Point `AsyncWebClient(base_url=slack.base_url)` at it. Every request is recorded as a `Call`;
`fail_next` injects rate limits, 5xx answers and API errors. Messages it posted are kept in
`messages` (by ts) so tests can check what a user would finally see after updates and streams.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from aiohttp import web
from multidict import CIMultiDict

JSON = dict[str, Any]
Handler = Callable[[JSON], JSON]

TEAM_ID = "T0000TEAM"
BOT_USER_ID = "U0000BOT"
BOT_ID = "B0000BOT"
APP_ID = "A0000APP"

# How long a test waits for what the bot should send: a bound on failing, not a measurement
# (a passing test never waits it out), so it allows for a loaded 2-core machine.
DEADLINE = 30.0

# Form-encoded requests carry these as JSON strings; decode them so args look the same either way.
_JSON_FIELDS = ("blocks", "attachments", "metadata", "chunks", "prompts", "view")


@dataclass(frozen=True)
class Call:
    """One request the fake received; `injected` marks answers forced by `fail_next`."""

    method: str
    args: JSON
    headers: CIMultiDict[str]
    injected: bool = False

    @property
    def token(self) -> str | None:
        """The bearer token (or a form `token`, which Slack also accepts)."""
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer ") and auth[7:].strip():
            return auth[7:].strip()
        token = self.args.get("token")
        return token if isinstance(token, str) and token else None


@dataclass
class _Fault:
    status: int
    error: str
    retry_after: int | None
    times: int


@asynccontextmanager
async def serve_local(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 at an ephemeral port; yields `http://127.0.0.1:<port>`."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def _err(error: str) -> JSON:
    return {"ok": False, "error": error}


async def _read_args(request: web.Request) -> JSON:
    """Merge query, JSON and form arguments: slack_sdk uses all three depending on the method."""
    args: JSON = dict(request.query)
    if request.content_type == "application/json":
        raw = await request.read()
        body = json.loads(raw) if raw.strip() else {}
        if isinstance(body, dict):
            args.update(body)
    elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.post()
        args.update({k: v for k, v in form.items() if isinstance(v, str)})
    for key in _JSON_FIELDS:
        value = args.get(key)
        if isinstance(value, str) and value[:1] in ("[", "{"):
            with suppress(ValueError):
                args[key] = json.loads(value)
    return args


def _stream_text(args: JSON) -> str:
    """Text carried by a stream call: `markdown_text` and/or markdown_text chunks."""
    text = str(args.get("markdown_text") or "")
    for chunk in args.get("chunks") or []:
        if isinstance(chunk, dict) and chunk.get("type") == "markdown_text":
            text += str(chunk.get("text", ""))
    return text


class FakeSlack:
    """Answers like Slack's Web API and records every call; configure `users`, `listed`,
    `usergroups`, `channels`, `members` and `delays` per test, or replace entries of `handlers`."""

    def __init__(
        self,
        *,
        team_id: str = TEAM_ID,
        bot_user_id: str = BOT_USER_ID,
        bot_id: str = BOT_ID,
        app_id: str = APP_ID,
        ts_start: int = 1_700_000_000,
    ) -> None:
        self.team_id, self.bot_user_id = team_id, bot_user_id
        self.bot_id, self.app_id = bot_id, app_id
        self.calls: list[Call] = []
        self.users: dict[str, JSON] = {}
        self.listed: list[str] = []  # the people users.list lists, in order
        self.usergroups: dict[str, list[str]] = {}
        self.channels: dict[str, JSON] = {}
        self.members: dict[str, list[str]] = {}
        self.messages: dict[str, JSON] = {}
        self.homes: dict[str, list[JSON]] = {}  # views.publish: each user's Home views, in order
        self._streaming: set[str] = set()
        self._faults: dict[str, deque[_Fault]] = {}
        # Seconds a method takes to answer (latency); "*": every method not named.
        self.delays: dict[str, float] = {}
        self._ticks = ts_start * 1_000_000
        self._views = 0
        self._cond = asyncio.Condition()
        self._stack: AsyncExitStack | None = None
        self._url: str | None = None
        self.handlers: dict[str, Handler] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "chat.getPermalink": self._permalink,
            "views.open": self._views_open,
            "views.update": self._views_update,
            "views.publish": self._views_publish,
            "users.info": self._users_info,
            "users.list": self._users_list,
            "usergroups.users.list": self._usergroup_users,
            "conversations.info": self._conversation_info,
            "conversations.members": self._conversation_members,
            "conversations.history": self._history,
            "conversations.replies": self._replies,
            "assistant.threads.setStatus": lambda args: {"ok": True},
            "assistant.threads.setSuggestedPrompts": lambda args: {"ok": True},
            "chat.delete": self._delete,
            "chat.startStream": self._start_stream,
            "chat.appendStream": self._append_stream,
            "chat.stopStream": self._stop_stream,
        }
        self.app = web.Application()
        self.app.router.add_route("*", "/api/{method}", self._api)
        self.app.router.add_post("/response_url/{name}", self._response_url)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._stack = AsyncExitStack()
        self._url = await self._stack.enter_async_context(serve_local(self.app))

    async def stop(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack, self._url = None, None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("FakeSlack is not started")
        return self._url

    @property
    def base_url(self) -> str:
        """For `AsyncWebClient(base_url=...)`, which needs the trailing slash."""
        return f"{self.url}/api/"

    def response_url(self, name: str = "default") -> str:
        """A response_url whose POSTs are recorded as method `response_url:<name>`."""
        return f"{self.url}/response_url/{name}"

    # -- inspection and fault injection ----------------------------------------------------

    def calls_to(self, method: str) -> list[Call]:
        """Every attempt at `method`, injected failures included (to count retries)."""
        return [c for c in self.calls if c.method == method]

    async def wait_for(
        self,
        method: str,
        count: int = 1,
        timeout: float = DEADLINE,  # noqa: ASYNC109 - a test helper's deadline, like pytest's
        predicate: Callable[[Call], bool] | None = None,
        *,
        include_injected: bool = False,
    ) -> list[Call]:
        """Wait until `count` matching calls were answered; returns the first `count`."""

        def matching() -> list[Call]:
            return [
                c
                for c in self.calls_to(method)
                if (include_injected or not c.injected) and (predicate is None or predicate(c))
            ]

        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(lambda: len(matching()) >= count)
        except TimeoutError:
            seen = "\n".join(
                f"  {c.method}{' [injected]' if c.injected else ''} {json.dumps(c.args)[:150]}"
                for c in self.calls
            )
            raise AssertionError(
                f"expected {count} call(s) to {method}, got {len(matching())} within {timeout}s; "
                f"received:\n{seen or '  nothing'}"
            ) from None
        return matching()[:count]

    def finished(self, message: JSON) -> bool:
        """Whether a reader sees the message whole (not mid-stream)."""
        return str(message.get("ts")) not in self._streaming

    def thread(self, channel: str, thread_ts: str) -> list[JSON]:
        """The messages the bot has in a thread now (deleted ones gone), oldest first."""
        found = [
            m
            for m in self.messages.values()
            if m.get("channel") == channel and m.get("thread_ts") == thread_ts
        ]
        return sorted(found, key=lambda m: float(m["ts"]))

    async def wait_for_message(
        self,
        predicate: Callable[[JSON], bool],
        timeout: float = DEADLINE,  # noqa: ASYNC109 - a test helper's deadline, like pytest's
    ) -> JSON:
        """The first message, as a reader sees it once whole, that matches `predicate`."""

        def found() -> JSON | None:
            messages = sorted(self.messages.values(), key=lambda m: float(m["ts"]))
            return next((m for m in messages if self.finished(m) and predicate(m)), None)

        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(lambda: found() is not None)
        except TimeoutError:
            seen = "\n".join(f"  {json.dumps(m)[:200]}" for m in self.messages.values())
            raise AssertionError(
                f"no such message within {timeout}s; messages:\n{seen or '  none'}"
            ) from None
        message = found()
        assert message is not None
        return message

    def fail_next(
        self,
        method: str,
        *,
        status: int | None = None,
        error: str | None = None,
        retry_after: int | None = None,
        times: int = 1,
    ) -> None:
        """Fail the next `times` calls: HTTP `status` (429 sends Retry-After) or 200 + `error`."""
        if status is None and error is None:
            raise ValueError("give status=, error= or both")
        status = status or 200
        if error is None:
            error = "ratelimited" if status == 429 else "internal_error"
        if status == 429 and retry_after is None:
            retry_after = 1
        self._faults.setdefault(method, deque()).append(_Fault(status, error, retry_after, times))

    def _take_fault(self, method: str) -> _Fault | None:
        queue = self._faults.get(method)
        if not queue:
            return None
        fault = queue[0]
        fault.times -= 1
        if fault.times <= 0:
            queue.popleft()
        return fault

    # -- HTTP ------------------------------------------------------------------------------

    async def _answer(
        self, method: str, request: web.Request, answer: Callable[[Call], web.Response]
    ) -> web.Response:
        """Record the call only after computing the answer, so waiters see its effects."""
        args = await _read_args(request)
        fault = self._take_fault(method)
        call = Call(method, args, CIMultiDict(request.headers), injected=fault is not None)
        if fault is not None:
            retry = fault.retry_after
            headers = {"Retry-After": str(retry)} if retry is not None else {}
            response = web.json_response(_err(fault.error), status=fault.status, headers=headers)
        else:
            response = answer(call)
        async with self._cond:
            self.calls.append(call)
            self._cond.notify_all()
        return response

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if delay := self.delays.get(method, self.delays.get("*")):
            await asyncio.sleep(delay)  # Slack being slow, as a test asked

        def answer(call: Call) -> web.Response:
            handler = self.handlers.get(call.method)
            if call.token is None:
                return web.json_response(_err("invalid_auth"))
            return web.json_response(handler(call.args) if handler else _err("unknown_method"))

        return await self._answer(request.match_info["method"], request, answer)

    async def _response_url(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        return await self._answer(
            f"response_url:{name}", request, lambda _: web.Response(text="ok")
        )

    # -- methods ---------------------------------------------------------------------------

    def _next_ts(self) -> str:
        self._ticks += 100
        return f"{self._ticks // 1_000_000}.{self._ticks % 1_000_000:06d}"

    def _message(self, args: JSON, ts: str) -> JSON:
        msg: JSON = {
            "type": "message",
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "team": self.team_id,
            "text": args.get("text", ""),
            "ts": ts,
            "channel": args.get("channel"),  # a fake's own note: where it was posted
        }
        extra = ("blocks", "attachments", "thread_ts", "metadata")
        msg.update({k: args[k] for k in extra if k in args})
        return msg

    def _auth_test(self, args: JSON) -> JSON:
        return {
            "ok": True,
            "url": "https://example.slack.com/",
            "team": "Example",
            "user": "greenlight",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _post_message(self, args: JSON) -> JSON:
        if not args.get("channel"):
            return _err("channel_not_found")
        if not any(args.get(k) for k in ("text", "blocks", "attachments")):
            return _err("no_text")
        ts = self._next_ts()
        self.messages[ts] = self._message(args, ts)
        return {"ok": True, "channel": args["channel"], "ts": ts, "message": self.messages[ts]}

    def _update(self, args: JSON) -> JSON:
        """Lenient: updating a ts this fake never posted creates it (cards built by tests)."""
        channel, ts = args.get("channel"), args.get("ts")
        if not channel or not ts:
            return _err("message_not_found")
        msg = self.messages.setdefault(ts, self._message({}, ts))
        msg.update({k: args[k] for k in ("text", "blocks", "attachments", "metadata") if k in args})
        msg["edited"] = {"user": self.bot_user_id, "ts": self._next_ts()}
        self._streaming.discard(ts)  # an update ends a stream (one that expired, say)
        return {"ok": True, "channel": channel, "ts": ts, "text": msg["text"], "message": msg}

    def _post_ephemeral(self, args: JSON) -> JSON:
        if not args.get("channel") or not args.get("user"):
            return _err("user_not_in_channel")
        return {"ok": True, "message_ts": self._next_ts()}

    def _permalink(self, args: JSON) -> JSON:
        channel, ts = str(args.get("channel", "")), str(args.get("message_ts", ""))
        if not channel or not ts:
            return _err("message_not_found")
        link = f"https://example.slack.com/archives/{channel}/p{ts.replace('.', '')}"
        return {"ok": True, "channel": channel, "permalink": link}

    def _views_open(self, args: JSON) -> JSON:
        view = args.get("view")
        trigger = args.get("trigger_id") or args.get("interactivity_pointer")
        if not isinstance(view, dict) or not trigger:
            return _err("invalid_arguments")
        self._views += 1
        view_id = f"V{self._views:08d}"
        opened: JSON = {"id": view_id, "team_id": self.team_id, "app_id": self.app_id}
        opened |= {"bot_id": self.bot_id, "state": {"values": {}}, "hash": f"{view_id}.hash"}
        opened |= {"root_view_id": view_id, "previous_view_id": None}
        return {"ok": True, "view": {"private_metadata": "", "callback_id": "", **view, **opened}}

    def _views_update(self, args: JSON) -> JSON:
        view, view_id = args.get("view"), args.get("view_id")
        if not isinstance(view, dict) or not isinstance(view_id, str):
            return _err("invalid_arguments")
        if not view_id.startswith("V") or int(view_id[1:] or 0) > self._views:
            return _err("not_found")
        opened: JSON = {"id": view_id, "team_id": self.team_id, "app_id": self.app_id}
        return {"ok": True, "view": {"private_metadata": "", "callback_id": "", **view, **opened}}

    def _views_publish(self, args: JSON) -> JSON:
        view, user = args.get("view"), args.get("user_id")
        if not isinstance(view, dict) or view.get("type") != "home" or not user:
            return _err("invalid_arguments")
        if len(view.get("blocks") or []) > 100:
            return _err("invalid_blocks")
        self._views += 1
        view_id = f"V{self._views:08d}"
        published: JSON = {"id": view_id, "team_id": self.team_id, "app_id": self.app_id}
        published |= {"private_metadata": "", "callback_id": "", "hash": f"{view_id}.hash"}
        published = {**published, **view, "id": view_id, "state": {"values": {}}}
        self.homes.setdefault(str(user), []).append(published)
        return {"ok": True, "view": published}

    def _users_info(self, args: JSON) -> JSON:
        uid = args.get("user")
        if not uid:
            return _err("user_not_found")
        return {"ok": True, "user": self._user(uid, args.get("team_id", self.team_id))}

    def _users_list(self, args: JSON) -> JSON:
        """`listed`, a page of `limit` at a time (the cursor: where the next page starts)."""
        start, limit = int(args.get("cursor") or 0), int(args.get("limit") or 100)
        page = self.listed[start : start + limit]
        more = start + limit < len(self.listed)
        return {
            "ok": True,
            "members": [self._user(uid, self.team_id) for uid in page],
            "response_metadata": {"next_cursor": str(start + limit) if more else ""},
        }

    def _user(self, uid: str, team_id: str) -> JSON:
        """A person as users.info and users.list give them: a member of `team_id`, but for
        what `users` says of them."""
        user: JSON = {
            "id": uid,
            "team_id": team_id,
            "name": f"user-{uid.lower()}",
            "real_name": f"User {uid}",
            "deleted": False,
            "is_bot": False,
            "is_admin": False,
            "is_owner": False,
            "is_primary_owner": False,
            "tz": "Europe/London",
            "profile": {"display_name": f"user-{uid.lower()}", "real_name": f"User {uid}"},
        }
        return user | self.users.get(uid, {})

    def _usergroup_users(self, args: JSON) -> JSON:
        group = args.get("usergroup")
        if group not in self.usergroups:
            return _err("no_such_subteam")
        return {"ok": True, "users": list(self.usergroups[group])}

    def _conversation_info(self, args: JSON) -> JSON:
        cid = str(args.get("channel", ""))
        if not cid:
            return _err("channel_not_found")
        kind = cid[:1]
        channel: JSON = {
            "id": cid,
            "name": cid.lower(),
            "is_channel": kind == "C",
            "is_group": kind == "G",
            "is_im": kind == "D",
            "is_private": kind != "C",
            "is_archived": False,
            "is_member": True,
            "is_ext_shared": False,
        }
        return {"ok": True, "channel": channel | self.channels.get(cid, {})}

    def _history(self, args: JSON) -> JSON:
        """The channel's messages this fake posted, newest first, from `oldest` on."""
        channel, oldest = args.get("channel"), float(args.get("oldest") or 0)
        with_meta = str(args.get("include_all_metadata")).lower() in ("true", "1")
        found = [
            {k: v for k, v in m.items() if with_meta or k != "metadata"}
            for ts, m in sorted(self.messages.items(), reverse=True)
            if m.get("channel") == channel and float(ts) >= oldest
        ]
        return {"ok": True, "messages": found, "has_more": False}

    def _replies(self, args: JSON) -> JSON:
        """A thread's messages this fake posted (its parent among them), oldest first."""
        thread = str(args.get("ts") or "")
        if not thread:
            return _err("thread_not_found")
        found = [
            m
            for m in self._history(args)["messages"]
            if thread in (m.get("ts"), m.get("thread_ts"))
        ]
        return {"ok": True, "messages": found[::-1], "has_more": False}

    def _conversation_members(self, args: JSON) -> JSON:
        members = self.members.get(str(args.get("channel", "")), [])
        return {"ok": True, "members": members, "response_metadata": {"next_cursor": ""}}

    def _delete(self, args: JSON) -> JSON:
        ts = str(args.get("ts", ""))
        if self.messages.get(ts, {}).get("channel") != args.get("channel"):
            return _err("message_not_found")
        del self.messages[ts]
        return {"ok": True, "channel": args.get("channel"), "ts": ts}

    def _start_stream(self, args: JSON) -> JSON:
        if not args.get("channel") or not args.get("thread_ts"):
            return _err("invalid_arguments")
        ts = self._next_ts()
        self.messages[ts] = self._message({"text": _stream_text(args), **args}, ts)
        self._streaming.add(ts)
        return {"ok": True, "channel": args["channel"], "ts": ts}

    def _append_stream(self, args: JSON, *, stop: bool = False) -> JSON:
        ts = str(args.get("ts", ""))
        if ts not in self.messages:
            return _err("message_not_found")
        if ts not in self._streaming:
            return _err("message_not_in_streaming_state")
        msg = self.messages[ts]
        msg["text"] += _stream_text(args)
        if stop:
            self._streaming.discard(ts)
            msg.update({k: args[k] for k in ("blocks", "metadata") if k in args})
            return {"ok": True, "channel": args.get("channel"), "ts": ts, "message": msg}
        return {"ok": True, "channel": args.get("channel"), "ts": ts}

    def _stop_stream(self, args: JSON) -> JSON:
        return self._append_stream(args, stop=True)
