"""`greenlight policy check|test`: a POLICY_FILE checked and tested offline, in a policy
repository's CI.

`greenlight policy check FILE` checks it as the bot checks it at start; `greenlight policy
test FILE CASES` tests it against a cases file; neither needs a database, Slack or a model.

The agent's tools come from AGENT_TOOLS (their schemas check each case's input), the file
tools from AGENT_FILES_ROOT / AGENT_ARTIFACTS and MCP servers' tools by name only.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from genkit import Action

from agent import policy_file as policy_files
from agent.files import FileTools
from agent.policy import Policy, policy_defaults
from agent.policy_cases import CasesError, file_policy, load_cases, run
from agent.policy_file import PolicyFile
from agent.runtime import ToolModuleError
from bot.settings import ConfigError, Settings, load_settings

USAGE = "usage: greenlight policy check FILE | greenlight policy test FILE CASES"


def main(args: list[str]) -> int:
    """0: the file is sound (and every case passed); 1: it is not (or a case failed);
    2: the command was given wrongly."""
    if args[:1] == ["check"] and len(args) == 2:
        return _check(Path(args[1]))
    if args[:1] == ["test"] and len(args) == 3:
        return _test(Path(args[1]), Path(args[2]))
    print(USAGE, file=sys.stderr)
    return 2


def _check(path: Path) -> int:
    checked = _checked(path)
    if checked is None:
        return 1
    _, file, tools = checked
    rules = sum(len(spec.rules) for spec in file.tools.values())
    print(f"{path}: OK ({len(file.tools)} tools configured, {rules} rules; {len(tools)} tools)")
    return 0


def _test(path: Path, cases_path: Path) -> int:
    try:
        cases = load_cases(cases_path)
    except CasesError as exc:
        print(exc, file=sys.stderr)
        return 2
    checked = _checked(path)
    if checked is None:
        return 1
    settings, file, tools = checked
    defaults = policy_defaults(
        file,
        channel=settings.APPROVER_CHANNEL,
        timeout=timedelta(seconds=settings.APPROVAL_TIMEOUT_SECONDS),
    )
    defaults = replace(defaults, allowed=defaults.allowed | _files(settings).reads())
    policies: dict[str, Policy] = {t: file_policy(t, file, defaults) for t in tools}
    lines, failed = run(cases, policies, tools)
    print("\n".join(lines))
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _checked(path: Path) -> tuple[Settings, PolicyFile, dict[str, Action | None]] | None:
    """The settings, the file and every tool the agent would have (with its action where
    its schema is known), or None once every problem is printed."""
    try:
        settings = load_settings(serving=False)
        file = policy_files.load(path)
        tools = _tools(settings, file)
        policy_files.check_tools(path, file, tools, _servers(settings, file))
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return None
    except policy_files.PolicyFileError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return None
    except ToolModuleError as exc:
        print(exc, file=sys.stderr)
        return None
    return settings, file, tools


def _files(settings: Settings) -> FileTools:
    return FileTools(root=settings.AGENT_FILES_ROOT, artifacts=settings.AGENT_ARTIFACTS)


def _servers(settings: Settings, file: PolicyFile) -> set[str]:
    return {*settings.MCP_SERVERS, *file.mcp_servers}


def _tools(settings: Settings, file: PolicyFile) -> dict[str, Action | None]:
    """AGENT_TOOLS loaded on a Genkit of no plugin (nothing is called), the built-in askHuman,
    the file tools, and the MCP tools the file names (by name: their servers are not asked)."""
    from genkit.exp import Genkit

    from agent.questions import ASK_HUMAN, define_ask_human
    from agent.runtime import load_tools

    ai = Genkit()
    loaded = load_tools(ai, settings.AGENT_TOOLS)
    tools: dict[str, Action | None] = {t.name: t.action() for t in loaded.tools}
    if settings.AGENT_ASK_HUMAN:
        tools[ASK_HUMAN] = define_ask_human(ai).action()
    tools |= dict.fromkeys(_files(settings).tools())
    servers = _servers(settings, file)
    named = [*file.allow, *file.tools]
    tools |= dict.fromkeys(t for t in named if t not in tools and t.split(".")[0] in servers)
    return tools
