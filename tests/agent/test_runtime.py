"""Loading AGENT_TOOLS: tools and the previews a module offers for them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from genkit.exp import Genkit

from agent.runtime import ToolModuleError, load_tools

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
