"""POLICY_FILE: the tool policy as code, read and checked once at start.

The file is YAML of exactly the shape `PolicyFile` describes (README, "Policies"); a tool's
policy and its rules are storage/policy_spec.py's types, the ones the agent runs. Anything
wrong with it (a key that does not belong, a bad duration, a CEL expression that does not
compile, a tool the agent does not have) is a `PolicyFileError` naming the file, the line
and the problem, so the bot refuses to start rather than run with a policy nobody wrote.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import yaml
from pydantic import Field, ValidationError

from agent.mcp_config import McpServers
from storage.policy_spec import Duration, Quorum, Strict, ToolPolicy

if TYPE_CHECKING:
    import cel

PROMPT_PREFIX = "prompt."  # Claude Code's tools, as the gateway's approval_prompt asks


class ToolSpec(ToolPolicy):
    """POLICY_FILE's `tools.<tool>`: the tool's policy, and how long an approved call may
    run (read at start, not stored)."""

    tool_timeout: Duration | None = None  # to run, once approved (else TOOL_TIMEOUT_SECONDS)


class Defaults(Strict):
    approvals: Quorum | None = None
    timeout: Duration | None = None


class PolicyFile(Strict):
    defaults: Defaults = Field(default_factory=Defaults)
    allow: list[str] = Field(default_factory=list)
    tools: dict[str, ToolSpec] = Field(default_factory=dict)
    mcp_servers: McpServers = Field(default_factory=dict)  # README, "MCP servers"
    # Tools the approvals API's callers name (gateway/): policy may name them too.
    api_tools: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list
    )


@functools.lru_cache(maxsize=1024)
def compiled(expression: str) -> cel.Program:
    """Each rule's expression is compiled once: POLICY_FILE's at start, as they are checked
    (ValueError if one does not compile). The CEL package is imported here, on first use:
    its `__init__` loads a command-line interface besides (~0.4 s of start-up)."""
    import cel

    return cel.compile(expression)


class PolicyFileError(ValueError):
    """What is wrong with the file, where: a `<file>, line <n>: <problem>` line per problem
    (`problems`), so one run of `greenlight policy check` names every one."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def load(path: Path) -> PolicyFile:
    """Read, parse and check the file, compiling every CEL expression once."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise PolicyFileError([f"{path}: cannot be read ({exc.strerror})"]) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else "?"
        raise PolicyFileError([f"{path}, line {line}: not valid YAML ({exc.problem})"]) from None
    if twice := _duplicate_key(root):
        key, line = twice
        raise PolicyFileError(
            [f"{path}, line {line}: {key!r} is given twice (YAML keeps the last)"]
        )
    try:
        policy = PolicyFile.model_validate(data or {})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = _line(root, error["loc"])
            field = ".".join(str(p) for p in error["loc"]) or "the file"
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"{path}, line {where}: {field}: {message}")
        raise PolicyFileError(problems) from None
    problems = _standing_problems(path, root, policy)
    for tool, spec in policy.tools.items():
        for i, rule in enumerate(spec.rules):
            try:
                compiled(rule.when)
            except ValueError as exc:
                where = _line(root, ("tools", tool, "rules", i, "when"))
                problem = str(exc).splitlines()[0]
                problems.append(
                    f"{path}, line {where}: the rule's `when` does not compile: {problem}"
                )
    if problems:
        raise PolicyFileError(problems)
    return policy


def _standing_problems(path: Path, root: yaml.Node | None, policy: PolicyFile) -> list[str]:
    """A standing approval where it cannot be: with a quorum (the tool's `approvals`, or
    the defaults'), or with `note: required` (a note reaches the model: its writer may not
    approve what follows, yet a standing approval would)."""
    problems = []
    for tool, spec in policy.tools.items():
        if spec.standing is None:
            continue
        where = _line(root, ("tools", tool, "standing"))
        quorum = spec.approvals or policy.defaults.approvals or 1
        if quorum > 1:
            problems.append(
                f"{path}, line {where}: tools.{tool}.standing: a standing approval needs a "
                f"tool one approver decides; this one needs {quorum}"
            )
        if spec.note == "required":
            problems.append(
                f"{path}, line {where}: tools.{tool}.standing: a standing approval takes no "
                "note, and this tool's approvals need one (note: required)"
            )
    return problems


def _duplicate_key(node: yaml.Node | None) -> tuple[str, int] | None:
    """The first key a mapping repeats, and its second line: YAML silently keeps the last
    one, so a second `transferMoney:` would quietly replace the first one's policy."""
    if isinstance(node, yaml.MappingNode):
        seen: set[object] = set()
        for key, value in node.value:
            if key.value in seen:
                return str(key.value), key.start_mark.line + 1
            seen.add(key.value)
            if found := _duplicate_key(value):
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            if found := _duplicate_key(item):
                return found
    return None


