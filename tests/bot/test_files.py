"""File tools behind approvals (issue 14, part 3): genkit-middleware's Filesystem under
AGENT_FILES_ROOT; reads run, writes wait for a human who sees the diff. Against the real
service, fake Slack and Gemini, PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.files import Files
from bot.server import Service
from tests.bot.conftest import ADMIN, APPROVERS, SlackClient, in_channel, new_ts, settle
from tests.bot.test_e2e import BOSS, REQUESTER, decided_card, reply_in_thread, said, text_of
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import FakeSlack

NOTES = "hello\nworld\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    files = tmp_path / "files"
    files.mkdir()
    (files / "notes.txt").write_text(NOTES)
    return files


@pytest.fixture
def service_overrides(root: Path) -> dict[str, Any]:
    return {"AGENT_FILES_ROOT": root}


async def test_a_read_runs_without_approval(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.script(function_call("read_file", {"file_path": "notes.txt"}), text("It says hello."))
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "what's in notes.txt?", ts=ts))[0] == 200
    await said(fake_slack, "It says hello.")
    await settle(service)
    assert [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)] == []
    model_saw = json.dumps(gemini.generate_requests()[-1].json)
    assert "hello\\nworld" in model_saw  # the file reached the model (as the middleware sends it)
    _, listing = await client.command(team, ADMIN, "list")
    assert "• `read_file` — runs freely" in listing and "• `edit_file` — needs approval" in listing


async def test_each_read_reaches_its_own_turn_with_the_tools_defined_once(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    root: Path,
) -> None:
    """The tools are defined once per process (agent/files.py `Files`), but a file read
    is still queued for the model call that read it, not the one that defined them."""
    (root / "other.txt").write_text("second file\n")
    for name, answer in (("notes.txt", "It says hello."), ("other.txt", "It is the second.")):
        gemini.script(function_call("read_file", {"file_path": name}), text(answer))
        assert (await client.dm(team, REQUESTER, f"what's in {name}?", ts=new_ts()))[0] == 200
        await said(fake_slack, answer)
    await settle(service)
    first, second = (json.dumps(r.json) for r in gemini.generate_requests()[1::2])
    assert "hello\\nworld" in first and "second file" not in first
    assert "second file" in second and "hello\\nworld" not in second
    defined = Files(root_dir=str(root)).tools(None)  # type: ignore[arg-type]
    assert defined is Files(root_dir=str(root)).tools(None)  # type: ignore[arg-type]


async def test_an_edit_shows_its_diff_and_runs_once_when_approved(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    root: Path,
) -> None:
    edits = {"file_path": "notes.txt", "edits": [{"old_string": "world", "new_string": "team"}]}
    gemini.script(function_call("edit_file", edits))
    ts = new_ts()
    card = await client.dm_until_card(team, REQUESTER, "say hello to the team instead", ts=ts)
    shown = json.dumps(card.args["blocks"])
    assert "```\\n--- a/notes.txt\\n+++ b/notes.txt\\n" in shown
    assert "\\n-world\\n+team\\n" in shown
    assert "edit_approve" not in shown  # the file tools have no schema here to edit by
    assert (root / "notes.txt").read_text() == NOTES  # nothing changed yet

    gemini.script(text("Done: it now greets the team."))
    assert (await client.click(team, BOSS, "approve", card))[0] == 200
    assert (await client.click(team, BOSS, "approve", card))[0] == 200  # a double click
    reply = await reply_in_thread(fake_slack, ts)
    assert text_of(reply) == "Done: it now greets the team."
    await settle(service)
    assert (root / "notes.txt").read_text() == "hello\nteam\n"
    [response] = gemini.function_responses()
    assert response["name"] == "edit_file" and "edited successfully" in json.dumps(response)


async def test_a_denied_write_leaves_the_files_alone(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    root: Path,
) -> None:
    write = {"file_path": "plan.md", "content": "# Plan\nship it\n"}
    gemini.script(function_call("write_file", write))
    ts = new_ts()
    card = await client.dm_until_card(team, REQUESTER, "write the plan", ts=ts)
    assert "+++ b/plan.md\\n@@ -0,0 +1,2 @@\\n+# Plan\\n+ship it\\n" in json.dumps(
        card.args["blocks"]
    )
    assert (await client.click(team, BOSS, "deny", card))[0] == 200
    (opened,) = await fake_slack.wait_for("views.open")
    gemini.script(text("Not written."))
    reason = {"reason": {"reason": {"type": "plain_text_input", "value": "not now"}}}
    assert await client.submit(team, BOSS, opened.args["view"], reason) == (200, "")
    await fake_slack.wait_for("chat.update", predicate=decided_card("Denied by"))
    await reply_in_thread(fake_slack, ts)
    await settle(service)
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]  # noqa: ASYNC240
    assert (root / "notes.txt").read_text() == NOTES


@pytest.mark.parametrize("service_overrides", [{"AGENT_ARTIFACTS": True}])
async def test_artifact_writes_wait_for_approval_and_reads_run(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    service_overrides: dict[str, Any],
) -> None:
    _, listing = await client.command(team, ADMIN, "list")
    assert "• `read_artifact` — runs freely" in listing
    assert "• `write_artifact` — needs approval" in listing and "`write_file`" not in listing
    gemini.script(function_call("write_artifact", {"name": "report.md", "content": "# Q3\n"}))
    ts = new_ts()
    card = await client.dm_until_card(team, REQUESTER, "write the Q3 report", ts=ts)
    assert "+++ b/report.md" in json.dumps(card.args["blocks"]) and "+# Q3" in json.dumps(
        card.args["blocks"]
    )
    gemini.script(text("Saved the report."))
    await client.click(team, BOSS, "approve", card)
    reply = await reply_in_thread(fake_slack, ts)
    assert text_of(reply) == "Saved the report."
    [response] = gemini.function_responses()
    assert "saved successfully" in json.dumps(response)
    await settle(service)
