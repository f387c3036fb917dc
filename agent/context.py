"""What led to a call, read off the conversation the model saw when it made it.

An approver of `transferMoney {toAccount: 12345}` should know what the employee asked for,
what the agent said, and whether `12345` was typed by a human or came from somewhere else
(a tool's result, a document the agent read, or the model itself: prompt injection looks
like this). `call_context` answers from the model's own request, so it costs nothing until
a call needs a human or a rule asks (`provenance`).

Who wrote each human message travels in the message's metadata (`human_message`): Genkit
keeps it in the session, and the model never sees it. A user-role message without it is not
a person's: the Filesystem middleware, for one, hands the model a file's content that way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from genkit import Message, Part

from storage.domain import Context, Said, Source

AUTHOR = "greenlight"  # a human message's metadata key: {"by": "U…", "at": ISO 8601}
SAID_MAX = 500  # characters of a human's or the agent's words kept on the request
SUMMARY_MAX = 300  # characters of a tool call or result in the conversation's summary
CONVERSATION_MAX = 20  # messages shown of the conversation that led to a call
TRACE_TEXT_MAX = 2 * 1024 * 1024  # characters of humans' text (and of each result) searched
TRACE_VALUES_MAX = 500  # argument values traced per call; the rest are left out

# A number as people write it: 12345, 1,500, 1'500.00, 1 500 (a narrow or no-break space).
_NUMBER = re.compile(r"\d{1,3}(?:[,'\u00a0\u202f]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_SEPARATORS = str.maketrans("", "", ",'\u00a0\u202f")
_WORD = re.compile(r"\w+")


def human_message(text: str, *, by: str, at: datetime, viewing: str | None = None) -> Message:
    """An employee's message as the agent's input, signed with who wrote it and when.

    `viewing`: the channel the employee has open beside an assistant thread, told to the
    model in a part of its own that is not the employee's words (quotes and provenance
    skip it)."""
    content = [Part.from_text(text)]
    if viewing is not None:
        note = f"(Slack context: the employee is looking at channel <#{viewing}>.)"
        content.append(Part(text=note, metadata={AUTHOR: "context"}))
    return Message(
        role="user", content=content, metadata={AUTHOR: {"by": by, "at": at.isoformat()}}
    )


def call_context(
    conversation: Sequence[Message], ref: str | None, args: Any, index: Index | None = None
) -> Context:
    """The request behind the call `ref`, the agent's words just before it, and where each
    argument value came from (`index`: the conversation's, if built already). An empty
    conversation (a call made with no model request seen, e.g. a restart) gives an empty
    context: nothing is claimed."""
    if not conversation:
        return Context()
    humans = [m for m in conversation if _human(m) and _text(m).strip()]
    return Context(
        first=_said(humans[0]) if humans else None,
        latest=_said(humans[-1]) if len(humans) > 1 else None,
        agent=_words_before(conversation, ref),
        sources=trace(args, index or Index(conversation)),
    )


def trace(args: Any, conversation: Sequence[Message] | Index) -> dict[str, Source]:
    """For each string and number in `args` (by path), where it appears first in the
    conversation's trust order: a human's message, else the latest tool result that has
    it, else nowhere (the model's own). Pass an `Index` to look many calls up in one turn
    without building it again."""
    index = conversation if isinstance(conversation, Index) else Index(conversation)
    sources = {}
    for n, (path, value) in enumerate(leaves(args)):
        if n >= TRACE_VALUES_MAX:
            break  # left out: a rule reading it fails safe, the card claims nothing
        if index.human.has(value):
            sources[path] = Source("human")
            continue
        found = (name for name, haystack in reversed(index.results) if haystack.has(value))
        tool = next(found, None)
        sources[path] = Source("tool", tool) if tool is not None else Source("model")
    return sources


class Index:
    """What a turn's conversation says, ready to look argument values up in: built once per
    conversation (it costs a pass over the text), each look-up then a set probe or a
    search in text known to hold every word of the value. Each haystack keeps only its
    last TRACE_TEXT_MAX characters: a value only further back counts as not found, which
    flags it (the safe side)."""

    def __init__(self, conversation: Sequence[Message]) -> None:
        self.human = _Haystack(_text(m) for m in conversation if _human(m))
        results = [
            (part.tool_response.name, _Haystack(_strings(part.tool_response.output)))
            for m in conversation
            if m.role == "tool"
            for part in m.content
            if part.tool_response is not None
        ]
        # A file's content, read with read_file, reaches the model as an unsigned user message.
        results += [
            ("read_file", _Haystack([_text(m)]))
            for m in conversation
            if m.role == "user" and not _human(m) and _text(m).startswith("<read_file")
        ]
        self.results = results


def as_provenance(args: Any, sources: Mapping[str, Source], path: str = "") -> Any:
    """`args` with each traced value replaced by its origin ("human", "tool", "model"): the
    CEL variable `provenance`, so `provenance.toAccount` sits where `args.toAccount` does.
    A value with no recorded source is left out (a rule reading it fails closed)."""
    if isinstance(args, dict):
        out = {}
        for key, value in args.items():
            found = as_provenance(value, sources, _join(path, key))
            if found is not None:
                out[str(key)] = found
        return out
    if isinstance(args, list):
        return [as_provenance(v, sources, _join(path, i)) for i, v in enumerate(args)]
    source = sources.get(path)
    return None if source is None else source.origin


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, str | int | float]]:
    """Every string and number in a JSON value, with its path ("items.0.sku")."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, _join(path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, _join(path, i))
    elif _traceable(value):
        yield path, value


def _traceable(value: Any) -> bool:
    """A string with text in it, or a number (a boolean is neither)."""
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, int | float) and not isinstance(value, bool)


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


class _Haystack:
    """Text to look values up in: case and runs of whitespace ignored, numbers by value."""

    def __init__(self, texts: Iterator[str] | Sequence[str]) -> None:
        kept, size = [], 0
        for text in reversed(list(texts)):  # the latest first, up to the cap
            if size >= TRACE_TEXT_MAX:
                break
            kept.append(text[-(TRACE_TEXT_MAX - size) :])
            size += len(kept[-1])
        kept.reverse()
        # Message by message, never one long call over it all: a thread doing this hands
        # the interpreter back to the event loop between pieces.
        normal = [_normal(t) for t in kept]
        self.text = " \n ".join(normal)
        self.words: set[str] = set()
        for t in normal:
            self.words.update(_WORD.findall(t))
        self._kept = kept
        self._numbers: set[Decimal] | None = None

    @property
    def numbers(self) -> set[Decimal]:
        """The numbers the text has, by value: read once, when a number is first looked up."""
        if self._numbers is None:
            raw: set[str] = set()
            for t in self._kept:
                raw.update(_NUMBER.findall(t))  # the same number written twice: parsed once
            parsed = (_decimal(r.translate(_SEPARATORS)) for r in raw)
            self._numbers = {n for n in parsed if n is not None}
        return self._numbers

    def has(self, value: str | int | float) -> bool:
        if not isinstance(value, str):
            return _decimal(str(value)) in self.numbers
        needle = _normal(value)
        number = _decimal(needle.translate(_SEPARATORS)) if _NUMBER.fullmatch(needle) else None
        if number is not None and number in self.numbers:
            return True
        if not all(word in self.words for word in _WORD.findall(needle)):
            return False  # a word of it is nowhere: no need to search
        # As a whole word (or words): "12" is not found in "12345".
        text, at = self.text, self.text.find(needle)
        while at >= 0:
            before, after = (
                text[at - 1 : at] if at else "",
                text[at + len(needle) : at + len(needle) + 1],
            )
            if not (needle[:1].isalnum() and _wordy(before)) and not (
                needle[-1:].isalnum() and _wordy(after)
            ):
                return True
            at = text.find(needle, at + 1)
        return False


def _wordy(char: str) -> bool:
    """Whether `char` continues a word (as regex `\\w` says)."""
    return bool(char) and (char.isalnum() or char == "_")


def _normal(text: str) -> str:
    return " ".join(text.casefold().split())


def _decimal(text: str) -> Decimal | None:
    try:
        return abs(Decimal(text))
    except InvalidOperation:
        return None


def _strings(value: Any) -> list[str]:
    """A tool's output as the texts and numbers an argument could have been copied from."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if value is None or isinstance(value, bool):
        return []
    return [str(value)]


def _text(message: Message) -> str:
    """What the message says (without the context notes added to a person's words)."""
    return "".join(p.text for p in message.content if p.text and not (p.metadata or {}).get(AUTHOR))


def _human(message: Message) -> bool:
    """A message a person wrote (signed by `human_message`)."""
    return message.role == "user" and author(message)[0] is not None


def _said(message: Message) -> Said:
    by, at = author(message)
    text = _text(message)
    return Said(text=text[:SAID_MAX], length=len(text), by=by, at=at)


def author(message: Message) -> tuple[str | None, datetime | None]:
    """Who wrote a human message and when, if it was signed (`human_message`)."""
    signed = (message.metadata or {}).get(AUTHOR)
    if not isinstance(signed, dict):
        return None, None
    by = signed.get("by")
    try:
        at = datetime.fromisoformat(signed["at"]) if isinstance(signed.get("at"), str) else None
    except ValueError:
        at = None
    return (by if isinstance(by, str) else None), at


def _words_before(conversation: Sequence[Message], ref: str | None) -> Said | None:
    """The agent's text in the message that made the call, before the call."""
    for message in reversed(conversation):
        if message.role != "model":
            continue
        words: list[str] = []
        for part in message.content:
            request = part.tool_request
            if request is not None and request.ref == ref:
                said = "".join(words).strip()
                return Said(text=said[:SAID_MAX], length=len(said)) if said else None
            if part.text:
                words.append(part.text)
    return None


@dataclass(frozen=True)
class Line:
    """One message of the conversation as an approver reads it."""

    kind: Literal["human", "agent", "tool"]
    text: str
    by: str | None = None  # a human's Slack user id, when known
    at: datetime | None = None


def conversation_lines(messages: Sequence[Message], limit: int = CONVERSATION_MAX) -> list[Line]:
    """The last `limit` messages, oldest first: humans' and the agent's words whole, tool
    calls and their results summarised."""
    lines: list[Line] = []
    for message in messages:
        if _human(message):
            by, at = author(message)
            lines.append(Line("human", _text(message), by, at))
        elif message.role == "user":  # not a person's: a file the agent read, say
            lines.append(Line("tool", f"(not from a person) {_summary(_text(message))}"))
        elif message.role == "model":
            calls = [
                f"→ calls {p.tool_request.name} {_summary(p.tool_request.input)}"
                for p in message.content
                if p.tool_request is not None
            ]
            text = "\n".join(t for t in (_text(message).strip(), *calls) if t)
            lines.append(Line("agent", text))
        elif message.role == "tool":
            lines.extend(
                Line("tool", f"{p.tool_response.name} returned {_summary(p.tool_response.output)}")
                for p in message.content
                if p.tool_response is not None
            )
    return lines[-limit:]


def _summary(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= SUMMARY_MAX else text[: SUMMARY_MAX - 1] + "…"