def tool_timeouts(policy: PolicyFile | None) -> dict[str, timedelta]:
    """Each tool's own `tool_timeout`, where the file sets one."""
    tools = policy.tools if policy else {}
    return {t: spec.tool_timeout for t, spec in tools.items() if spec.tool_timeout is not None}


def member_channels(policy: PolicyFile) -> dict[str, str]:
    """The channels the file makes approver groups (their members decide: the tool, rule or
    escalation names no approvers), each with where the file names it."""
    found: dict[str, str] = {}
    for tool, spec in policy.tools.items():
        if spec.channel and not spec.approvers:
            found.setdefault(spec.channel, f"POLICY_FILE tools.{tool}.channel")
        for i, rule in enumerate(spec.rules):
            if rule.channel and not (rule.approvers or spec.approvers):
                found.setdefault(rule.channel, f"POLICY_FILE tools.{tool}.rules[{i}].channel")
        if spec.escalate_to and not spec.escalate_approvers:
            found.setdefault(spec.escalate_to, f"POLICY_FILE tools.{tool}.escalate_to")
    return found


def check_tools(
    path: Path, policy: PolicyFile, known: Collection[str], servers: Collection[str] = ()
) -> None:
    """Every tool the file names must be one the agent has, or one an MCP server among
    `servers` may offer (`<server>.<tool>`: the server may be down at start)."""
    text = path.read_text()
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    named = [*policy.allow, *policy.tools]
    known = {*known, *(t for t in named if t.split(".")[0] in servers)}
    # The gateway's: the approvals API's tools, and Claude Code's (prompt.<tool>).
    known |= {*policy.api_tools, *(t for t in named if t.startswith(PROMPT_PREFIX))}
    problems = []
    for i, tool in enumerate(policy.allow):
        if tool not in known:
            where = _line(root, ("allow", i))
            problems.append(f"{path}, line {where}: allow: no tool {tool!r}; {_known(known)}")
    for tool in policy.tools:
        if tool not in known:
            where = _line(root, ("tools", tool), key=True)
            problems.append(f"{path}, line {where}: tools: no tool {tool!r}; {_known(known)}")
    if problems:
        raise PolicyFileError(problems)


def _known(known: Collection[str]) -> str:
    return "the agent's tools are " + ", ".join(sorted(known))


def _line(node: yaml.Node | None, loc: Sequence[Any], *, key: bool = False) -> int | str:
    """The line of the YAML node at `loc` (a pydantic error location), or of the deepest
    node on the way there; `key`: the line of the mapping key itself."""
    found = node
    for part in loc:
        if isinstance(found, yaml.MappingNode):
            pair = next((kv for kv in found.value if kv[0].value == str(part)), None)
            if pair is None:
                break
            found = pair[0] if key and part == loc[-1] else pair[1]
        elif isinstance(found, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(found.value):
                break
            found = found.value[part]
        else:
            break
    return found.start_mark.line + 1 if found is not None else "?"
