"""Policy as code you can test: `greenlight policy check|test` as a team's CI runs them, and
`/approvals explain` through the running service."""

from __future__ import annotations

import io
import json
import os
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from bot import policy_cli
from bot.server import Service
from tests.bot.conftest import SlackClient
from tests.bot.test_cli import ROOT, run_bot
from tests.fakes.slack_api import FakeSlack

EXAMPLES = ROOT / "docs" / "examples"
ENV = {"APPROVER_CHANNEL": "C0APPROVERS"}


def policy_command(*args: str) -> subprocess.CompletedProcess[str]:
    """`greenlight policy ARGS` run in this process (`bot.policy_cli.main`, what `python -m bot
    policy` calls; the docs example's test and the usage test run that whole, in a process
    of its own), with what that process would have had: ENV, none of this one's Slack or
    model settings. Each process costs about 2.5 s of CPU, most of it importing Genkit."""
    out, err = io.StringIO(), io.StringIO()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GEMINI_"))}
    with (
        mock.patch.dict(os.environ, clean | ENV, clear=True),
        redirect_stdout(out),
        redirect_stderr(err),
    ):
        code = policy_cli.main(list(args))
    return subprocess.CompletedProcess(
        ["greenlight", "policy", *args], code, out.getvalue(), err.getvalue()
    )


def test_the_docs_example_cases_pass_against_the_docs_example_policy() -> None:
    result = run_bot(
        "policy", "test", str(EXAMPLES / "policy.yml"), str(EXAMPLES / "policy-cases.yml"), env=ENV
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "5 passed, 0 failed"
    assert all(line.startswith("PASS ") for line in lines[:-1]) and len(lines) == 6


def test_a_failing_case_says_what_was_expected_and_what_came_and_exits_1(tmp_path: Path) -> None:
    cases = tmp_path / "cases.yml"
    cases.write_text(
        """cases:
  - name: medium transfers run
    call: {tool: transferMoney, input: {amount: 500, toAccount: ACC-1}}
    expect: {allowed: true}
  - name: large transfers need three
    call: {tool: transferMoney, input: {amount: 250000, toAccount: ACC-1}}
    expect: {approvals: 3, rule: large transfers need two}
  - name: a string amount is coerced by the tool's schema, as the bot does
    call: {tool: transferMoney, input: {amount: "250000", toAccount: ACC-1}}
    expect: {approvals: 2}
  - name: an unknown tool
    call: {tool: transferMoneyy, input: {}}
    expect: {approvals: 1}
"""
    )
    result = policy_command("test", str(EXAMPLES / "policy.yml"), str(cases))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "FAIL medium transfers run: expected allowed True, got False",
        "FAIL large transfers need three: expected approvals 3, got 2",
        "PASS a string amount is coerced by the tool's schema, as the bot does",
        "FAIL an unknown tool: expected approvals 1, got an error: no tool 'transferMoneyy'; "
        "the agent's tools are askHuman, exportData, getBalance, transferMoney",
        "1 passed, 3 failed",
    ]


def test_a_rule_that_cannot_be_evaluated_is_an_error_a_case_can_expect(tmp_path: Path) -> None:
    policy, cases = tmp_path / "policy.yml", tmp_path / "cases.yml"
    policy.write_text(
        "tools:\n  transferMoney:\n    rules:\n"
        "      - {name: memo, when: 'args.memo == \"x\"', allow: true}\n"
    )
    cases.write_text(
        "cases:\n  - name: no memo field\n"
        "    call: {tool: transferMoney, input: {amount: 5, toAccount: A}}\n"
        "    expect: {error: could not be evaluated, allowed: false}\n"
    )
    result = policy_command("test", str(policy), str(cases))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "1 passed, 0 failed"


@pytest.mark.parametrize(
    ("cases", "problem"),
    [
        ("cases: []\n", "cases"),
        ("cases:\n  - name: x\n    call: {tool: t}\n    expect: {aprovals: 2}\n", "aprovals"),
        ("cases: [", "not valid YAML"),
    ],
)
def test_a_malformed_cases_file_is_exit_2_naming_the_problem(
    tmp_path: Path, cases: str, problem: str
) -> None:
    path = tmp_path / "cases.yml"
    path.write_text(cases)
    result = policy_command("test", str(EXAMPLES / "policy.yml"), str(path))
    assert result.returncode == 2 and problem in result.stderr
    assert "Traceback" not in result.stderr


def test_check_names_every_problem_with_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.yml"
    path.write_text(
        "allow: [getBalance, nope]\ntools:\n  transferMoney:\n    timeout: soon\n    approvals: 0\n"
    )
    result = policy_command("check", str(path))
    assert result.returncode == 1
    problems = sorted(result.stderr.splitlines())
    assert problems[0].startswith(f"{path}, line 4: tools.transferMoney.timeout:")
    assert problems[1].startswith(f"{path}, line 5: tools.transferMoney.approvals:")
    assert len(problems) == 2
    path.write_text("allow: [getBalance, nope]\ntools:\n  transferMoneyy: {}\n")
    result = policy_command("check", str(path))
    assert result.returncode == 1
    assert [p.split(":")[0] for p in result.stderr.splitlines()] == [
        f"{path}, line 1",
        f"{path}, line 3",
    ]
    ok = policy_command("check", str(EXAMPLES / "policy.yml"))
    assert ok.returncode == 0 and "OK" in ok.stdout, ok.stderr


