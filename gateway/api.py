"""The approvals API, for agents that are not MCP clients: the caller acts itself; Greenlight
decides and keeps the gate (START_EXECUTION of storage/lifecycle.py: act only after a 200).

JSON in and out, the same Bearer keys as /mcp. Any key of the workspace may read a request;
only its requester's own keys may start, finish or withdraw it (403 for others); an unknown
id, or another workspace's, is 404.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.keys import ApiKey, ApiKeys
from gateway.callbacks import BadCallback, Reach
from gateway.calls import Caller, OverLimit
from gateway.requests import Requests, shown, status_of
from storage.domain import Approval, Finished, Started

BASE = "/api/v1"
MAX_WAIT = 60  # seconds a GET may wait for the decision
ID = r"{id:[0-9a-f-]{8,64}}"
# http(s), a host (no credentials, no IPv6 literal) and a port that is one; where it may go
# is the operator's to allow (gateway/callbacks.py), checked after this.
CALLBACK_URL = r"^https?://[^/?#@:\s\[\]\\]+(:([1-9][0-9]{0,3}|[1-5][0-9]{4}))?([/?#]\S*)?$"


def bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def unauthorized() -> web.Response:
    return web.json_response(
        {"error": "a valid API key is needed: Authorization: Bearer glk_…"},
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="greenlight"'},
    )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NewRequest(_Strict):
    tool: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z][A-Za-z0-9_.\-]*$")
    input: dict[str, Any]
    context: str | None = Field(default=None, max_length=10_000)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    callback_url: str | None = Field(
        default=None, max_length=2048, pattern=CALLBACK_URL, json_schema_extra={"format": "uri"}
    )


class Finish(_Strict):
    ok: bool
    output: Any = None


def problem(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def invalid(exc: ValidationError) -> web.Response:
    fields = {".".join(map(str, e["loc"])) or "body": e["msg"] for e in exc.errors()}
    return problem(400, "invalid request", fields=fields)


class ApiDoor:
    def __init__(self, requests: Requests, keys: ApiKeys, reach: Reach) -> None:
        self._requests = requests
        self._keys = keys
        self._reach = reach
        self._observer = requests.observer

    def routes(self, app: web.Application) -> None:
        app.router.add_get(f"{BASE}/openapi.json", self._openapi)
        app.router.add_post(f"{BASE}/approvals", self._create)
        app.router.add_get(f"{BASE}/approvals/{ID}", self._read)
        app.router.add_post(f"{BASE}/approvals/{ID}/start", self._start)
        app.router.add_post(f"{BASE}/approvals/{ID}/finish", self._finish)
        app.router.add_delete(f"{BASE}/approvals/{ID}", self._cancel)

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)

    async def _key(self, request: web.Request) -> ApiKey | None:
        key = await self._keys.authenticate(bearer(request))
        if key is None:
            self._observer.gateway_call("api", "unauthorized")
        return key

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None

    async def _create(self, request: web.Request) -> web.Response:
        if (key := await self._key(request)) is None:
            return unauthorized()
        try:
            asked = NewRequest.model_validate(await self._body(request))
            if asked.callback_url is not None:
                self._reach.check(asked.callback_url)
        except ValidationError as exc:
            return invalid(exc)
        except BadCallback as exc:
            return problem(400, "invalid request", fields={"callback_url": str(exc)})
        try:
            approval, new = await self._requests.request(
                Caller(key, "api"),
                asked.tool,
                asked.input,
                words=asked.context,
                idempotency_key=asked.idempotency_key,
                callback_url=asked.callback_url,
            )
        except OverLimit:
            self._observer.gateway_call("api", "over_limit")
            return problem(429, "too many requests this minute for this key's owner")
        status = status_of(approval)
        self._observer.gateway_call("api", status if new else "repeated")
        return web.json_response({"id": approval.id, "status": status}, status=201 if new else 200)

    async def _found(self, request: web.Request, *, own: bool) -> Approval | web.Response:
        if (key := await self._key(request)) is None:
            return unauthorized()
        approval = await self._requests.read(key, request.match_info["id"])
        if approval is None:
            return problem(404, "no such approval request")
        if own and approval.request.requester != key.user_id:
            return problem(403, "only the requester's own keys may do that")
        return approval

    async def _read(self, request: web.Request) -> web.Response:
        if (key := await self._key(request)) is None:
            return unauthorized()
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            return problem(400, "wait is a number of seconds, at most 60")
        if not 0 <= wait <= MAX_WAIT:
            return problem(400, "wait is a number of seconds, at most 60")
        approval = await self._requests.wait(key, request.match_info["id"], wait)
        if approval is None:
            return problem(404, "no such approval request")
        return web.json_response(shown(approval))

    async def _start(self, request: web.Request) -> web.Response:
        found = await self._found(request, own=True)
        if isinstance(found, web.Response):
            return found
        if status_of(found) != "approved" or not await self._requests.start(found):
            return problem(409, "not approved, or started already: do not act")
        # The caller's own key, acting now: the input to act on, redacted values and all
        # (they are the caller's own; edits never change them).
        return web.json_response(
            {"id": found.id, "status": "started", "input": found.current.actual}
        )

    async def _finish(self, request: web.Request) -> web.Response:
        found = await self._found(request, own=True)
        if isinstance(found, web.Response):
            return found
        try:
            done = Finish.model_validate(await self._body(request))
        except ValidationError as exc:
            return invalid(exc)
        if not isinstance(found.execution, Started) or isinstance(found.execution, Finished):
            return problem(409, "not started (or finished already)")
        if not await self._requests.finish(found, ok=done.ok, output=done.output):
            return problem(409, "not started (or finished already)")
        return web.json_response({"id": found.id, "status": "finished"})

    async def _cancel(self, request: web.Request) -> web.Response:
        found = await self._found(request, own=True)
        if isinstance(found, web.Response):
            return found
        if not await self._requests.cancel(found):
            return problem(409, "no longer pending")
        self._observer.gateway_call("api", "cancelled")
        return web.json_response({"id": found.id, "status": "cancelled"})


_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
_STATUS = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "status": {"enum": ["pending", "approved", "denied", "expired", "cancelled"]},
        "decided_by": {"type": ["string", "null"]},
        "reason": {"type": ["string", "null"]},
        "input": {"type": "object"},
        "note": {
            "type": ["string", "null"],
            "description": "the approver's note to the agent (Approve with note), else null",
        },
        "redacted": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["id", "status", "decided_by", "reason", "input", "note"],
}


_MADE = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "status": {"type": "string"}},
    "required": ["id", "status"],
}


def _answers(ok: tuple[int, str, dict[str, Any]], *codes: int) -> dict[str, Any]:
    code, description, schema = ok
    json_of = {"application/json": {"schema": schema}}
    out: dict[str, Any] = {str(code): {"description": description, "content": json_of}}
    for code in codes:
        out[str(code)] = {
            "description": "error",
            "content": {"application/json": {"schema": _ERROR}},
        }
    return out


_ID_PARAM = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[0-9a-f-]{8,64}$"},
}
OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Greenlight approvals API", "version": "1"},
    "components": {"securitySchemes": {"key": {"type": "http", "scheme": "bearer"}}},
    "security": [{"key": []}],
    "paths": {
        f"{BASE}/approvals": {
            "post": {
                "summary": "Ask for an approval (policy may allow it at once)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": NewRequest.model_json_schema()}},
                },
                "responses": _answers((201, "created", _MADE), 400, 401, 429)
                | {
                    "200": {
                        "description": "the same idempotency_key again: that request",
                        "content": {"application/json": {"schema": _MADE}},
                    }
                },
            }
        },
        f"{BASE}/approvals/{{id}}": {
            "get": {
                "summary": "Read a request; wait up to `wait` seconds for its decision",
                "parameters": [
                    _ID_PARAM,
                    {
                        "name": "wait",
                        "in": "query",
                        "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT},
                    },
                ],
                "responses": _answers((200, "the request", _STATUS), 400, 401, 404),
            },
            "delete": {
                "summary": "Withdraw a pending request",
                "parameters": [_ID_PARAM],
                "responses": _answers((200, "withdrawn", {"type": "object"}), 401, 403, 404, 409),
            },
        },
        f"{BASE}/approvals/{{id}}/start": {
            "post": {
                "summary": "Claim the approved call: act only after a 200",
                "parameters": [_ID_PARAM],
                "responses": _answers(
                    (200, "yours to run, once", {"type": "object"}), 401, 403, 404, 409
                ),
            }
        },
        f"{BASE}/approvals/{{id}}/finish": {
            "post": {
                "summary": "Say how the call ended (shown on the card)",
                "parameters": [_ID_PARAM],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": Finish.model_json_schema()}},
                },
                "responses": _answers(
                    (200, "recorded", {"type": "object"}), 400, 401, 403, 404, 409
                ),
            }
        },
    },
}
