"""The approvals API through aiohttp, as an agent that is not an MCP client uses it: ask,
wait, start once, finish; withdraw; idempotency; who may do what."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.server import Service
from tests.bot.conftest import APPROVERS, SlackClient, in_channel, policy_file
from tests.fakes.slack_api import FakeSlack

OWNER, OTHER, BOSS = "UALICE", "UCAROL", "UBOSS"


@dataclass
class Api:
    http: aiohttp.ClientSession
    base: str

    async def call(
        self, method: str, path: str, token: str | None, body: Any = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.http.request(
            method, f"{self.base}/api/v1{path}", json=body, headers=headers
        ) as response:
            return response.status, await response.json()


@pytest.fixture
async def api(service: Service) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as http:
        yield Api(http, f"http://127.0.0.1:{service.port}")


async def key(service: Service, team: str, user: str = OWNER, name: str = "deployer") -> str:
    assert service.deps is not None
    return (await service.deps.keys.create(team, user, name)).token


async def test_ask_wait_start_once_finish(
    service: Service, api: Api, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    token = await key(service, team)
    asked = {
        "tool": "deployRelease",
        "input": {"version": "1.4.2"},
        "context": "Deploying <!channel> the fix for INC-7",
    }
    status, made = await api.call("POST", "/approvals", token, asked)
    assert status == 201 and made["status"] == "pending"
    [card] = await fake_slack.wait_for(
        "chat.postMessage", timeout=15, predicate=in_channel(APPROVERS)
    )
    shown = json.dumps(card.args["blocks"])
    assert "deployRelease" in shown and "through key `deployer`" in shown
    assert "<!channel>" not in shown  # the caller's words are untrusted: escaped
    # Not approved yet: the caller may not act.
    assert (await api.call("POST", f"/approvals/{made['id']}/start", token))[0] == 409
    status, now = await api.call("GET", f"/approvals/{made['id']}?wait=0", token)
    assert (status, now["status"]) == (200, "pending")

    waiting = asyncio.create_task(api.call("GET", f"/approvals/{made['id']}?wait=30", token))
    await client.click(team, BOSS, "approve", card)
    status, decided = await asyncio.wait_for(waiting, 30)
    assert status == 200
    assert decided == {
        "id": made["id"],
        "status": "approved",
        "decided_by": BOSS,
        "reason": None,
        "input": {"version": "1.4.2"},
        "note": None,
    }
    other = await key(service, team, OTHER, "theirs")
    assert (await api.call("POST", f"/approvals/{made['id']}/start", other))[0] == 403
    starts = await asyncio.gather(
        *(api.call("POST", f"/approvals/{made['id']}/start", token) for _ in range(5))
    )
    assert sorted(s for s, _ in starts) == [200, 409, 409, 409, 409]  # act once
    done = {"ok": True, "output": {"deployed": "1.4.2"}}
    assert (await api.call("POST", f"/approvals/{made['id']}/finish", token, done))[0] == 200
    assert (await api.call("POST", f"/approvals/{made['id']}/finish", token, done))[0] == 409
    # Any key of the workspace may read it.
    assert (await api.call("GET", f"/approvals/{made['id']}", other))[0] == 200


async def test_the_same_idempotency_key_is_the_same_request(
    service: Service, api: Api, fake_slack: FakeSlack, team: str
) -> None:
    token = await key(service, team)
    asked = {"tool": "deployRelease", "input": {"v": 1}, "idempotency_key": "run-42"}
    first = await api.call("POST", "/approvals", token, asked)
    again = await api.call("POST", "/approvals", token, asked)
    assert first[0] == 201 and again[0] == 200 and first[1]["id"] == again[1]["id"]
    await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    await asyncio.sleep(0)
    assert len(fake_slack.calls_to("chat.postMessage")) == 1


@pytest.fixture
def service_overrides(
    request: pytest.FixtureRequest, tmp_path: Path, fake_slack: FakeSlack, team: str
) -> dict[str, Any]:
    """POLICY_FILE naming the API's tool, for the tests that ask for "api_tools"."""
    if getattr(request, "param", None) != "api_tools":
        return {}
    return policy_file(fake_slack, team, tmp_path / "policy.yml", "api_tools: [deployRelease]\n")


