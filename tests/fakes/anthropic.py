"""A local stand-in for Anthropic's Messages API, spoken to by the real Claude Code CLI.

Claude Code sends `POST /v1/messages` (streamed as SSE, or not) to `ANTHROPIC_BASE_URL`
with `x-api-key`; this fake answers each one with what `answer(request_json)` decides, so a
test can play the model: a `tool_use` first, then text once the tool's result comes back.
Anything else (token counts, unknown paths) gets a harmless answer, and is recorded too.

    async with FakeAnthropic(lambda body: tool_use("Bash", {"command": "echo hi"})) as api:
        env["ANTHROPIC_BASE_URL"] = api.base_url
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.local import LocalServer

JSON = dict[str, Any]
MODEL = "claude-fake-1"


@dataclass(frozen=True)
class Reply:
    """One assistant message: its content blocks and why it stopped."""

    content: tuple[JSON, ...]
    stop_reason: str = "end_turn"


def text(value: str) -> Reply:
    return Reply(({"type": "text", "text": value},))


def tool_use(name: str, input: JSON, *, id: str = "toolu_fake_1") -> Reply:
    return Reply(({"type": "tool_use", "id": id, "name": name, "input": input},), "tool_use")


def tool_results(body: JSON) -> list[JSON]:
    """The `tool_result` blocks of the request's last message (what the tools just gave)."""
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def result_text(block: JSON) -> str:
    """A tool_result's text, whether its content is a string or a list of text blocks."""
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def tool_names(body: JSON) -> set[str]:
    return {str(t.get("name")) for t in body.get("tools") or [] if isinstance(t, dict)}


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    json: JSON | None
    headers: dict[str, str]  # names lower-cased


def _events(reply: Reply, message_id: str) -> list[tuple[str, JSON]]:
    """The SSE events of one streamed message, as the Messages API sends them."""
    usage = {"input_tokens": 10, "output_tokens": 1}
    start: JSON = {"id": message_id, "type": "message", "role": "assistant", "model": MODEL}
    start |= {"content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
    events: list[tuple[str, JSON]] = [("message_start", {"message": start})]
    for index, block in enumerate(reply.content):
        if block["type"] == "tool_use":
            opened = block | {"input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        events += [
            ("content_block_start", {"index": index, "content_block": opened}),
            ("content_block_delta", {"index": index, "delta": delta}),
            ("content_block_stop", {"index": index}),
        ]
    stopped = {"stop_reason": reply.stop_reason, "stop_sequence": None}
    events += [
        ("message_delta", {"delta": stopped, "usage": {"output_tokens": 5}}),
        ("message_stop", {}),
    ]
    return events


class FakeAnthropic(LocalServer):
    """An aiohttp server on 127.0.0.1 (ephemeral port): `answer` plays the model."""

    def __init__(self, answer: Callable[[JSON], Reply]) -> None:
        self.answer = answer
        self.requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)

    def messages(self) -> list[JSON]:
        """The bodies of every Messages call, in order."""
        return [r.json or {} for r in self.requests if r.path == "/v1/messages"]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append(RecordedRequest(request.method, request.path, parsed, headers))
        if not (headers.get("x-api-key") or headers.get("authorization")):
            error = {"type": "authentication_error", "message": "no API key"}
            return web.json_response({"type": "error", "error": error}, status=401)
        if request.method == "POST" and request.path == "/v1/messages/count_tokens":
            return web.json_response({"input_tokens": 10})
        if request.method != "POST" or request.path != "/v1/messages":
            error = {"type": "not_found_error", "message": f"no {request.path} here"}
            return web.json_response({"type": "error", "error": error}, status=404)
        reply = self.answer(parsed or {})
        message_id = f"msg_fake_{next(self._ids)}"
        if not (parsed or {}).get("stream"):
            return web.json_response(self._whole(reply, message_id))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event, data in _events(reply, message_id):
            payload = json.dumps({"type": event} | data)
            await response.write(f"event: {event}\ndata: {payload}\n\n".encode())
        await response.write_eof()
        return response

    @staticmethod
    def _whole(reply: Reply, message_id: str) -> JSON:
        return {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": list(reply.content),
            "stop_reason": reply.stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
