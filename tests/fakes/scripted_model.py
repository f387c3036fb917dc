"""A scripted Genkit model for fast tests: replies decided per request, requests recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from genkit import Part, Role
from genkit.exp import Genkit
from genkit.model import Message, ModelRequest, ModelResponse

Reply = ModelResponse | Callable[[ModelRequest[Any]], Awaitable[ModelResponse] | ModelResponse]


def text(value: str) -> ModelResponse:
    return ModelResponse(message=Message(role=Role.MODEL, content=[Part.from_text(value)]))


def calls(*requests: tuple[str, dict[str, Any]] | tuple[str, dict[str, Any], str]) -> ModelResponse:
    """Tool calls in one model message: (name, input) or (name, input, ref)."""
    parts = [
        Part.from_tool_request(name=r[0], input=r[1], ref=r[2] if len(r) > 2 else None)
        for r in requests
    ]
    return ModelResponse(message=Message(role=Role.MODEL, content=parts))


def tool_responses(request: ModelRequest[Any]) -> list[dict[str, Any]]:
    """The tool responses of the request's last message, as JSON."""
    last = request.messages[-1]
    return [
        p.tool_response.model_dump(mode="json", exclude_none=True)
        for p in last.content
        if p.tool_response is not None
    ]


class ScriptedModel:
    """Replies are consumed in order; a callable reply sees the request."""

    def __init__(self, name: str = "scripted") -> None:
        self.name = name
        self.replies: list[Reply] = []
        self.requests: list[ModelRequest[Any]] = []
        self.called = asyncio.Event()

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def register(self, ai: Genkit) -> None:
        async def model_fn(request: ModelRequest[Any], ctx: Any) -> ModelResponse:
            self.requests.append(request)
            self.called.set()
            if not self.replies:
                raise AssertionError("the scripted model ran out of replies")
            reply = self.replies.pop(0)
            if isinstance(reply, ModelResponse):
                return reply
            result = reply(request)
            return await result if asyncio.iscoroutine(result) else result  # type: ignore[return-value]

        ai.define_model(name=self.name, fn=model_fn)