def test_check_refuses_a_standing_approval_too_long_or_with_a_quorum(tmp_path: Path) -> None:
    path = tmp_path / "policy.yml"
    path.write_text("tools:\n  transferMoney:\n    standing: 2d\n")
    result = policy_command("check", str(path))
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"{path}, line 3: tools.transferMoney.standing: '2d': a standing approval lasts at most"
    )
    path.write_text("tools:\n  getBalance:\n    approvals: 2\n    standing: 1h\n")
    result = policy_command("check", str(path))
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"{path}, line 4: tools.getBalance.standing: a standing approval needs a tool one "
        "approver decides; this one needs 2"
    )


def test_redact_is_checked_and_a_case_may_expect_it(tmp_path: Path) -> None:
    """Issue 26: `redact` lists the input's keys nobody is shown; `check` refuses what is no
    key name, and `test` may expect the list (in any order)."""
    path = tmp_path / "policy.yml"
    path.write_text("tools:\n  exportData:\n    redact: [destination, a.b]\n")
    result = policy_command("check", str(path))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{path}, line 3: tools.exportData.redact:"), result.stderr
    assert "'a.b'" in result.stderr
    path.write_text("tools:\n  exportData:\n    redact: [destination, apiToken]\n")
    cases = tmp_path / "cases.yml"
    cases.write_text(
        """cases:
  - name: the destination is hidden
    call: {tool: exportData, input: {dataset: customers, destination: a@example.com}}
    expect: {redact: [apiToken, destination]}
  - name: nothing hidden
    call: {tool: transferMoney, input: {amount: 500, toAccount: ACC-1}}
    expect: {redact: [toAccount]}
"""
    )
    result = policy_command("test", str(path), str(cases))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "PASS the destination is hidden",
        "FAIL nothing hidden: expected redact [toAccount], got []",
        "1 passed, 1 failed",
    ]


def test_policy_without_its_arguments_is_usage_and_exit_2() -> None:
    result = run_bot("policy", "test", "only-one.yml", env=ENV)
    assert result.returncode == 2 and "usage: greenlight policy" in result.stderr


@pytest.fixture
def service_overrides(fake_slack: FakeSlack, team: str) -> dict[str, Any]:
    fake_slack.team_id = team  # auth.test: the workspace the file's policy is written for
    for channel in ("C0FINANCE", "C0LEADS"):  # channels whose members decide are private
        fake_slack.channels[channel] = {"is_private": True}
    return {"POLICY_FILE": EXAMPLES / "policy.yml"}


async def test_explain_shows_anyone_what_the_policy_does_with_a_call(
    client: SlackClient, team: str, service: Service
) -> None:
    big = json.dumps({"amount": 250000, "toAccount": "ACC-1"})
    status, reply = await client.command(team, "UANYONE", f"explain transferMoney {big}")
    assert status == 200
    assert "Needs 2 approvals (rule 3 (large transfers need two) matched" in reply
    assert "The card goes to <#C0FINANCE>; who may decide: the members of <#C0FINANCE>" in reply
    assert "Expires after 4h" in reply and "A reminder after 1h" in reply
    assert "Escalates to <#C0LEADS> after 2h" in reply
    _, ext = await client.command(
        team, "UANYONE", 'explain transferMoney {"amount": 50, "toAccount": "EXT-9"}'
    )
    assert "The card goes to <#C0LEADS>; who may decide: <@U0LEAD>" in ext
    _, small = await client.command(
        team, "UANYONE", 'explain transferMoney {"amount": 5, "toAccount": "ACC-1"}'
    )
    assert "Runs without approval (rule 2 (small transfers run) matched" in small
    _, bad = await client.command(team, "UANYONE", 'explain transferMoney {"amount": "lots"}')
    assert "Never reaches an approver: invalid input" in bad and "amount" in bad


async def test_explain_refuses_what_it_cannot_read_and_escapes_what_it_shows(
    client: SlackClient, team: str, service: Service
) -> None:
    _, nothing = await client.command(team, "UANYONE", "explain")
    assert nothing.startswith("Usage: `/approvals explain <tool> <json input>`")
    _, unknown = await client.command(team, "UANYONE", "explain <!channel> {}")
    assert unknown.startswith("There is no tool `&lt;!channel&gt;`")
    _, broken = await client.command(team, "UANYONE", "explain transferMoney {amount")
    assert broken.startswith("That input is not JSON.")
    _, shown = await client.command(
        team, "UANYONE", 'explain transferMoney {"amount": 5, "toAccount": "<!here>"}'
    )
    assert "&lt;!here&gt;" in shown and "<!here>" not in shown
