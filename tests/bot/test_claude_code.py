"""Claude Code itself (the `claude` CLI) against the running service, set up as
docs/gateway.md says: its `--permission-prompt-tool` asks Greenlight over MCP, a card goes
to (fake) Slack, and what a person decides there is what Claude Code does. The model is a
fake Anthropic Messages API on 127.0.0.1 (tests/fakes/anthropic.py); nothing reaches the
internet.

It runs when the CLI is installed (`CLAUDE_CODE_BIN`, else `claude` on PATH) and is skipped
otherwise: CI installs no npm packages. To run it:

    npm install --prefix /tmp/claude-code @anthropic-ai/claude-code
    CLAUDE_CODE_BIN=/tmp/claude-code/node_modules/.bin/claude \\
        .venv/bin/python -m pytest tests/bot/test_claude_code.py
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.server import Service
from tests import ledger_tools
from tests.bot.conftest import APPROVERS, SlackClient, in_channel
from tests.bot.test_edits import open_edit
from tests.bot.test_gateway_mcp import BOSS, new_key
from tests.fakes import anthropic
from tests.fakes.anthropic import JSON, FakeAnthropic, Reply
from tests.fakes.slack_api import DEADLINE, Call, FakeSlack

CLAUDE = os.environ.get("CLAUDE_CODE_BIN") or shutil.which("claude")
pytestmark = pytest.mark.skipif(
    CLAUDE is None,
    reason="Claude Code is not installed: `npm install --prefix /tmp/claude-code "
    "@anthropic-ai/claude-code`, then CLAUDE_CODE_BIN=/tmp/claude-code/node_modules/.bin/claude",
)
PROMPT_TOOL = "mcp__greenlight__approval_prompt"
OFFLINE = {  # Claude Code reaches nothing but the fake model and Greenlight
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}
# A bound on failing, not a measurement: a 250 MB CLI starting on a loaded 2-core machine
# and asking the model before it asks Greenlight.
CLI_DEADLINE = 2 * DEADLINE
WRITE = {"command": "echo hi > greenlight.txt", "description": "Write hi to a file"}


def calls_once(tool: str, args: JSON) -> Callable[[JSON], Reply]:
    """The model: asked with tools (the turn itself), it calls `tool` once; given the
    result, it ends the turn; anything else Claude Code asks (no tools) gets a word."""

    def answer(body: JSON) -> Reply:
        if anthropic.tool_results(body):
            return anthropic.text("done")
        if body.get("tools"):
            return anthropic.tool_use(tool, args)
        return anthropic.text("ok")

    return answer


async def card_for(slack: FakeSlack) -> Call:
    [card] = await slack.wait_for(
        "chat.postMessage", timeout=CLI_DEADLINE, predicate=in_channel(APPROVERS)
    )
    return card


@dataclass
class Run:
    """One `claude -p` run: its process, its working directory, the model it talks to."""

    process: asyncio.subprocess.Process
    work: Path
    model: FakeAnthropic

    async def exited(self) -> tuple[int | None, str, str]:
        """Its exit status and output, once it exits (which it must, in time)."""
        out, err = await asyncio.wait_for(self.process.communicate(), CLI_DEADLINE)
        return self.process.returncode, out.decode(), err.decode()

    async def finished(self) -> dict[str, Any]:
        """Claude Code's JSON result, once it exits with 0."""
        status, out, err = await self.exited()
        assert status == 0, err
        result: dict[str, Any] = json.loads(out)
        return result

    def results(self) -> list[JSON]:
        """The tool results Claude Code gave the model."""
        return [b for body in self.model.messages() for b in anthropic.tool_results(body)]


