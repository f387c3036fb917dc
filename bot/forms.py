"""Modal forms from JSON schemas: one input per property, typed, and the values back.

A question whose answer is an object, and an approval edited before it runs, are both a
form over a tool's schema: numbers as number inputs, enumerations and booleans as selects,
strings as text, anything else as JSON text. What comes back is typed by the same schema;
the workflow checks it against the schema in full (agent/questions.py, the tool's own).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

Block = dict[str, Any]

TEXT_MAX = 3000  # Slack's most for a plain_text_input
LABEL_MAX = 2000
OPTION_MAX = 75  # an option's text
FIELDS_MAX = 95  # inputs in one modal (100 blocks, a few for the rest)
WHOLE = re.compile(r"-?[0-9]{1,4300}")  # Python's limit on int() of a string


def properties(schema: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The schema's top-level properties, each resolved to the one type it takes (a `$ref`
    followed, an optional `anyOf [X, null]` taken as X)."""
    defs = schema.get("$defs") or {}
    out: dict[str, dict[str, Any]] = {}
    for name, prop in list((schema.get("properties") or {}).items())[:FIELDS_MAX]:
        out[str(name)] = _resolved(prop, defs)
    return out


def _resolved(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    if "$ref" in prop:
        target = defs.get(str(prop["$ref"]).rsplit("/", 1)[-1], {})
        return {**target, **{k: v for k, v in prop.items() if k != "$ref"}}
    options = [p for p in prop.get("anyOf") or [] if p.get("type") != "null"]
    if len(options) == 1:
        merged = {**prop, **_resolved(options[0], defs)}
        merged.pop("anyOf", None)
        return merged
    return dict(prop)


def _kind(prop: Mapping[str, Any]) -> str:
    if prop.get("enum"):
        return "enum"
    kind = prop.get("type")
    return kind if kind in ("string", "number", "integer", "boolean") else "json"


def form_blocks(schema: Mapping[str, Any], values: Mapping[str, Any] | None = None) -> list[Block]:
    """One input block per property, prefilled with `values` (block_id: the property)."""
    required = set(schema.get("required") or [])
    blocks = []
    for name, prop in properties(schema).items():
        label = str(prop.get("title") or name)
        if prop.get("description"):
            label = f"{label}: {prop['description']}"
        blocks.append(
            {
                "type": "input",
                "block_id": name[:255],
                "optional": name not in required,
                "label": {"type": "plain_text", "text": label[:LABEL_MAX] or name},
                "element": _element(prop, (values or {}).get(name)),
            }
        )
    return blocks


def _element(prop: Mapping[str, Any], value: Any) -> Block:
    kind = _kind(prop)
    shown = _prefilled(prop, value)
    if kind in ("number", "integer"):
        element: Block = {
            "type": "number_input",
            "action_id": "value",
            "is_decimal_allowed": kind == "number",
        }
        for key, slack in (("minimum", "min_value"), ("maximum", "max_value")):
            if isinstance(prop.get(key), int | float):
                element[slack] = str(prop[key])
        if shown:
            element["initial_value"] = shown
        return element
    if kind in ("enum", "boolean"):
        choices = prop["enum"] if kind == "enum" else [True, False]
        options = [_option(c) for c in choices[:100]]
        element = {"type": "static_select", "action_id": "value", "options": options}
        if shown is not None:
            element["initial_option"] = _option(value)
        return element
    element = {"type": "plain_text_input", "action_id": "value", "max_length": TEXT_MAX}
    element["multiline"] = kind == "json" or int(prop.get("maxLength") or TEXT_MAX) > 150
    if shown:
        element["initial_value"] = shown
    return element


def _prefilled(prop: Mapping[str, Any], value: Any) -> str | None:
    """What the input for `value` starts with, as Slack sends it back when nobody touches
    it (None: empty). A text longer than Slack lets an input hold starts cut."""
    kind = _kind(prop)
    if kind in ("number", "integer"):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return str(value) if number else None
    if kind in ("enum", "boolean"):
        choices = prop["enum"] if kind == "enum" else [True, False]
        return _option(value)["value"] if value in choices else None
    if kind == "json":
        shown = json.dumps(value, ensure_ascii=False) if value is not None else None
    else:
        shown = value if isinstance(value, str) else None
    return shown[:TEXT_MAX] if shown else None


def _option(choice: Any) -> Block:
    shown = json.dumps(choice, ensure_ascii=False) if not isinstance(choice, str) else choice
    return {
        "text": {"type": "plain_text", "text": shown[:OPTION_MAX] or " "},
        "value": json.dumps(choice, ensure_ascii=False)[:150],
    }


def form_values(
    schema: Mapping[str, Any],
    state: Mapping[str, Any],
    prefilled: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The values a submitted form holds, typed by the schema, and what could not be read
    (by property: Slack shows each next to its input). An empty optional input is left out.

    `prefilled`: the values the form was opened with. An input sent back as it was opened
    keeps its value exactly (a text longer than an input holds, a number a float would
    round, a key the form has no input for): only what the person changed is read."""
    before = dict(prefilled or {})
    fields = properties(schema)
    values: dict[str, Any] = {k: v for k, v in before.items() if k not in fields}
    errors: dict[str, str] = {}
    for name, prop in fields.items():
        raw = (state.get(name[:255]) or {}).get("value") or {}
        if "selected_option" in raw:
            picked = (raw.get("selected_option") or {}).get("value")
            text = None if picked is None else str(picked)
        else:
            text = raw.get("value")
        if prefilled is not None and (text or None) == _prefilled(prop, before.get(name)):
            if name in before:  # untouched: exactly as it was
                values[name] = before[name]
            continue
        if text is None or not text.strip():
            continue
        try:
            values[name] = _typed(_kind(prop), str(text))
        except ValueError as exc:
            errors[name] = str(exc)
    return values, errors


def _typed(kind: str, text: str) -> Any:
    if kind in ("integer", "number"):
        if WHOLE.fullmatch(text.strip()):  # exactly, however large (a float rounds past 2^53)
            return int(text.strip())
        try:
            number = float(text)
        except ValueError:
            raise ValueError("a number is needed") from None
        if kind == "integer" and not number.is_integer():
            raise ValueError("a whole number is needed")
        return int(number) if number.is_integer() and "." not in text else number
    if kind in ("enum", "boolean"):
        return json.loads(text)  # the option's value: our own JSON
    if kind == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise ValueError('this must be JSON, e.g. [1, 2] or {"a": 1}') from None
    return text
