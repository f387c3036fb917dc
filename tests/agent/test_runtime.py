"""Building the runtime: AGENT_TOOLS' tools and the previews a module offers for them, and what
Genkit would otherwise build again at every model call."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest
from dotpromptz.typing import DataArgument
from genkit._ai._generate import register_middleware  # private: what a model call runs
from genkit.exp import Genkit, InMemorySessionStore
from genkit.middleware import BaseMiddleware

from agent.models import Resilience
from agent.runtime import (
    RENDER_DATA,
    AgentConfig,
    ToolModuleError,
    build_runtime,
    load_tools,
)
from tests.fakes.scripted_model import ScriptedModel

TOOL = """
from genkit import Genkit
from pydantic import BaseModel


class In(BaseModel):
    n: int


def register(ai: Genkit):
    @ai.tool(name="{name}", description="d")
    async def tool(input: In) -> int:
        return input.n

    return [tool]
"""


def module(tmp_path: Path, name: str, tool: str, previews: str) -> str:
    (tmp_path / f"{name}.py").write_text(TOOL.replace("{name}", tool) + previews)
    return name


@pytest.fixture(autouse=True)
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_modules_previews_are_loaded_with_its_tools(tmp_path: Path) -> None:
    offered = "\nasync def show(input):\n    return 'x'\n\n"
    offered += "def previews():\n    return {'double': show}\n"
    name = module(tmp_path, "mod_ok", "double", offered)
    loaded = load_tools(Genkit(), [name])
    assert [t.name for t in loaded.tools] == ["double"] and set(loaded.previews) == {"double"}
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("previews", "message"),
    [
        ("def previews():\n    return {'nope': show}\n", "previews for tools that do not exist"),
        ("def previews():\n    return {'triple': plain}\n", "is not an async function"),
    ],
)
def test_a_preview_that_cannot_be_used_stops_the_start(
    tmp_path: Path, previews: str, message: str
) -> None:
    helpers = "\nasync def show(input):\n    return 'x'\n\ndef plain(input):\n    return 'x'\n\n"
    name = module(tmp_path, f"mod_bad_{abs(hash(previews))}", "triple", helpers + previews)
    with pytest.raises(ToolModuleError, match=message):
        load_tools(Genkit(), [name])
    sys.modules.pop(name, None)


def test_interrupts_a_module_defines_are_known_as_questions(tmp_path: Path) -> None:
    name = module(tmp_path, "mod_asks", "plain", "")
    (tmp_path / "mod_asks2.py").write_text(
        "def register(ai):\n    return [ai.define_interrupt('confirm', description='c')]\n"
    )
    ai = Genkit()
    loaded = load_tools(ai, [name, "mod_asks2"])
    assert [t.name for t in loaded.tools] == ["plain", "confirm"]
    assert loaded.interrupts == {"confirm"}
    assert "define_interrupt" not in vars(ai)  # the instance is as it was
    sys.modules.pop(name, None)
    sys.modules.pop("mod_asks2", None)
    # The registry's define_interrupt too (the one that takes request_metadata); a tool
    # that raises Interrupt only when it runs is no interrupt until it does.
    odd = load_tools(Genkit(), ["tests.odd_tools"])
    assert odd.interrupts == {"confirmRefund"}


@pytest.mark.parametrize("ask_human", [True, False])
def test_ask_human_is_built_in_unless_turned_off(ask_human: bool) -> None:
    questions: set[str] = set()
    runtime = build_runtime(
        AgentConfig(model="scripted", tool_modules=(), ask_human=ask_human),
        store=InMemorySessionStore(),
        middleware=BaseMiddleware,
        previews={},
        questions=questions,
        setup=ScriptedModel().register,
    )
    assert ("askHuman" in runtime.tools) is ask_human
    assert questions == runtime.questions == ({"askHuman"} if ask_human else set())


def test_the_agents_middleware_is_registered_once_not_per_model_call() -> None:
    """Genkit registers a middleware class it does not know in each model call's registry,
    deriving its config's JSON schema every time; the agent's are registered at start."""
    runtime = build_runtime(
        AgentConfig(model="scripted", tool_modules=()),
        store=InMemorySessionStore(),
        middleware=BaseMiddleware,
        previews={},
        questions=set(),
        setup=ScriptedModel().register,
    )
    call = runtime.ai.registry.new_child()  # as each model call's is
    refs = register_middleware(call, [BaseMiddleware(), *Resilience().middleware()])
    assert refs is not None and [r.name for r in refs] == [
        "greenlight.BaseMiddleware",
        "greenlight.Retry",
    ]
    assert (
        call.list_values("middleware").keys()
        == runtime.ai.registry.list_values("middleware").keys()
    )  # nothing new in the call's own


def test_the_class_genkit_renders_the_system_prompt_with_is_built_once() -> None:
    """Genkit asks for `DataArgument[dict[str, Any]]` at every model call; it is the one kept
    alive here, however many garbage collections ran since."""
    gc.collect()
    assert DataArgument[dict[str, Any]] is RENDER_DATA
