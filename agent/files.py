"""File tools behind approvals: genkit-middleware's Filesystem (AGENT_FILES_ROOT) and
Artifacts (AGENT_ARTIFACTS).

Their reads run freely until a policy says otherwise; their writes need approval like any
tool (Genkit's interrupts guide warns that mounting them without gating the writes lets the
model change files unseen). Each write's card shows what it will change: a unified diff
against the file as it is, computed by the write's preview, for the path the middleware will
really write (resolved by its rules). A path it would normalise is refused before any card.
"""

from __future__ import annotations

import asyncio
import difflib
import os
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from genkit import Part
from genkit.middleware import BaseMiddleware, GenerateMiddlewareContext, ToolHookParams
from genkit_middleware import Artifacts, Filesystem

from agent.runtime import Preview

READS = {
    "list_files": "List files and directories under a path (optional recursive).",
    "read_file": "Read a text file, optionally from an offset/limit in lines.",
}
WRITES = {
    "write_file": "Create or overwrite a text file with the given content.",
    "edit_file": "Apply search/replace edits to an existing text file.",
}
ARTIFACT_READS = {"read_artifact": "Read a named artifact of the conversation."}
ARTIFACT_WRITES = {"write_artifact": "Create or replace a named artifact of the conversation."}
MAX_COMPARED = 1024 * 1024  # bytes of a file a preview compares; past it, it says so

Check = Callable[[Any], str | None]  # a call's input -> why it is refused, or None


class Files(Filesystem):
    """genkit-middleware's Filesystem with its tools defined once per process, not on every
    model call: defining the four (each one's JSON schemas) costs tens of ms of CPU per
    model call, which made a turn that called none of them 2.6x slower (see Performance).

    Genkit builds a fresh instance per model call, and `read_file` queues the file for that
    call's next request: so the tools, built by the first instance, queue into the instance
    whose `wrap_tool` is running them.
    """

    _defined: ClassVar[dict[str, list[Any]]] = {}  # one entry per root: bounded
    _running: ClassVar[ContextVar[Filesystem | None]] = ContextVar("files_running", default=None)

    def tools(self, ctx: GenerateMiddlewareContext) -> list[Any]:
        key = self.config.model_dump_json()
        if (known := Files._defined.get(key)) is None:
            known = Files._defined[key] = super().tools(ctx)
        return known

    async def wrap_tool(
        self,
        params: ToolHookParams,
        ctx: GenerateMiddlewareContext,
        next_fn: Callable[[ToolHookParams, GenerateMiddlewareContext], Awaitable[Any]],
    ) -> Any:
        token = Files._running.set(self)
        try:
            return await super().wrap_tool(params, ctx, next_fn)
        finally:
            Files._running.reset(token)

    def _enqueue_parts(self, parts: list[Part]) -> None:
        Filesystem._enqueue_parts(Files._running.get() or self, parts)


@dataclass(frozen=True)
class FileTools:
    root: Path | None = None
    artifacts: bool = False

    def middleware(self) -> list[BaseMiddleware[Any]]:
        mounted: list[BaseMiddleware[Any]] = []
        if self.root is not None:
            mounted.append(Files(root_dir=str(self.root), allow_write_access=True))
        if self.artifacts:
            mounted.append(Artifacts())
        return mounted

    def tools(self) -> dict[str, str]:
        """Each tool mounted, with its description."""
        found: dict[str, str] = {}
        if self.root is not None:
            found |= READS | WRITES
        if self.artifacts:
            found |= ARTIFACT_READS | ARTIFACT_WRITES
        return found

    def reads(self) -> frozenset[str]:
        """The tools that only read: allowed unless a policy says otherwise."""
        return frozenset(t for t in self.tools() if t in READS or t in ARTIFACT_READS)

    def previews(self) -> dict[str, Preview]:
        """What each write will change, for its card."""
        found: dict[str, Preview] = {}
        if self.root is not None:
            root = self.root
            found["write_file"] = lambda i: asyncio.to_thread(write_diff, root, i)
            found["edit_file"] = lambda i: asyncio.to_thread(edit_diff, root, i)
        if self.artifacts:
            found["write_artifact"] = artifact_content
        return found

    def checks(self) -> dict[str, Check]:
        """What refuses a write before any card: a path the middleware would normalise."""
        found: dict[str, Check] = {}
        if self.root is not None:
            root = self.root
            found["write_file"] = found["edit_file"] = lambda i: path_problem(root, i)
        return found


