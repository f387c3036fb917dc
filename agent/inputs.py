"""A call's input as its tool takes it: validated and coerced by its schema, compared, cleaned.

What policy reads, what an approver is shown and what runs are the same value: the input
as the tool's own schema coerces it (`coerced`), with NUL characters taken out
(`without_nul`); `same_value` compares JSON values as the tool sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from genkit import Action
from genkit.model import ModelResponse
from pydantic import BaseModel, ValidationError


def jsonable(value: Any) -> Any:
    """A tool's output as plain JSON, as it is recorded and replayed."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value


def stamp_refs(response: ModelResponse, new_id: Callable[[], str]) -> None:
    """Give every tool request a ref of ours (Genkit matches on name+ref), whatever the
    model sent: one it chose could repeat an earlier call's and borrow its context or its
    approval. NUL characters go from the calls' input: PostgreSQL cannot store them, and
    what the approver sees, what is stored and what runs must be the same."""
    if response.message is None:
        return
    for part in response.message.content:
        request = part.tool_request
        if request is None:
            continue
        request.ref = new_id()
        request.input = without_nul(request.input)


def without_nul(value: Any) -> Any:
    """`value` with every NUL character taken out of its strings (keys included)."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    return value


def invalid_problem(tool: str, errors: Mapping[str, str]) -> str:
    """What is wrong with a call's input by its tool's own schema, said so that the model can
    correct it."""
    problems = "; ".join(f"{field}: {message}" for field, message in list(errors.items())[:10])
    return (
        f"invalid input for {tool} ({problems}); it did not run and nobody was "
        "asked to approve it. Correct the input and call the tool again."
    )


def input_errors(tool: Action, value: Any) -> dict[str, str]:
    """What is wrong with `value` as the tool's input, by its own schema, by field ("input"
    for the whole); {} when it is valid or the tool declares no schema."""
    return coerced(tool, value)[1]


def coerced(tool: Action, value: Any) -> tuple[Any, dict[str, str]]:
    """`value` as the tool's schema validates and coerces it ("250000" for a number field
    becomes 250000; keys the schema does not take are dropped), and what is wrong with it
    by field ({}: it is valid). The tool itself gets exactly this, so policy and approvers
    are shown it. Wherever the schema leaves a value as it was, the value is kept as given
    (an integer 500 stays 500, not 500.0). A tool with a JSON schema and no Python type (an
    MCP server's `inputSchema`) is checked against the schema and takes `value` as it is; a
    tool without a schema takes it unchecked."""
    if tool.input_type is None:
        schema = tool.input_schema
        if not isinstance(schema, dict) or not schema:
            return value, {}
        import jsonschema  # only tools with a bare JSON schema (MCP) need it

        found: dict[str, str] = {}
        validator = jsonschema.validators.validator_for(schema)(schema)
        for error in validator.iter_errors(value):
            found.setdefault(
                ".".join(str(p) for p in error.absolute_path) or "input", error.message
            )
        return value, found
    try:
        valid = tool.input_type.validate_python(value)
    except ValidationError as exc:
        errors: dict[str, str] = {}
        for e in exc.errors():
            errors.setdefault(".".join(str(p) for p in e["loc"]) or "input", e["msg"])
        return value, errors
    dumped = tool.input_type.dump_python(valid, mode="json", by_alias=True, exclude_unset=True)
    return _kept(value, dumped), {}


def _kept(given: Any, valid: Any) -> Any:
    """`valid`, with each part that equals `given`'s (as JSON values) taken from `given`."""
    if same_value(given, valid):
        return given
    if isinstance(given, dict) and isinstance(valid, dict):
        return {k: _kept(given[k], v) if k in given else v for k, v in valid.items()}
    if isinstance(given, list) and isinstance(valid, list) and len(given) == len(valid):
        return [_kept(g, v) for g, v in zip(given, valid, strict=True)]
    return valid


def same_value(a: Any, b: Any) -> bool:
    """Whether two JSON values are the same value: numbers by value (500 is 500.0), but a
    boolean is never a number, nor a string anything else."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)
