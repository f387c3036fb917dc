"""Questions: interrupts that ask a person for input rather than for approval.

`askHuman` is built in (AGENT_ASK_HUMAN); any interrupt a tool module defines
(`ai.define_interrupt`, or a tool that raises `Interrupt`) is a question too. A question is
answered with `respond` (its tool never runs again: a restart of an interrupt interrupts
again), in the same resume as the turn's approvals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Literal

import jsonschema
from genkit import Genkit, GenkitError, Interrupt, Tool
from pydantic import BaseModel, Field

from storage.domain import Answered, Approval, Asked, Expired

ASK_HUMAN = "askHuman"
ASK_HUMAN_PROMPT = (
    " When you need information you cannot get with your tools (a missing detail, a choice "
    "only a person can make), ask with askHuman: the employee by default, or the approvers "
    "(who: approvers) for a decision that is theirs. Do not guess."
)
NO_ANSWER = {"answer": None, "error": "no answer"}


class AskHumanInput(BaseModel):
    question: str = Field(description="The question, in plain words, complete on its own.")
    who: Literal["requester", "approvers"] = Field(
        default="requester",
        description="Who answers: the employee who asked you (default), or the approvers.",
    )


def define_ask_human(ai: Genkit) -> Tool:
    return ai.define_interrupt(
        ASK_HUMAN,
        input_schema=AskHumanInput,
        description=(
            "Ask a person a question and wait for the answer. Use it when you need "
            "information or a decision you cannot get with your tools."
        ),
    )


# Genkit 0.12 marks an interrupt tool nowhere: `define_interrupt` (`ai.define_interrupt`, or
# the registry's, which alone takes `request_metadata`) registers an ordinary tool around a
# handler of its own that only raises `Interrupt`. That handler is the one mark there is, so
# it is what `is_interrupt` looks for, rather than replacing `ai.define_interrupt` while the
# modules load (which missed the registry's). tests/agent/test_runtime.py fails if a Genkit
# upgrade moves it.
_INTERRUPT_HANDLER = "define_interrupt.<locals>.interrupt_wrapper"


def is_interrupt(tool: Tool) -> bool:
    """Whether Genkit's `define_interrupt` made `tool`: it only ever asks (a question)."""
    registered = getattr(tool.action(), "_fn", None)
    for cell in getattr(registered, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            if getattr(cell.cell_contents, "__qualname__", None) == _INTERRUPT_HANDLER:
                return True
    return False


def asking(exc: BaseException) -> dict[str, Any] | None:
    """The metadata of the interrupt a tool raised (Genkit may wrap it), or None."""
    found = exc.cause if isinstance(exc, GenkitError) else exc
    if not isinstance(found, Interrupt):
        return None
    return found.metadata if isinstance(found.metadata, dict) else {}


def asked(input: Any, metadata: Mapping[str, Any] | None = None) -> Asked:
    """Whom a question asks: its `who` (in its input, or the interrupt's metadata), else
    the requester."""
    for source in (input, metadata):
        who = source.get("who") if isinstance(source, Mapping) else None
        if who in ("requester", "approvers"):
            return who  # type: ignore[no-any-return]
    return "requester"


def answer_form(tool: Tool | None) -> dict[str, Any] | None:
    """The JSON schema of the object a question's answer must be, when its tool gives one
    (a tool with a typed output that raises `Interrupt`); None: the answer is free text."""
    schema = tool.output_schema if tool is not None else None
    if isinstance(schema, dict) and schema.get("type") == "object" and schema.get("properties"):
        return schema
    return None


def form_errors(schema: Mapping[str, Any], value: Any) -> dict[str, str]:
    """What is wrong with `value` by `schema`, by field ("answer" for the whole); {}: fits."""
    errors: dict[str, str] = {}
    for error in jsonschema.Draft202012Validator(schema).iter_errors(value):
        field = ".".join(str(p) for p in error.absolute_path) or "answer"
        errors.setdefault(field, error.message)
    return errors


def answered(approval: Approval, form: bool) -> Any:
    """What the model gets for a settled question: the answer (an object when the question
    has a form, else `{"answer", "answered_by"}`), or that nobody answered."""
    match approval.decision:
        case Answered(by=by, answer=answer):
            return answer if form else {"answer": answer, "answered_by": by}
        case Expired():
            return NO_ANSWER
    raise ValueError(f"question {approval.id} is not settled: {approval.decision!r}")