def resolve(root: Path, relative: object) -> Path:
    """The file the Filesystem middleware will really use for `relative`: its own rules
    (surrounding spaces and a leading `/` or `\\` stripped, symlinks followed); ValueError
    if it is outside the root, as the middleware itself refuses."""
    base = os.path.realpath(root)
    rel = str(relative).strip().lstrip("/").lstrip("\\") or "."
    path = os.path.realpath(os.path.join(base, rel))
    if path != base and not path.startswith(base + os.sep):
        raise ValueError(f"{relative!r} is outside the files root: the call will fail")
    return Path(path)


def path_problem(root: Path, call: Any) -> str | None:
    """Why a write's `file_path` is refused before any card, said so that the model can
    correct it; None when the path is plain. A path the middleware would normalise (spaces,
    a leading slash, `./`, `..`, `//`) is refused rather than shown one way and written
    another; so is one outside the root, which cannot run."""
    if not isinstance(call, Mapping) or not isinstance(given := call.get("file_path"), str):
        return None  # the tool's schema says what is wrong with it
    plain = os.path.normpath(given.strip().lstrip("/").lstrip("\\"))
    if plain != given:
        return (
            f"file_path {given!r} is not a plain path relative to the files root (it would be "
            f"written as {plain!r}); it did not run and nobody was asked to approve it. "
            f"Call the tool again with file_path {plain!r} if that is the file you mean."
        )
    try:
        resolve(root, given)
    except ValueError:
        return (
            f"file_path {given!r} is outside the files root; it did not run and nobody was "
            "asked to approve it."
        )
    return None


def _shown(root: Path, path: Path) -> str:
    """The path as the card names it: relative to the files root."""
    return os.path.relpath(path, os.path.realpath(root))


def _current(path: Path) -> str | None:
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_COMPARED:
        raise ValueError(f"{path.name} is over {MAX_COMPARED:,} bytes: not compared")
    return path.read_text(encoding="utf-8", errors="replace")


def _diff(name: str, before: str | None, after: str) -> str:
    lines = difflib.unified_diff(
        (before or "").splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile="/dev/null" if before is None else f"a/{name}",
        tofile=f"b/{name}",
    )
    return "".join(lines) or "(no change)"


def write_diff(root: Path, call: Mapping[str, Any]) -> str:
    """`write_file`: the new content against the file as it is now (all new if it is not)."""
    try:
        path = resolve(root, call.get("file_path", ""))
        name = _shown(root, path)
        return _diff(name, _current(path), str(call.get("content", "")))
    except ValueError as why:
        return str(why)


def edit_diff(root: Path, call: Mapping[str, Any]) -> str:
    """`edit_file`: its edits applied to the file as it is now, as the middleware would, or
    why they will fail."""
    try:
        path = resolve(root, call.get("file_path", ""))
        name = _shown(root, path)
        before = _current(path)
        if before is None:
            return f"{name} does not exist: the edit will fail"
        after = before
        for edit in call.get("edits") or []:
            old, new = str(edit.get("old_string", "")), str(edit.get("new_string", ""))
            count = after.count(old) if old else 0
            if count == 0 or (count > 1 and not edit.get("replace_all")):
                return f"the edit will fail: {old!r} is found {count} times in {name}"
            after = (
                after.replace(old, new) if edit.get("replace_all") else after.replace(old, new, 1)
            )
        return _diff(name, before, after)
    except ValueError as why:
        return str(why)


async def artifact_content(call: Mapping[str, Any]) -> str:
    """`write_artifact`: its content, as added lines."""
    return _diff(str(call.get("name", "")), None, str(call.get("content", "")))
