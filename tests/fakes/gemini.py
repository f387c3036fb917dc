"""A local stand-in for the Gemini API, spoken to by the real genkit-google-genai plugin.

Tests point ``GoogleAI(api_key=..., base_url=gemini.base_url)`` at it and script the model's
answers, so the plugin's own HTTP, SSE parsing and part conversion run for real, offline.

    async with FakeGemini() as gemini:
        gemini.script(text("Hel", "lo"), function_call("lookup", {"q": "x"}, id="c1"))
        gemini.fail(2, status=503)  # the next two generate calls answer 503 first
        gemini.script(text("from the fallback"), model="gemini-2.5-flash")  # that model only
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web

from tests.fakes.local import LocalServer

JSON = dict[str, Any]

API_KEY_HEADER = "x-goog-api-key"
DEFAULT_MODELS = ("gemini-flash-latest", "gemini-2.5-flash", "gemini-embedding-001")
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


@dataclass(frozen=True)
class Reply:
    """One scripted answer: stream chunks, or an error status, after an optional delay."""

    chunks: tuple[JSON, ...] = ()
    status: int = 200
    message: str = ""
    delay: float = 0.0


Script = Reply | Callable[[JSON], Reply]
"""A reply, or a function of the request body returning one (for dynamic behaviour)."""


@dataclass(frozen=True)
class RecordedRequest:
    """What the client sent; header names are lower-cased."""

    method: str
    path: str
    query: dict[str, str]
    json: JSON | None
    headers: dict[str, str]

    @property
    def api_key(self) -> str | None:
        return self.headers.get(API_KEY_HEADER)

    @property
    def model(self) -> str:
        """The model a generate call names (`/v1beta/models/{model}:streamGenerateContent`)."""
        return self.path.removeprefix("/v1beta/models/").partition(":")[0]


def _chunk(parts: list[JSON], *, last: bool) -> JSON:
    """A GenerateContentResponse; the last one carries the finish reason and usage, as Gemini's."""
    candidate: JSON = {"content": {"role": "model", "parts": parts}, "index": 0}
    out: JSON = {"candidates": [candidate], "modelVersion": "fake-gemini"}
    if last:
        candidate["finishReason"] = "STOP"
        out["usageMetadata"] = {
            "promptTokenCount": 1,
            "candidatesTokenCount": 1,
            "totalTokenCount": 2,
        }
    return out


def text(*pieces: str, delay: float = 0.0) -> Reply:
    """A text answer; each piece is its own stream chunk (``text("Hel", "lo")`` streams two)."""
    if not pieces:
        raise ValueError("text() needs at least one piece")
    n = len(pieces)
    return Reply(
        tuple(_chunk([{"text": p}], last=i == n - 1) for i, p in enumerate(pieces)), delay=delay
    )


def call(name: str, args: JSON | None = None, *, id: str | None = None) -> JSON:
    """A ``functionCall`` part for :func:`calls`; ``id=None`` omits the id, as some models do."""
    function_call: JSON = {"name": name, "args": args or {}}
    if id is not None:
        function_call["id"] = id
    return {"functionCall": function_call}


def calls(parts: Sequence[JSON], *, delay: float = 0.0) -> Reply:
    """Several function calls in one model turn, in one chunk, as Gemini sends them."""
    return Reply((_chunk(list(parts), last=True),), delay=delay)


def function_call(
    name: str, args: JSON | None = None, *, id: str | None = "call-1", delay: float = 0.0
) -> Reply:
    """A model turn made of a single function call."""
    return calls([call(name, args, id=id)], delay=delay)


def error(
    status: int = 503, message: str = "The model is overloaded.", *, delay: float = 0.0
) -> Reply:
    """An HTTP error in Google's ``{"error": {...}}`` shape."""
    return Reply(status=status, message=message, delay=delay)


def _error_response(status: int, message: str) -> web.Response:
    code = _STATUS_NAMES.get(status, "UNKNOWN")
    body = {"error": {"code": status, "message": message, "status": code}}
    return web.json_response(body, status=status)


def _model(name: str) -> JSON:
    """A models.list entry with the fields the plugin reads (name, description, methods)."""
    methods = (
        ["embedContent"]
        if "embedding" in name
        else ["generateContent", "countTokens", "createCachedContent", "batchGenerateContent"]
    )
    return {
        "name": f"models/{name}",
        "version": "001",
        "displayName": name,
        "description": f"Fake {name}",
        "inputTokenLimit": 1048576,
        "outputTokenLimit": 65536,
        "supportedGenerationMethods": methods,
        "temperature": 1.0,
        "maxTemperature": 2.0,
        "topP": 0.95,
        "topK": 64,
        "thinking": "embedding" not in name,
    }


def _merged(chunks: Sequence[JSON]) -> JSON:
    """The non-streaming answer: all chunks' parts in one response, adjacent texts joined."""
    parts: list[JSON] = []
    for chunk in chunks:
        for part in chunk["candidates"][0]["content"]["parts"]:
            if "text" in part and parts and "text" in parts[-1]:
                parts[-1] = {"text": parts[-1]["text"] + part["text"]}
            else:
                parts.append(part)
    return _chunk(parts, last=True)


