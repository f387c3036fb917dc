"""Issue 26, redacted fields: a tool's policy may say `redact: [toAccount]`. The card, the
Home, Show full request, Show conversation, the audit trail, its export and the logs show
`•••• (N characters)` and say something is hidden; the tool gets the value; the audit trail
keeps its SHA-256; no approver edits it. Through the real service (Bolt over HTTP, signed
requests), fake Slack, fake Gemini and PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot import audit_export
from bot.server import Service
from storage.db import SessionFactory
from tests import ledger_tools
from tests.bot.conftest import (
    APPROVERS,
    DM,
    SlackClient,
    button_value,
    in_channel,
    new_ts,
    policy_file,
    settle,
)
from tests.bot.test_approver_tools import press, rows
from tests.bot.test_e2e import decided_card
from tests.bot.test_gateway_mcp import card_for, mcp_client, new_key
from tests.bot.test_home import open_home
from tests.bot.test_versions import form, open_edit
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import Call, FakeSlack

BOSS, REQUESTER = "UBOSS", "UEMP"
SECRET = "ACC-SECRET-7781"
MASK = "•••• (15 characters)"
POLICY = """\
api_tools: [deployRelease]
tools:
  transferMoney:
    redact: [toAccount]
  deployRelease:
    redact: [token]
  prompt.Bash:
    redact: [password]
