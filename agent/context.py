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
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
# The haystacks a process keeps for the next turn (`_Recent`): those of at least RECENT_MIN
# characters (smaller ones are read again in a few ms), up to RECENT_MAX in all (about 15
# bytes of memory a character: 60 MB).
RECENT_MIN = 16 * 1024
RECENT_MAX = 4 * 1024 * 1024

# A number as people write it: 12345, 1,500, 1'500.00, 1 500 (a narrow or no-break space).
_NUMBER = re.compile(r"\d{1,3}(?:[,'\u00a0\u202f]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_SEPARATORS = str.maketrans("", "", ",'\u00a0\u202f")
_DIGITS = re.compile(r"\d[\d,'.\u00a0\u202f]*")  # where _NUMBER can match: it starts with a digit
_WORD = re.compile(r"\w+")
_Key = str | int | Decimal  # a word (a string) or a number (by value) in a text


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
        needle = _Needle.of(value)
        if index.human.has(needle):
            sources[path] = Source("human")
            continue
        found = (name for name, haystack in reversed(index.results) if haystack.has(needle))
        tool = next(found, None)
        sources[path] = Source("tool", tool) if tool is not None else Source("model")
    return sources


class Index:
    """What a turn's conversation says, ready to look argument values up in: built once per
    model answer, from the previous answer's where the process has it (so only new
    messages are read), each look-up then a set probe or a search in the messages that
    hold every word of the value. Each haystack keeps only its last TRACE_TEXT_MAX
    characters: a value only further back counts as not found, which flags it (the safe
    side)."""

    def __init__(self, conversation: Sequence[Message]) -> None:
        humans: list[str] = []
        results: list[tuple[str, _Haystack]] = []
        files: list[tuple[str, _Haystack]] = []  # searched before the other results
        for m in conversation:
            if m.role == "tool":
                results += [
                    (part.tool_response.name, _Haystack.of(_strings(part.tool_response.output)))
                    for part in m.content
                    if part.tool_response is not None
                ]
            elif m.role == "user" and _human(m):
                humans.append(_text(m))
            elif m.role == "user" and (text := _text(m)).startswith("<read_file"):
                # A file's content, read with read_file, reaches the model unsigned.
                files.append(("read_file", _Haystack.of([text])))
        self.human = _Haystack.of(humans)
        self.results = results + files


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
    """Text to look values up in: case and runs of whitespace ignored, numbers by value.

    A set of pieces (a message, a string of a tool's result), each analysed once: its words
    say which pieces a value can be in (`where`), so a look-up searches a few messages,
    never a megabyte (most of a millisecond per value). Immutable once built; the next
    turn's is derived from it (`RECENT`), at the cost of the pieces that changed."""

    def __init__(self, pieces: dict[str, _Piece], where: dict[_Key, list[_Piece]]) -> None:
        self.pieces = pieces  # by text
        self.where = where  # each word and number -> the pieces that have it
        self.size = sum(map(len, pieces))

    @classmethod
    def of(cls, texts: Iterable[str]) -> _Haystack:
        """The haystack of `texts`, keeping the latest up to TRACE_TEXT_MAX characters."""
        kept, size = [], 0
        for text in reversed(list(texts)):  # the latest first, up to the cap
            if size >= TRACE_TEXT_MAX:
                break
            kept.append(text[-(TRACE_TEXT_MAX - size) :])
            size += len(kept[-1])
        if not kept:
            return _EMPTY
        wanted = set(kept)
        # The one kept under one of its latest texts (kept is latest first) that differs
        # least; built from nothing if none is nearer than that.
        near = [(len(h.pieces.keys() ^ wanted), k, h) for k, h in RECENT.near(kept[:3])]
        differ, key, base = min(near, key=lambda n: n[0], default=(0, "", _EMPTY))
        if differ > len(wanted):
            key, base = "", _EMPTY
        haystack = base if base.pieces.keys() == wanted else base.changed(wanted)
        RECENT.keep(kept[0], haystack, replacing=(key, base))
        return haystack

    def changed(self, texts: set[str]) -> _Haystack:
        """This haystack with `texts` as its pieces: only the pieces that differ cost."""
        pieces, where = dict(self.pieces), dict(self.where)

        def having(key: _Key) -> list[_Piece]:
            found = where.get(key)
            if found is None:
                found = where[key] = []
            elif found is self.where.get(key):
                found = where[key] = list(found)  # shared with this one: copied first
            return found

        for text in self.pieces.keys() - texts:
            gone = pieces.pop(text)
            for key in gone.terms():
                having(key).remove(gone)
                if not where[key]:
                    del where[key]
        # Message by message: a thread doing this hands the interpreter back to the event
        # loop between pieces, never one long call over it all.
        for text in texts - self.pieces.keys():
            piece = pieces[text] = _Piece.of(text)
            for key in piece.terms():
                having(key).append(piece)
        return _Haystack(pieces, where)

    def has(self, needle: _Needle) -> bool:
        if needle.number is not None and needle.number in self.where:
            return True
        if needle.text is None:
            return False
        having = [self.where.get(word, ()) for word in needle.words]
        if not all(having):
            return False  # a word of it is nowhere: no need to search
        candidates: Iterable[_Piece] = self.pieces.values()
        if having and needle.text[:1] != "_" and needle.text[-1:] != "_":
            # Found whole, each of its words is a whole word of the piece it is in: only
            # the pieces with all of them can have it. (An edge "_" is not checked for
            # the word going on, as a letter is: "_1" is found in "a_1", whose word is "a_1".)
            shortest = min(having, key=len)
            candidates = (p for p in shortest if needle.words <= p.words)
        return any(_whole(p.normal, needle.text) for p in candidates)


@dataclass(frozen=True, eq=False)  # compared by identity: a haystack's lists remove it so
class _Piece:
    """One text, analysed: normalised, its words, and its numbers by value."""

    normal: str
    words: frozenset[str]
    numbers: frozenset[int | Decimal]

    @classmethod
    def of(cls, text: str) -> _Piece:
        normal = _normal(text)
        # Numbers are read only where a digit starts a run of what numbers are made of:
        # the same matches as reading the whole text, at a third of the cost.
        raw = {n for run in _DIGITS.findall(text) for n in _NUMBER.findall(run)}
        numbers = frozenset(n for n in map(_number, raw) if n is not None)
        return cls(normal, frozenset(_WORD.findall(normal)), numbers)

    def terms(self) -> tuple[_Key, ...]:
        """What `where` finds it by: its words and its numbers."""
        return (*self.words, *self.numbers)


_EMPTY = _Haystack({}, {})


@dataclass(frozen=True)
class _Needle:
    """An argument value as it is looked for: normalised once, whatever the haystacks."""

    text: str | None  # a string's text, normalised (a number has none)
    words: frozenset[str]
    number: Decimal | None  # the value, if it is a number or a string that reads as one

    @classmethod
    def of(cls, value: str | int | float) -> _Needle:
        if not isinstance(value, str):
            return cls(None, frozenset(), _decimal(str(value)))
        text = _normal(value)
        number = _decimal(text.translate(_SEPARATORS)) if _NUMBER.fullmatch(text) else None
        return cls(text, frozenset(_WORD.findall(text)), number)


class _Recent:
    """The haystacks built lately, by their latest text (a few under each: many threads'
    latest message is "yes"), least recently used out first, up to `limit` characters in
    all, none under `smallest`: a conversation's next turn finds its last one under its
    previous message. Used from the threads that trace, hence the lock."""

    def __init__(self, limit: int, smallest: int = 0, per_text: int = 4) -> None:
        self._limit = limit
        self._smallest = smallest
        self._per_text = per_text
        self._size = 0
        self._kept: OrderedDict[str, list[_Haystack]] = OrderedDict()
        self._lock = threading.Lock()

    def near(self, latest: Sequence[str]) -> list[tuple[str, _Haystack]]:
        """The haystacks kept under any of `latest`, with the text each is kept under."""
        with self._lock:
            found = []
            for text in latest:
                if (kept := self._kept.get(text)) is not None:
                    self._kept.move_to_end(text)
                    found += [(text, haystack) for haystack in kept]
            return found

    def keep(self, latest: str, haystack: _Haystack, *, replacing: tuple[str, _Haystack]) -> None:
        """Keep `haystack` under its latest text, instead of the one it was made from (the
        conversation moved on)."""
        with self._lock:
            self._drop(*replacing)
            self._drop(latest, haystack)
            if haystack.size < self._smallest:
                return
            kept = self._kept.setdefault(latest, [])
            kept.insert(0, haystack)
            self._kept.move_to_end(latest)
            self._size += haystack.size
            if len(kept) > self._per_text:
                self._size -= kept.pop().size
            while self._size > self._limit:
                self._size -= sum(h.size for h in self._kept.popitem(last=False)[1])

    def _drop(self, text: str, haystack: _Haystack) -> None:
        kept = self._kept.get(text, [])
        if haystack in kept:
            kept.remove(haystack)
            self._size -= haystack.size
            if not kept:
                del self._kept[text]

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._size = 0


RECENT = _Recent(RECENT_MAX, RECENT_MIN)


def _whole(text: str, needle: str) -> bool:
    """Whether `needle` is in `text` as a whole word (or words): "12" is not in "12345"."""
    at = text.find(needle)
    while at >= 0:
        before = text[at - 1 : at] if at else ""
        after = text[at + len(needle) : at + len(needle) + 1]
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


def _number(raw: str) -> int | Decimal | None:
    """A number as written in text, by value: digits alone (most) read as an int, which
    equals and hashes as the same Decimal, three times faster."""
    if raw.isdecimal() and len(raw) < 4000:  # int() refuses longer strings
        return int(raw)
    return _decimal(raw.translate(_SEPARATORS))


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
    """A message a person wrote (signed by `human_message`): `author` would say who, without
    reading the time (this runs for every message of every index)."""
    signed = (message.metadata or {}).get(AUTHOR)
    return message.role == "user" and isinstance(signed, dict) and isinstance(signed.get("by"), str)


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


def conversation_lines(
    messages: Sequence[Message],
    limit: int = CONVERSATION_MAX,
    shown: Callable[[Any], Any] = lambda value: value,
) -> list[Line]:
    """The last `limit` messages, oldest first: humans' and the agent's words whole, tool
    calls and their results summarised; every text and value as `shown` gives it (a
    request's redacted fields hidden, storage/redaction.py)."""
    lines: list[Line] = []
    for message in messages:
        if _human(message):
            by, at = author(message)
            lines.append(Line("human", shown(_text(message)), by, at))
        elif message.role == "user":  # not a person's: a file the agent read, say
            lines.append(Line("tool", f"(not from a person) {_summary(shown(_text(message)))}"))
        elif message.role == "model":
            calls = [
                f"→ calls {p.tool_request.name} {_summary(shown(p.tool_request.input))}"
                for p in message.content
                if p.tool_request is not None
            ]
            text = "\n".join(t for t in (shown(_text(message)).strip(), *calls) if t)
            lines.append(Line("agent", text))
        elif message.role == "tool":
            lines.extend(
                Line(
                    "tool",
                    f"{p.tool_response.name} returned {_summary(shown(p.tool_response.output))}",
                )
                for p in message.content
                if p.tool_response is not None
            )
    return lines[-limit:]


def _summary(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= SUMMARY_MAX else text[: SUMMARY_MAX - 1] + "…"
