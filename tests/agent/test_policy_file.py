"""POLICY_FILE: the shape it must have, and where it says what is wrong."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from agent.policy import POLICY_FILE_ACTOR, Policy, from_file
from agent.policy_file import PolicyFileError, check_tools, load, tool_timeouts
from storage.policy_spec import Rule, StoredPolicy

GOOD = """\
defaults:
  timeout: 24h
allow: [getBalance]
tools:
  transferMoney:
    channel: C0FINANCE
    approvers: [U012ABC, S0TREASURY]
    timeout: 4h
    tool_timeout: 30m
    rules:
      - when: "args.amount <= 100"
        allow: true
      - when: "args.amount > 10000"
        channel: C0LEADS
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yml"
    path.write_text(text)
    return path


def test_a_good_file(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    policy = load(path)
    check_tools(path, policy, ["transferMoney", "getBalance", "exportData"])
    spec = policy.tools["transferMoney"]
    assert (spec.timeout, policy.defaults.timeout) == (timedelta(hours=4), timedelta(hours=24))
    assert tool_timeouts(policy) == {"transferMoney": timedelta(minutes=30)}  # to run, approved
    stored = from_file("transferMoney", policy)
    assert stored is not None and not hasattr(stored, "tool_timeout")  # read at start
    assert stored.approvers == ("U012ABC", "S0TREASURY") and not stored.allowed
    assert stored.rules[0] == Rule(when="args.amount <= 100", allow=True)
    allowed = from_file("getBalance", policy)
    assert allowed == StoredPolicy(tool="getBalance", allowed=True)
    assert allowed.model_fields_set == {"tool", "allowed"}  # the file sets nothing else
    assert from_file("exportData", policy) is None  # not named: left as it is
    assert POLICY_FILE_ACTOR == "policy-file"


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (
            "tools:\n  transferMoney:\n    colour: red\n",
            3,
            "colour: Extra inputs are not permitted",
        ),
        ("tools:\n  transferMoney:\n    timeout: 4 hours\n", 3, "is not a duration"),
        ("tools:\n  transferMoney:\n    tool_timeout: soon\n", 3, "is not a duration"),
        ("tools:\n  transferMoney:\n    channel: '#finance'\n", 3, "is not a channel ID"),
        ("tools:\n  transferMoney:\n    approvers: [alice]\n", 3, "not user (U…) or user group"),
        (
            "tools:\n  transferMoney:\n    rules:\n      - when: 'args.amount <='\n",
            4,
            "the rule's `when` does not compile",
        ),
        ("allow: [getBalance\n", 2, "not valid YAML"),
        (
            "tools:\n  transferMoney:\n    approvals: 2\n  getBalance: {}\n"
            "  transferMoney:\n    approvals: 1\n",
            5,
            "'transferMoney' is given twice",
        ),
        ("tools:\n  transferMoney:\n    approvals: 2\n    approvals: 1\n", 4, "given twice"),
        ("defaults:\n  approvals: 0\n", 2, "greater than or equal to 1"),
        ("tools:\n  transferMoney:\n    standing: 25h\n", 3, "lasts at most 24h"),
        ("tools:\n  transferMoney:\n    standing: 0s\n", 3, "lasts at most 24h"),
        ("tools:\n  transferMoney:\n    note: maybe\n", 3, "tools.transferMoney.note:"),
        (
            "tools:\n  transferMoney:\n    approvals: 2\n    standing: 1h\n",
            4,
            "standing: a standing approval needs a tool one approver decides; this one needs 2",
        ),
        (
            "defaults:\n  approvals: 3\ntools:\n  transferMoney:\n    standing: 1h\n",
            5,
            "this one needs 3",
        ),
        (
            "tools:\n  transferMoney:\n    standing: 1h\n    note: required\n",
            3,
            "a standing approval takes no note",
        ),
    ],
)
def test_a_bad_file_names_the_line_and_the_problem(
    tmp_path: Path, text: str, line: int, problem: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PolicyFileError) as bad:
        load(path)
    assert str(bad.value).startswith(f"{path}, line {line}: "), bad.value
    assert problem in str(bad.value)


