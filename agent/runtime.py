"""Builds the Genkit instance and the agent: model, system prompt, tools, approval middleware."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dotpromptz.typing import DataArgument
from genkit import Tool
from genkit.exp import Agent, Genkit, SessionStore
from genkit.middleware import BaseMiddleware

from agent.models import Credentials, Resilience, plugins
from agent.prompt_edits import is_prompt, prompt_form
from agent.questions import (
    ASK_HUMAN,
    ASK_HUMAN_PROMPT,
    answer_form,
    define_ask_human,
    is_interrupt,
)

if TYPE_CHECKING:
    from aiohttp import ClientSession

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful operations assistant working inside Slack. Use the tools you have to "
    "do what the employee asks. Some tools need a human's approval: when a tool result says "
    "it was denied, withdrawn, expired or has an unknown outcome, tell the employee plainly "
    "and do not retry it on your own."
)

# Genkit renders the system prompt at every model call with dotprompt's
# `DataArgument[dict[str, Any]]`. Pydantic keeps a parametrized model only while something
# references it, so after a garbage collection each call built the class again (about 3 ms
# of CPU). Referenced here, it is built once.
RENDER_DATA = DataArgument[dict[str, Any]]


class ToolModuleError(ValueError):
    """AGENT_TOOLS names a module that cannot be loaded or has no `register(ai)`."""


@dataclass(frozen=True)
class AgentConfig:
    model: str = "googleai/gemini-flash-latest"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    tool_modules: tuple[str, ...] = ("agent.example_tools",)
    ask_human: bool = True  # AGENT_ASK_HUMAN: the agent may ask a person (agent/questions.py)
    # The providers' keys and addresses (agent/models.py).
    credentials: Credentials = field(default_factory=Credentials)
    # Retry and Fallback around each model call (agent/models.py).
    resilience: Resilience = field(default_factory=Resilience)
    # The aiohttp session Google AI's calls go through (agent/gemini.py `model_session`),
    # owned by whoever made it; None: google-genai's own.
    model_http: ClientSession | None = None


# A tool's preview: from the call's input, a short text for the approver ("Balance after
# transfer: 750.00"). A tool module offers them with `previews() -> {tool name: preview}`.
Preview = Callable[[dict[str, Any]], Awaitable[str]]


@dataclass
class AgentRuntime:
    ai: Genkit
    agent: Agent[Any]
    sessions: SessionStore[Any]  # the agent's, to show an approver the conversation
    tools: dict[str, Tool] = field(default_factory=dict)
    questions: frozenset[str] = frozenset()  # the interrupts: tools that ask a person
    # Tools a mounted middleware contributes to each call (the file tools): name, description.
    mounted: Mapping[str, str] = field(default_factory=dict)
    # The list the agent reads its tools from at every turn (Genkit keeps the one given to
    # define_agent): a tool added to it later is offered from the next turn on.
    offered: list[Tool] = field(default_factory=list)
    # A line for the approvers about where a tool comes from (an MCP server's hints).
    notes: dict[str, str] = field(default_factory=dict)
    # Each tool's preview (the middleware's own map): an edited call gets one too.
    previews: Mapping[str, Preview] = field(default_factory=dict)

    def describe(self, tool: str) -> str:
        """The tool's description, for the people deciding on its calls."""
        found = self.tools.get(tool)
        return found.description or "" if found is not None else self.mounted.get(tool, "")

    def note(self, tool: str) -> str:
        """Where the tool comes from and what its server says it does (MCP tools), or ""."""
        return self.notes.get(tool, "")

    def asks(self, tool: str) -> bool:
        """Whether `tool` only asks a person (agent/questions.py)."""
        return tool in self.questions

    def question_form(self, tool: str) -> dict[str, Any] | None:
        """The JSON schema an answer to `tool`'s question must fit; None: free text."""
        return answer_form(self.tools.get(tool))

    def edit_form(self, tool: str, given: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The JSON schema of `tool`'s input, for an approver's changes; None: no schema. A
        permission prompt's (`prompt.<tool>`) is made from its input, `given`."""
        if is_prompt(tool):
            return prompt_form(given)
        found = self.tools.get(tool)
        schema = found.input_schema if found is not None else None
        return schema if isinstance(schema, dict) and schema.get("properties") else None

    def add_tool(self, tool: Tool, *, note: str) -> None:
        """Offer a tool registered after the agent was defined (an MCP server's)."""
        self.tools[tool.name] = tool
        self.notes[tool.name] = note
        self.offered.append(tool)

    def known(self) -> list[str]:
        """Every tool's name, the mounted ones' too: what policies may name."""
        return [*self.tools, *self.mounted]


@dataclass
class Loaded:
    tools: list[Tool] = field(default_factory=list)
    previews: dict[str, Preview] = field(default_factory=dict)
    interrupts: set[str] = field(default_factory=set)  # made with define_interrupt


def load_tools(ai: Genkit, modules: Sequence[str]) -> Loaded:
    """Import each module of AGENT_TOOLS, let it register its tools on `ai`, and take the
    previews it offers (an optional `previews()`). Its interrupts are questions."""
    loaded = Loaded()
    _register(ai, modules, loaded)
    loaded.interrupts.update(t.name for t in loaded.tools if is_interrupt(t))
    return _checked(loaded)


def _register(ai: Genkit, modules: Sequence[str], loaded: Loaded) -> None:
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ToolModuleError(f"AGENT_TOOLS: cannot import {name!r} ({exc})") from None
        register = getattr(module, "register", None)
        if not callable(register):
            raise ToolModuleError(f"AGENT_TOOLS: module {name!r} has no register(ai) function")
        loaded.tools.extend(register(ai))
        offered = getattr(module, "previews", None)
        if offered is not None:
            loaded.previews.update(offered() if callable(offered) else {})


def _checked(loaded: Loaded) -> Loaded:
    names = [t.name for t in loaded.tools]
    if len(set(names)) != len(names):
        raise ToolModuleError(f"AGENT_TOOLS: two tools share a name among {sorted(names)}")
    if stray := set(loaded.previews) - set(names):
        raise ToolModuleError(f"AGENT_TOOLS: previews for tools that do not exist: {sorted(stray)}")
    for tool, preview in loaded.previews.items():
        if not inspect.iscoroutinefunction(preview):
            raise ToolModuleError(f"AGENT_TOOLS: the preview of {tool} is not an async function")
    return loaded


def build_runtime(
    config: AgentConfig,
    *,
    store: SessionStore[Any],
    middleware: type[BaseMiddleware[Any]],
    previews: dict[str, Preview],
    questions: set[str],
    setup: Callable[[Genkit], None] | None = None,
    mounted: Sequence[BaseMiddleware[Any]] = (),
    mounted_tools: Mapping[str, str] | None = None,
) -> AgentRuntime:
    """Wire the agent. `previews` and `questions` (the middleware's, built before the tools
    are loaded) are filled with the tools' previews and the names of the tools that ask a
    person (agent/questions.py). `setup` may register extra models (tests, the demo).
    `mounted`: middleware that contribute tools (`mounted_tools`), inside the approval
    middleware so that their tools pass its gate. Retry and Fallback sit inside the approval
    middleware too: its model hook (refs stamped, the wait given up) sees the answer that
    finally came, from whichever model."""
    models = [config.model, *config.resilience.fallbacks]
    ai = Genkit(plugins=plugins(models, config.credentials, config.model_http))
    if setup is not None:
        setup(ai)
    loaded = load_tools(ai, config.tool_modules)
    system = config.system_prompt
    if config.ask_human:
        if any(t.name == ASK_HUMAN for t in loaded.tools):
            raise ToolModuleError(f"AGENT_TOOLS: {ASK_HUMAN} is built in (AGENT_ASK_HUMAN)")
        loaded.tools.append(define_ask_human(ai))
        loaded.interrupts.add(ASK_HUMAN)
        system += ASK_HUMAN_PROMPT
    use = [middleware(), *config.resilience.middleware(), *mounted]
    # Genkit registers each middleware class it does not know on every model call (in the
    # call's own registry), deriving its config's JSON schema each time: known, it does not.
    for cls in dict.fromkeys(type(m) for m in use):
        ai.define_middleware(cls, name=f"greenlight.{cls.__name__}")
    agent = ai.define_agent(
        name="greenlight",
        model=config.model,
        system=system,
        tools=loaded.tools,
        use=use,
        store=store,
    )
    if clash := sorted(set(tools := {t.name: t for t in loaded.tools}) & set(mounted_tools or {})):
        raise ToolModuleError(f"AGENT_TOOLS: {clash} are also file tools (AGENT_FILES_ROOT)")
    previews.update(loaded.previews)
    questions.update(loaded.interrupts)
    return AgentRuntime(
        ai=ai,
        agent=agent,
        sessions=store,
        tools=tools,
        questions=frozenset(loaded.interrupts),
        mounted=dict(mounted_tools or {}),
        offered=loaded.tools,
        previews=previews,
    )
