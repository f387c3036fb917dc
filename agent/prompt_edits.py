"""Edit & approve of a Claude Code permission prompt (`prompt.<tool>`): its input has no
schema of its own, so the form is made from the input itself, a field per top-level key,
labelled with the key: text as text, any other value as JSON.

What comes back keeps the same keys (a key left out keeps its value), each value as the form
typed it; the result is what Claude Code runs (`updatedInput`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.policy_file import PROMPT_PREFIX

ANY_INPUT: dict[str, Any] = {"type": "object", "additionalProperties": True}


def is_prompt(tool: str) -> bool:
    return tool.startswith(PROMPT_PREFIX)


def prompt_form(given: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON schema of the form for this input (None: no key to edit). Without the input,
    whether such a tool can be edited at all: it can (ANY_INPUT)."""
    if given is None:
        return ANY_INPUT
    if not given:
        return None
    properties: dict[str, Any] = {}
    for key, value in given.items():
        # No "type" for a non-text value: the form edits it as JSON.
        properties[key] = {"type": "string"} if isinstance(value, str) else {}
    required = [k for k, v in given.items() if v not in ("", None)]
    return {"type": "object", "properties": properties, "required": required}


def prompt_edited(
    given: Mapping[str, Any], changed: Any
) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The edited input (the same keys, a text still text), or what is wrong, by key."""
    if not isinstance(changed, dict):
        return None, {"input": "an object is needed"}
    errors = {k: "not a key of this input" for k in changed if k not in given}
    new = {k: changed.get(k, v) for k, v in given.items()}
    for key, value in given.items():
        if isinstance(value, str) and not isinstance(new[key], str):
            errors[key] = "text is needed"
    return (None, errors) if errors else (new, {})