def test_a_tool_the_agent_does_not_have_is_refused_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "allow: [getBalance]\ntools:\n  launchRockets:\n    timeout: 1h\n")
    with pytest.raises(PolicyFileError, match=r"line 3: tools: no tool 'launchRockets'"):
        check_tools(path, load(path), ["transferMoney", "getBalance"])
    path = write(tmp_path, "allow:\n  - getBalance\n  - nope\n")
    with pytest.raises(PolicyFileError, match=r"line 3: allow: no tool 'nope'"):
        check_tools(path, load(path), ["getBalance"])


POLICY = Policy(
    tool="transferMoney",
    allowed=False,
    channel="C0FIN",
    rules=(
        Rule(when="args.amount <= 100", allow=True),
        Rule(when="args.amount > 10000", approvers=("UCFO",), timeout=timedelta(hours=1)),
        Rule(when="args.amount * 2 > 1"),  # float * int: a CEL type error for 500.5
    ),
)


def test_the_first_rule_a_call_matches_decides_its_policy() -> None:
    small = POLICY.for_call({"amount": 50}, "UASK")
    assert small.allowed and small.note == "rule 1 matched: `args.amount <= 100`"
    big = POLICY.for_call({"amount": 20000}, "UASK")
    assert not big.allowed and big.approver_users == ("UCFO",) and big.timeout.seconds == 3600
    assert big.rules == () and "rule 2 matched" in big.why


def test_a_rule_that_cannot_be_evaluated_means_approval_and_says_which() -> None:
    odd = POLICY.for_call({"amount": 500.5}, "UASK")
    assert not odd.allowed and odd.approver_users == ()
    assert odd.note is not None and odd.note.startswith("rule 3 (`args.amount * 2 > 1`)")
    assert "could not be evaluated" in odd.why
    missing = POLICY.for_call({"to": "x"}, "UASK")
    assert not missing.allowed and "rule 1" in (missing.note or "")
    strange = replace(POLICY, rules=(Rule(when="args.toAccount"),))
    not_bool = strange.for_call({"amount": 500, "toAccount": "1"}, "UASK")
    assert not not_bool.allowed and "not true or false" in (not_bool.note or "")


def test_an_allowed_tool_skips_its_rules() -> None:
    allowed = replace(POLICY, allowed=True).for_call({"amount": 500.5}, "UASK")
    assert allowed.allowed and allowed.note is None


def test_the_docs_example_is_a_policy_file_that_loads_and_holds_injected_values(
    tmp_path: Path,
) -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()
    match = re.search(r"```yaml\n(# policy\.yml.*?)```", readme, re.S)
    assert match is not None
    path = write(tmp_path, match.group(1))
    policy = load(path)
    check_tools(path, policy, ["transferMoney", "getBalance", "exportData"])
    stored = from_file("transferMoney", policy)
    assert stored is not None
    transfer = Policy("transferMoney", allowed=False, channel=None, rules=stored.rules)
    small = {"amount": 50, "toAccount": "12345"}
    assert transfer.for_call(small, "U1", {"amount": "human", "toAccount": "human"}).allowed
    injected = transfer.for_call(small, "U1", {"amount": "human", "toAccount": "tool"})
    assert not injected.allowed and injected.approvals == 2


def test_a_rule_that_cannot_be_evaluated_gives_the_strictest_rules_outcome() -> None:
    strict = replace(
        POLICY,
        rules=(
            Rule(when="args.amount <= 100", allow=True),
            Rule(when="args.amount >= 100000", approvals=3, channel="C0LEADS", approvers=("UCFO",)),
        ),
    )
    failed = strict.for_call({"amount": "250000"}, "UASK")  # a string: no `<=` with an int
    assert not failed.allowed and failed.approvals == 3 and failed.channel == "C0LEADS"
    assert failed.approver_users == ("UCFO",)
    assert failed.note is not None and failed.note.startswith("rule 1 (`args.amount <= 100`)")
    assert "the strictest rule applies (rule 2: 3 approvals)" in failed.note