@dataclass
class ClaudeCode:
    service: Service
    token: str
    home: Path
    runs: list[Run]

    async def start(self, answer: Callable[[JSON], Reply], *args: str, **env: str) -> Run:
        """`claude -p` with the docs' MCP config and permission prompt tool; the key comes
        from the environment, as the docs show."""
        assert CLAUDE is not None
        work = self.home / f"work{len(self.runs)}"
        work.mkdir()
        server = {
            "type": "http",
            "url": f"http://127.0.0.1:{self.service.port}/mcp",
            "headers": {"Authorization": "Bearer ${GREENLIGHT_KEY}"},
        }
        config = self.home / f"mcp{len(self.runs)}.json"
        config.write_text(json.dumps({"mcpServers": {"greenlight": server}}))
        model = await FakeAnthropic(answer).__aenter__()
        environment = {
            "PATH": os.environ["PATH"],
            "HOME": str(self.home),
            "ANTHROPIC_BASE_URL": model.base_url,
            "ANTHROPIC_API_KEY": "sk-ant-fake",
            "GREENLIGHT_KEY": self.token,
            **OFFLINE,
            **env,
        }
        argv = ["-p", "do it", "--mcp-config", str(config), "--permission-prompt-tool"]
        process = await asyncio.create_subprocess_exec(
            CLAUDE,
            *argv,
            PROMPT_TOOL,
            "--output-format",
            "json",
            *args,
            cwd=work,
            env=environment,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self.runs.append(Run(process, work, model))
        return self.runs[-1]


@pytest.fixture
async def claude(service: Service, team: str, tmp_path: Path) -> AsyncIterator[ClaudeCode]:
    if not os.access(str(CLAUDE), os.X_OK):
        pytest.fail(f"CLAUDE_CODE_BIN={CLAUDE} is not an executable")
    started = ClaudeCode(service, await new_key(service, team), tmp_path, [])
    yield started
    for run in started.runs:  # what this test started, and only that
        if run.process.returncode is None:
            run.process.kill()
            await run.process.wait()
        await run.model.__aexit__(None, None, None)


async def test_an_approved_prompt_runs_the_tool(
    claude: ClaudeCode, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    run = await claude.start(calls_once("Bash", WRITE))
    card = await card_for(fake_slack)
    shown = json.dumps(card.args["blocks"])
    assert "prompt.Bash" in shown and "echo hi &gt; greenlight.txt" in shown
    assert "through key `ci`" in shown and "MCP client `claude-code " in shown
    assert not (run.work / "greenlight.txt").exists()  # nothing runs before a decision
    await client.click(team, BOSS, "approve", card)
    result = await run.finished()
    assert (run.work / "greenlight.txt").read_text() == "hi\n"
    [given] = run.results()
    assert not given.get("is_error") and result["permission_denials"] == []


async def test_a_denied_prompt_runs_nothing_and_the_model_hears_why(
    claude: ClaudeCode, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    run = await claude.start(calls_once("Bash", WRITE))
    card = await card_for(fake_slack)
    await client.click(team, BOSS, "deny", card)
    (opened,) = await fake_slack.wait_for("views.open")
    reason = {"reason": {"reason": {"type": "plain_text_input", "value": "not on a Friday"}}}
    await client.submit(team, BOSS, opened.args["view"], reason)
    result = await run.finished()
    assert not (run.work / "greenlight.txt").exists()
    [given] = run.results()
    told = anthropic.result_text(given)
    assert given["is_error"] and f"denied by {BOSS}: not on a Friday" in told, told
    assert [d["tool_name"] for d in result["permission_denials"]] == ["Bash"]


async def test_edit_and_approve_runs_the_edited_command(
    claude: ClaudeCode, client: SlackClient, fake_slack: FakeSlack, team: str
) -> None:
    run = await claude.start(calls_once("Bash", WRITE))
    card = await card_for(fake_slack)
    opened = await open_edit(client, fake_slack, team, card)
    edited = "echo edited > greenlight.txt"
    command = {"command": {"value": {"type": "plain_text_input", "value": edited}}}
    assert await client.submit(team, BOSS, opened.args["view"], command) == (200, "")
    await run.finished()
    assert (run.work / "greenlight.txt").read_text() == "edited\n"


async def test_when_claude_code_stops_waiting_nothing_runs(
    claude: ClaudeCode, fake_slack: FakeSlack
) -> None:
    """MCP_TOOL_TIMEOUT (ms): how long Claude Code waits for any MCP call, this one too."""
    run = await claude.start(calls_once("Bash", WRITE), MCP_TOOL_TIMEOUT="3000")
    await card_for(fake_slack)
    await fake_slack.wait_for(
        "chat.update", predicate=lambda c: "caller went away" in json.dumps(c.args)
    )
    await run.finished()
    assert not (run.work / "greenlight.txt").exists()
    [given] = run.results()
    assert given["is_error"] and "timed out" in anthropic.result_text(given)


async def test_a_wrong_key_stops_claude_code_and_nothing_runs(
    claude: ClaudeCode, fake_slack: FakeSlack
) -> None:
    run = await claude.start(calls_once("Bash", WRITE), GREENLIGHT_KEY="glk_" + "x" * 30)
    status, _, err = await run.exited()
    assert status == 1 and f"MCP tool {PROMPT_TOOL} (passed via" in err, err
    assert not (run.work / "greenlight.txt").exists()
    assert fake_slack.calls_to("chat.postMessage") == []


async def test_a_greenlight_tool_is_asked_for_once_with_allowed_tools(
    claude: ClaudeCode, client: SlackClient, fake_slack: FakeSlack, team: str, ledger: Path
) -> None:
    """Without `--allowedTools mcp__greenlight`, Claude Code would first ask the permission
    prompt for `mcp__greenlight__transferMoney`, then Greenlight its own card: two cards."""
    args = {"amount": 5, "toAccount": "X9"}
    run = await claude.start(
        calls_once("mcp__greenlight__transferMoney", args), "--allowedTools", "mcp__greenlight"
    )
    card = await card_for(fake_slack)
    assert "Approval needed: transferMoney" in json.dumps(card.args["blocks"])
    await client.click(team, BOSS, "approve", card)
    await run.finished()
    [ran] = ledger_tools.entries()
    assert ran["tool"] == "transferMoney" and ran["amount"] == 5
    [given] = run.results()
    assert f"txn-{ran['key']}" in anthropic.result_text(given)
    posted = fake_slack.calls_to("chat.postMessage")
    assert len([c for c in posted if in_channel(APPROVERS)(c)]) == 1  # one card, not two