@pytest.mark.parametrize("service_overrides", ["api_tools"], indirect=True)
async def test_policy_may_allow_at_once(
    service: Service, api: Api, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    _, done = await client.command(team, "UADMIN", "allow deployRelease")
    assert done.startswith("Done."), done
    token = await key(service, team)
    status, made = await api.call(
        "POST", "/approvals", token, {"tool": "deployRelease", "input": {}}
    )
    assert (status, made["status"]) == (201, "approved")
    _, read = await api.call("GET", f"/approvals/{made['id']}", token)
    assert (read["reason"], read["note"]) == ("allowed by policy", None)  # why, not a note
    assert (await api.call("POST", f"/approvals/{made['id']}/start", token))[0] == 200
    assert fake_slack.calls_to("chat.postMessage") == []


async def test_withdrawn_requests_cannot_start(
    service: Service, api: Api, fake_slack: FakeSlack, team: str
) -> None:
    token = await key(service, team)
    _, made = await api.call("POST", "/approvals", token, {"tool": "deployRelease", "input": {}})
    await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    other = await key(service, team, OTHER, "theirs")
    assert (await api.call("DELETE", f"/approvals/{made['id']}", other))[0] == 403
    assert (await api.call("DELETE", f"/approvals/{made['id']}", token))[0] == 200
    _, now = await api.call("GET", f"/approvals/{made['id']}", token)
    assert now["status"] == "cancelled"
    assert (await api.call("POST", f"/approvals/{made['id']}/start", token))[0] == 409
    [update] = await fake_slack.wait_for("chat.update")
    assert "withdrawn" in json.dumps(update.args)


async def test_keys_ids_and_bodies_are_checked(service: Service, api: Api, team: str) -> None:
    token = await key(service, team)
    assert (await api.call("POST", "/approvals", None, {"tool": "x", "input": {}}))[0] == 401
    assert (await api.call("POST", "/approvals", "glk_" + "a" * 40, {"tool": "x", "input": {}}))[
        0
    ] == 401
    status, body = await api.call("POST", "/approvals", token, {"tool": "x", "input": "no"})
    assert status == 400 and "input" in body["fields"]
    missing = "00000000-0000-0000-0000-000000000000"
    assert (await api.call("GET", f"/approvals/{missing}", token))[0] == 404
    _, made = await api.call("POST", "/approvals", token, {"tool": "deployRelease", "input": {}})
    elsewhere = await key(service, "T" + team[1:][::-1], OWNER, "other-team")
    assert (await api.call("GET", f"/approvals/{made['id']}", elsewhere))[0] == 404
    assert (await api.call("GET", f"/approvals/{made['id']}?wait=61", token))[0] == 400
    status, spec = await api.call("GET", "/openapi.json", None)
    assert status == 200 and spec["openapi"].startswith("3.1")


async def test_an_approvers_note_reaches_the_caller(
    service: Service, api: Api, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    """Approve with note: GET (and so the callback) carries it as `note`; every other field
    as before."""
    from tests.bot.test_approver_tools import note, opened_view, press

    token = await key(service, team)
    _, made = await api.call("POST", "/approvals", token, {"tool": "deployRelease", "input": {}})
    [card] = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
    assert (await press(client, team, BOSS, "approve_menu", f"note:{made['id']}~1", card))[0] == 200
    view = await opened_view(fake_slack, 0)
    words = "Deploy after 18:00 <!channel>; roll back if errors rise."
    assert await client.submit(team, BOSS, view, note(words)) == (200, "")
    status, decided = await api.call("GET", f"/approvals/{made['id']}?wait=30", token)
    assert status == 200
    assert decided == {
        "id": made["id"],
        "status": "approved",
        "decided_by": BOSS,
        "reason": words,  # as it was before `note`: an Approve's reason is its note
        "input": {},
        "note": words,  # as written: the caller's to escape where it shows it
    }