class FakeGemini(LocalServer):
    """An aiohttp server on 127.0.0.1 (ephemeral port) speaking the v1beta REST surface."""

    def __init__(self, *, models: Sequence[str] = DEFAULT_MODELS, page_size: int = 2) -> None:
        self.requests: list[RecordedRequest] = []
        self.ran_out: list[str] = []  # unscripted calls; clear it in a test that wants them
        self._models = [_model(m) for m in models]
        self._page_size = page_size
        self._script: deque[Script] = deque()
        self._scripts: dict[str, deque[Script]] = {}  # per model, before the shared one
        self._failures: dict[str | None, list[int]] = {}  # model (None: any): [status, times]
        self._listing_failures = 0
        self._listing_status = 503
        self.answering = 0  # generate calls being answered now
        self.most_answering = 0  # the most answered at once
        # Cleared by a test: every generate call waits until it is set again.
        self.open = asyncio.Event()
        self.open.set()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await super().__aexit__(exc_type, exc, tb)
        if self.ran_out and exc_type is None:
            # Genkit shows a 500 only as "internal error"; name the real cause here.
            raise AssertionError(f"FakeGemini script ran out for: {self.ran_out}")

    def script(self, *replies: Script, model: str | None = None) -> None:
        """Queue replies for the next generate calls, consumed in order; with `model`, for
        that model's calls only (they take its own replies first, then the shared ones)."""
        queue = self._script if model is None else self._scripts.setdefault(model, deque())
        queue.extend(replies)

    def fail(self, times: int, *, status: int = 503, model: str | None = None) -> None:
        """Make the next `times` generate calls (to `model`, or to any) answer `status`
        before any scripted reply is used: an outage, without scripting each error."""
        self._failures[model] = [status, times]

    @property
    def pending(self) -> int:
        """Replies still queued; a test can assert it reaches 0."""
        return len(self._script) + sum(len(q) for q in self._scripts.values())

    def fail_listing(self, times: int = 1, status: int = 503) -> None:
        """Make the next ``times`` GET /v1beta/models calls answer ``status``."""
        self._listing_failures = times
        self._listing_status = status

    def listing_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == "GET" and r.path == "/v1beta/models"]

    def generate_requests(self, model: str | None = None) -> list[RecordedRequest]:
        """Generate calls, to `model` only if given."""
        return [
            r
            for r in self.requests
            if r.method == "POST" and "Content" in r.path and model in (None, r.model)
        ]

    def function_responses(self) -> list[JSON]:
        """``functionResponse`` objects (id, name, response) each generate call newly sent.

        Every request repeats the whole history, so only the contents after the last model
        turn count: a tool that ran twice shows up twice, a replayed history does not.
        """
        out: list[JSON] = []
        for rec in self.generate_requests():
            tail: list[JSON] = []
            for content in reversed((rec.json or {}).get("contents", [])):
                if content.get("role") == "model":
                    break
                tail.insert(0, content)
            for content in tail:
                parts = content.get("parts", [])
                out += [p["functionResponse"] for p in parts if "functionResponse" in p]
        return out

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        rec = RecordedRequest(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            json=json.loads(body) if body else None,
            headers={k.lower(): v for k, v in request.headers.items()},
        )
        self.requests.append(rec)
        if not rec.api_key:
            return _error_response(401, f"FakeGemini: missing {API_KEY_HEADER} header")
        if rec.method == "GET" and rec.path == "/v1beta/models":
            return self._list(rec)
        prefix, _, method = rec.path.partition(":")
        is_model = prefix.startswith("/v1beta/models/")
        if (
            rec.method == "POST"
            and is_model
            and method in ("generateContent", "streamGenerateContent")
        ):
            return await self._generate(request, rec, stream=method == "streamGenerateContent")
        return _error_response(404, f"FakeGemini does not serve {rec.method} {rec.path}")

    def _list(self, rec: RecordedRequest) -> web.Response:
        if self._listing_failures > 0:
            self._listing_failures -= 1
            return _error_response(self._listing_status, "FakeGemini: model listing is failing")
        size = int(rec.query.get("pageSize") or self._page_size)
        start = int(rec.query.get("pageToken") or 0)
        body: JSON = {"models": self._models[start : start + size]}
        if start + size < len(self._models):
            body["nextPageToken"] = str(start + size)
        return web.json_response(body)

    async def _generate(
        self, request: web.Request, rec: RecordedRequest, *, stream: bool
    ) -> web.StreamResponse:
        if stream and rec.query.get("alt") != "sse":
            return _error_response(400, "FakeGemini streams only with ?alt=sse")
        for key in (rec.model, None):
            failing = self._failures.get(key)
            if failing is not None and failing[1] > 0:
                failing[1] -= 1
                return _error_response(failing[0], f"FakeGemini: {rec.model} is failing")
        queue = self._scripts.get(rec.model) or self._script
        if not queue:
            self.ran_out.append(rec.path)
            return _error_response(
                500, f"FakeGemini script ran out: no reply queued for POST {rec.path}"
            )
        item = queue.popleft()
        reply = item if isinstance(item, Reply) else item(rec.json or {})
        self.answering += 1
        self.most_answering = max(self.most_answering, self.answering)
        try:
            return await self._answer(request, reply, stream=stream)
        finally:
            self.answering -= 1

    async def _answer(
        self, request: web.Request, reply: Reply, *, stream: bool
    ) -> web.StreamResponse:
        await self.open.wait()
        if reply.delay:
            await asyncio.sleep(reply.delay)  # simulated latency, server side only
        if reply.status != 200:
            return _error_response(reply.status, reply.message)
        if not stream:
            return web.json_response(_merged(reply.chunks))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in reply.chunks:
            await response.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
        await response.write_eof()
        return response