"""


@pytest.fixture
def service_overrides(tmp_path: Path, fake_slack: FakeSlack, team: str) -> dict[str, Any]:
    return policy_file(fake_slack, team, tmp_path / "policy.yml", POLICY)


async def asked(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, to: str = SECRET
) -> Call:
    """A DM that names the account (so it is quoted on the card too), whose transferMoney
    call needs a card: the card."""
    before = len([c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)])
    gemini.script(function_call("transferMoney", {"amount": 500, "toAccount": to}, id="c1"))
    event = sp.message_im_event(team, REQUESTER, DM, f"pay 500 to {to} please", new_ts())
    assert (await client.send(event))[0] == 200
    found = await fake_slack.wait_for(
        "chat.postMessage", count=before + 1, predicate=in_channel(APPROVERS)
    )
    return found[-1]


def everything_sent(fake_slack: FakeSlack) -> str:
    return json.dumps([c.args for c in fake_slack.calls], ensure_ascii=False)


async def exported(bot_database: str, team: str) -> str:
    args = audit_export.parser().parse_args(["--since", "2000-01-01", "--team", team])
    out = io.StringIO()
    assert await audit_export.export(args, bot_database, out) == 0
    return out.getvalue()


async def test_a_redacted_field_is_hidden_everywhere_and_the_tool_gets_it(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
    bot_database: str,
    ledger: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    for ours in ("bot", "agent", "storage", "gateway"):  # our own, to the last line
        caplog.set_level(logging.DEBUG, logger=ours)
    card = await asked(client, fake_slack, gemini, team)
    shown = json.dumps(card.args, ensure_ascii=False)
    assert SECRET not in shown and MASK in shown
    assert "Hidden by the tool's policy: `toAccount`" in shown
    assert "pay 500 to " + MASK in shown  # the quoted message too
    approval_id = button_value(card, "approve").split("~")[0]

    home = await open_home(client, team, BOSS)
    assert MASK in json.dumps(home, ensure_ascii=False)
    assert "hidden by policy: `toAccount`" in json.dumps(home, ensure_ascii=False)

    assert (await press(client, team, BOSS, "show_request", approval_id, card))[0] == 200
    (full,) = await fake_slack.wait_for("views.open")
    assert MASK in json.dumps(full.args["view"], ensure_ascii=False)
    assert "Hidden by the tool's policy" in json.dumps(full.args["view"], ensure_ascii=False)
    assert (await client.click(team, BOSS, "show_conversation", card))[0] == 200
    talk = (await fake_slack.wait_for("views.open", count=2))[-1]
    conversation = json.dumps(talk.args["view"], ensure_ascii=False)
    assert f"pay 500 to {MASK} please" in conversation  # the requester's words
    assert f'"toAccount": "{MASK}"' in conversation.replace('\\"', '"')  # the model's call
    assert "are hidden by the tool's policy" in conversation

    gemini.script(text("Sent."))
    assert (await client.click(team, BOSS, "approve", card))[0] == 200
    await fake_slack.wait_for("chat.update", predicate=decided_card("Approved by"))
    await settle(service)
    # The tool got the value itself.
    assert [e["to"] for e in ledger_tools.entries() if e["tool"] == "transferMoney"] == [SECRET]

    # Nothing the bot sent to Slack, nothing it logged, no audit row, no export holds it.
    assert SECRET not in everything_sent(fake_slack)
    assert SECRET not in caplog.text
    assert service.deps is not None
    trail = await service.deps.workflow.reads.audit_trail(team)
    assert SECRET not in json.dumps([e.detail for e in trail], ensure_ascii=False)
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    requested = next(e for e in trail if e.action == "requested")
    assert requested.detail["input"]["toAccount"] == MASK
    assert requested.detail["sha256"] == {"toAccount": digest}
    export = await exported(bot_database, team)
    assert SECRET not in export and digest in export and "requested" in export
    # Stored: the masks where anything reads the request, the value apart for the tool.
    (row,) = await rows(bot_sessions, team)
    assert row.input["toAccount"] == MASK and row.secrets == [
        {"path": ["toAccount"], "value": SECRET}
    ]


async def test_equal_values_keep_equal_digests_in_the_audit_trail(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    for to in (SECRET, SECRET, "ACC-OTHER-0000"):
        await asked(client, fake_slack, gemini, team, to)
    await settle(service)
    assert service.deps is not None
    trail = await service.deps.workflow.reads.audit_trail(team)
    digests = [e.detail["sha256"]["toAccount"] for e in trail if e.action == "requested"]
    assert len(digests) == 3 and len(set(digests)) == 2
    assert digests.count(hashlib.sha256(SECRET.encode()).hexdigest()) == 2


async def test_an_approver_cannot_edit_a_redacted_field(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    ledger: Path,
) -> None:
    card = await asked(client, fake_slack, gemini, team)
    view = await open_edit(client, fake_slack, team, BOSS, card)
    (field,) = [b for b in view["blocks"] if b.get("block_id") == "toAccount"]
    assert field["element"]["initial_value"] == MASK and "leave it as it is" in json.dumps(field)
    assert SECRET not in json.dumps(view, ensure_ascii=False)

    # Changed (or emptied): refused next to the field; nothing runs.
    for tried in ("ACC-EVIL-1", ""):
        status, body = await client.submit(team, BOSS, view, form(amount="500", toAccount=tried))
        assert status == 200
        errors = json.loads(body)["errors"]
        assert "cannot be changed" in errors["toAccount"], errors
    await settle(service)
    assert ledger_tools.entries() == []

    # The other fields may change; the tool gets the agent's value for the hidden one.
    gemini.script(text("Sent 250."))
    status, body = await client.submit(team, BOSS, view, form(amount="250", toAccount=MASK))
    assert status == 200 and not body, body
    await fake_slack.wait_for("chat.update", predicate=decided_card("Approved by"))
    await settle(service)
    [ran] = [e for e in ledger_tools.entries() if e["tool"] == "transferMoney"]
    assert (ran["amount"], ran["to"]) == (250, SECRET)
    assert SECRET not in everything_sent(fake_slack)


async def test_the_api_shows_the_mask_and_gives_the_value_to_its_own_key_at_start(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    assert service.deps is not None
    token = (await service.deps.keys.create(team, "UALICE", "deployer")).token
    secret = "tok-1234567890"
    base = f"http://127.0.0.1:{service.port}/api/v1"
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=auth) as http:
        made = await (
            await http.post(
                f"{base}/approvals",
                json={"tool": "deployRelease", "input": {"version": "2", "token": secret}},
            )
        ).json()
        [card] = await fake_slack.wait_for("chat.postMessage", predicate=in_channel(APPROVERS))
        assert secret not in json.dumps(card.args) and "•••• (14 characters)" in json.dumps(
            card.args, ensure_ascii=False
        )
        read = await (await http.get(f"{base}/approvals/{made['id']}")).json()
        assert read["input"] == {"version": "2", "token": "•••• (14 characters)"}
        assert read["redacted"] == ["token"]
        await client.click(team, BOSS, "approve", card)
        await poll(lambda: bool(fake_slack.calls_to("chat.update")), "the decided card")
        started = await (await http.post(f"{base}/approvals/{made['id']}/start")).json()
    # The requester's own key, acting now: its own value back.
    assert started["input"] == {"version": "2", "token": secret}


async def test_a_claude_code_prompt_hides_the_field_and_gets_it_back_once_approved(
    service: Service, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    """The MCP door's card is redacted as any; Claude Code runs what it asked, value and all."""
    secret = "pg-pass-998877"
    asked = {"tool_name": "Bash", "input": {"command": "psql", "password": secret}}
    async with mcp_client(service, await new_key(service, team)) as mcp:
        call = asyncio.create_task(mcp.call_tool("approval_prompt", asked))
        card = await card_for(fake_slack)
        shown = json.dumps(card.args, ensure_ascii=False)
        assert secret not in shown and "•••• (14 characters)" in shown
        await client.click(team, BOSS, "approve", card)
        result = await asyncio.wait_for(call, 30)
    answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert answer == {"behavior": "allow", "updatedInput": {"command": "psql", "password": secret}}
    await settle(service)
    assert service.deps is not None
    trail = await service.deps.workflow.reads.audit_trail(team)
    assert secret not in json.dumps([e.detail for e in trail])  # its output too
    assert secret not in everything_sent(fake_slack)


async def test_explain_says_what_is_hidden_and_shows_no_value(
    client: SlackClient, team: str, service: Service
) -> None:
    call = json.dumps({"amount": 5, "toAccount": SECRET})
    _, reply = await client.command(team, "UANYONE", f"explain transferMoney {call}")
    assert SECRET not in reply and MASK in reply
    assert "Hidden on the card, the Home, the audit trail and the logs: `toAccount`" in reply
    _, listed = await client.command(team, "UANYONE", "list")
    assert "hides `toAccount`" in listed
