"""What policy does with one call, said plainly: for `/approvals explain`, and for
`greenlight policy test`, which checks a cases file against POLICY_FILE offline.

The outcome is computed by the very code the approval middleware runs (the tool's own
schema, `Policy.for_call`), so a case that passes here is what the bot will do: only the
admins' live changes (`/approvals allow`…) and provenance are not part of it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from genkit import Action
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.inputs import input_errors
from agent.policy import Policy, PolicyDefaults, effective, from_file
from agent.policy_file import PolicyFile
from storage.policy_spec import Duration

DEFAULT_REQUESTER = "U0REQUESTER"


@dataclass(frozen=True)
class Outcome:
    """What policy does with one call: the fields a case's `expect` may name.

    `error` says why the call never reaches an approver (an unknown tool, input its schema
    refuses: then `evaluated` is False and the rest is moot) or which rule could not be
    evaluated (the call then needs approval as the rest says)."""

    policy: Policy
    evaluated: bool = True
    error: str | None = None

    @property
    def allowed(self) -> bool:
        return self.evaluated and self.policy.allowed

    @property
    def rule(self) -> str | None:
        """The name of the rule that decided the call (None: no rule, or it has no name)."""
        return self.policy.matched.name if self.policy.matched else None

    @property
    def approvers(self) -> tuple[str, ...]:
        return (*self.policy.approver_users, *self.policy.approver_groups)

    @property
    def escalate_approvers(self) -> tuple[str, ...]:
        return (*self.policy.escalate_users, *self.policy.escalate_groups)


def decide(policy: Policy, tool: Action | None, args: Any, requester: str) -> Outcome:
    """What `policy` does with a call of its tool (`tool` None: one known by name only, an
    MCP server's that may be down): the input checked and coerced by the tool's schema
    first, as the approval middleware does, then the rules."""
    if tool is not None and tool.input_type is not None:
        if errors := input_errors(tool, args):
            problems = "; ".join(f"{field}: {message}" for field, message in errors.items())
            return Outcome(policy, evaluated=False, error=f"invalid input ({problems})")
        args = tool.input_type.dump_python(
            tool.input_type.validate_python(args), mode="json", by_alias=True
        )
    call = policy.for_call(args, requester)
    return Outcome(call, error=call.note if call.failed else None)


def unknown(tool: str, known: Collection[str]) -> Outcome:
    """The outcome of a call of a tool the agent does not have."""
    error = f"no tool {tool!r}; the agent's tools are {', '.join(sorted(known))}"
    return Outcome(Policy(tool=tool, allowed=False, channel=None), evaluated=False, error=error)


def file_policy(tool: str, file: PolicyFile, defaults: PolicyDefaults) -> Policy:
    """The policy POLICY_FILE alone gives `tool`, as the bot applies it at start."""
    return effective(tool, from_file(tool, file), defaults)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Call(_Strict):
    tool: str
    input: Any = Field(default_factory=dict)
    requester: str = DEFAULT_REQUESTER


class Expect(_Strict):
    """Only the keys a case names are checked."""

    allowed: bool | None = None
    approvals: int | None = None
    channel: str | None = None
    approvers: list[str] | None = None
    escalate_to: str | None = None
    timeout: Duration | None = None
    rule: str | None = None
    error: str | None = None
    redact: list[str] | None = None  # the fields the card hides


class Case(_Strict):
    name: str
    call: Call
    expect: Expect


class Cases(_Strict):
    cases: list[Case] = Field(min_length=1)


class CasesError(ValueError):
    """The cases file cannot be read or is not of the documented shape."""


def load_cases(path: Path) -> list[Case]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CasesError(f"{path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise CasesError(f"{path}: not valid YAML ({exc})") from None
    try:
        return Cases.model_validate(data or {}).cases
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise CasesError(f"{path}: {where}: {first['msg']}") from None


def mismatches(expect: Expect, got: Outcome) -> list[str]:
    """`expected X, got Y` for each key of `expect` the outcome does not meet."""
    wrong = []
    for key in sorted(expect.model_fields_set):
        wanted = getattr(expect, key)
        if key == "error":
            if got.error is None or str(wanted).lower() not in got.error.lower():
                wrong.append(f"expected an error containing {wanted!r}, got {got.error!r}")
            continue
        if not got.evaluated:
            wrong.append(f"expected {key} {_shown(wanted)}, got an error: {got.error}")
            continue
        actual = _actual(key, got)
        same = set(wanted) == set(actual) if key in ("approvers", "redact") else wanted == actual
        if not same:
            wrong.append(f"expected {key} {_shown(wanted)}, got {_shown(actual)}")
    return wrong


def _actual(key: str, got: Outcome) -> Any:
    if key in ("allowed", "rule", "approvers"):
        return getattr(got, key)
    return getattr(got.policy, key)


def _shown(value: Any) -> str:
    if isinstance(value, timedelta):
        return f"{value.total_seconds() / 3600:g}h"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def run(
    cases: list[Case],
    policy_of: Mapping[str, Policy],
    tools: Mapping[str, Action | None],
) -> tuple[list[str], int]:
    """A `PASS name` or `FAIL name: …` line per case, and how many failed. `tools`: every
    tool the agent has by name, with its action where its schema is known."""
    lines, failed = [], 0
    for case in cases:
        tool = case.call.tool
        if tool not in tools:
            got = unknown(tool, tools)
        else:
            got = decide(policy_of[tool], tools[tool], case.call.input, case.call.requester)
        if wrong := mismatches(case.expect, got):
            failed += 1
            lines.append(f"FAIL {case.name}: " + "; ".join(wrong))
        else:
            lines.append(f"PASS {case.name}")
    return lines, failed
