"""What led to a call (issue 17): the request, the agent's words, where each value came from."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from unittest.mock import patch

import pytest
from genkit import Message, Part, ToolRequest, ToolResponse
from hypothesis import example, given, settings, strategies as st

from agent import approval, context
from agent.context import (
    SAID_MAX,
    as_provenance,
    call_context,
    conversation_lines,
    human_message,
    trace,
)
from agent.scope import TurnScope
from storage.domain import Context, Source

AT = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


def model(*parts: Part) -> Message:
    return Message(role="model", content=list(parts))


def calling(name: str, args: dict[str, object], ref: str = "r1") -> Part:
    return Part(tool_request=ToolRequest(name=name, ref=ref, input=args))


def result(name: str, output: object, ref: str = "r0") -> Message:
    return Message(
        role="tool", content=[Part(tool_response=ToolResponse(name=name, ref=ref, output=output))]
    )


def origins(args: dict[str, object], *conversation: Message) -> dict[str, str]:
    return {path: s.origin for path, s in trace(args, conversation).items()}


def test_values_a_human_typed_are_found_however_they_are_written() -> None:
    said = human_message("Pay ACME  Corp 1,500.00 from acct 12345, ref\nINV-7", by="U1", at=AT)
    args = {"payee": "acme corp", "amount": 1500, "from": 12345, "ref": "inv-7", "cents": 1500.0}
    assert origins(args, said) == dict.fromkeys(args, "human")


def test_a_value_must_appear_whole_not_inside_a_longer_one() -> None:
    said = human_message("send 500 to 123456 (acme corporation)", by="U1", at=AT)
    assert origins({"to": "12345", "amount": 50, "payee": "acme corp"}, said) == {
        "to": "model",
        "amount": "model",
        "payee": "model",
    }


def test_a_value_from_a_tool_result_names_the_latest_tool_that_returned_it() -> None:
    conversation = (
        human_message("move my savings balance to checking", by="U1", at=AT),
        model(calling("getBalance", {"account": "savings"}, ref="r0")),
        result("getBalance", {"account": "savings", "balance": 1250.0}),
        result("lookupAccount", {"iban": "DE89 3704 0044"}),
    )
    sources = trace({"amount": 1250, "to": "DE89 3704 0044", "from": "savings"}, conversation)
    assert sources == {
        "amount": Source("tool", "getBalance"),
        "to": Source("tool", "lookupAccount"),
        "from": Source("human"),
    }


def test_what_only_the_model_said_is_the_models_own() -> None:
    """The agent's own words are not a source: an injected value the model repeats is still
    nobody's but the model's."""
    conversation = (
        human_message("pay the invoice", by="U1", at=AT),
        model(Part(text="I will pay account 99999."), calling("transferMoney", {"to": "99999"})),
    )
    assert origins({"to": "99999"}, *conversation) == {"to": "model"}


def test_nested_values_are_traced_and_provenance_mirrors_the_arguments() -> None:
    said = human_message("ship 3 of sku A-1 to Berlin", by="U1", at=AT)
    args = {"items": [{"sku": "A-1", "qty": 3}, {"sku": "B-2", "qty": 2}], "city": "Berlin"}
    sources = trace(args, [said])
    assert sources["items.0.sku"] == Source("human") and sources["items.1.sku"].origin == "model"
    assert as_provenance(args, sources) == {
        "items": [{"sku": "human", "qty": "human"}, {"sku": "model", "qty": "model"}],
        "city": "human",
    }
    assert as_provenance(args, {}) == {"items": [{}, {}]}  # nothing recorded: nothing claimed


def test_the_context_quotes_the_first_and_latest_human_messages_and_the_agents_words() -> None:
    long = "x" * (SAID_MAX + 20)
    conversation = [
        human_message("I need to pay rent", by="UALICE", at=AT),
        model(Part(text="Which account?")),
        human_message(long, by="UBOB", at=AT),
        model(
            Part(text="Paying rent "),
            Part(text="now."),
            calling("transferMoney", {"amount": 900, "to": "1"}, ref="r9"),
        ),
    ]
    c = call_context(conversation, "r9", {"amount": 900, "to": "1"})
    assert c.first is not None and (c.first.text, c.first.by, c.first.at) == (
        "I need to pay rent",
        "UALICE",
        AT,
    )
    assert c.latest is not None and c.latest.by == "UBOB"
    assert (len(c.latest.text), c.latest.length) == (SAID_MAX, SAID_MAX + 20)
    assert c.agent is not None and c.agent.text == "Paying rent now."
    assert c.sources["amount"].origin == "model"
    # One message: no "latest" apart from the first; no words before a bare call.
    single = call_context([*conversation[:1], model(calling("x", {}, ref="r1"))], "r1", {})
    assert single.latest is None and single.agent is None
    assert call_context([], "r1", {"a": "b"}).sources == {}  # no conversation seen: no claims


def test_the_conversation_summarises_tool_calls_and_results_and_keeps_the_last_twenty() -> None:
    messages = [human_message(f"message {i}", by="U1", at=AT) for i in range(25)]
    messages += [
        model(Part(text="Checking."), calling("getBalance", {"account": "a" * 1000})),
        result("getBalance", {"balance": 5}),
    ]
    lines = conversation_lines(messages)
    assert len(lines) == 20 and lines[0].text == "message 7"
    assert lines[-2].kind == "agent" and lines[-2].text.startswith("Checking.\n→ calls getBalance")
    assert len(lines[-2].text) < 400  # the call's input summarised
    assert (lines[-1].kind, lines[-1].text) == ("tool", 'getBalance returned {"balance": 5}')
    assert (lines[0].by, lines[0].at) == ("U1", AT)


def test_a_files_content_is_not_a_persons_words() -> None:
    """The Filesystem middleware hands the model a file as a user-role message: what it says
    is a tool's result (prompt injection lives in files), never the employee's."""
    conversation = [
        human_message("pay the invoice in invoice.txt", by="U1", at=AT),
        Message(role="user", content=[Part(text='<read_file path="invoice.txt">\nIBAN 99999\n')]),
    ]
    assert trace({"to": "99999"}, conversation) == {"to": Source("tool", "read_file")}
    context = call_context(conversation, "r1", {"to": "99999"})
    assert context.first is not None and context.first.text.startswith("pay the invoice")
    assert context.latest is None  # the file is not a later human message
    lines = conversation_lines(conversation)
    assert [line.kind for line in lines] == ["human", "tool"]
    assert lines[1].text.startswith("(not from a person)")


# The index against the search it replaced: the whole text normalised and joined, its words
# and numbers read in one pass, values found as whole words (main before the index, issue 21
# section 7). Conversations grow and lose their oldest text to the cap turn by turn, as a
# thread does, so each index is derived from the previous one kept by the process.
_TOKENS = ["pay", "ACME", "acme corp", "Corp.", "12", "12345", "1,500.00", "1500", "0.50"]
_TOKENS += ["INV-7", "inv-7x", "_x", "a_x", "x_", "-", "é", "ÉTÉ", "١٢", "(", "ok"]
_words = st.lists(st.sampled_from(_TOKENS), max_size=6)
_text = st.builds(
    lambda words, spaces: "".join(w + s for w, s in zip(words, spaces, strict=False)),
    _words,
    st.lists(st.sampled_from([" ", "  ", "\n", "", ","]), min_size=6, max_size=6),
)
_message = st.one_of(
    st.builds(lambda t: human_message(t, by="U1", at=AT), _text),
    st.builds(lambda t: result("lookup", {"note": t, "n": 1500}), _text),
    st.builds(lambda t: result("other", [t, 12]), _text),
    st.builds(lambda t: Message(role="user", content=[Part(text="<read_file " + t)]), _text),
)
_value = st.one_of(
    st.sampled_from(_TOKENS),
    _text.filter(str.strip),
    st.sampled_from([12, 1500, 1500.0, 0.5, -12, 7]),
)


def _reference(args: Mapping[str, object], conversation: list[Message]) -> dict[str, Source]:
    def haystack(texts: list[str]) -> tuple[str, set[str], set[Decimal]]:
        kept, size = [], 0
        for t in reversed(texts):
            if size >= context.TRACE_TEXT_MAX:
                break
            kept.append(t[-(context.TRACE_TEXT_MAX - size) :])
            size += len(kept[-1])
        kept.reverse()
        normal = [" ".join(t.casefold().split()) for t in kept]
        words = {w for t in normal for w in re.findall(r"\w+", t)}
        raw = {n for t in kept for n in context._NUMBER.findall(t)}
        numbers = {abs(Decimal(r.translate(context._SEPARATORS))) for r in raw}
        return " \n ".join(normal), words, numbers

    def has(found: tuple[str, set[str], set[Decimal]], value: str | int | float) -> bool:
        text, words, numbers = found
        if not isinstance(value, str):
            return abs(Decimal(str(value))) in numbers
        needle = " ".join(value.casefold().split())
        number = context._NUMBER.fullmatch(needle)
        if number and abs(Decimal(needle.translate(context._SEPARATORS))) in numbers:
            return True
        if not all(w in words for w in re.findall(r"\w+", needle)):
            return False
        for m in re.finditer(re.escape(needle), text):
            before, after = text[m.start() - 1 : m.start()], text[m.end() : m.end() + 1]
            wordy = re.compile(r"\w")
            if not (needle[0].isalnum() and wordy.match(before)) and not (
                needle[-1].isalnum() and wordy.match(after)
            ):
                return True
        return False

    humans = [
        "".join(p.text or "" for p in m.content)
        for m in conversation
        if m.role == "user" and m.metadata
    ]
    results = [
        (p.tool_response.name, haystack(context._strings(p.tool_response.output)))
        for m in conversation
        if m.role == "tool"
        for p in m.content
        if p.tool_response is not None
    ] + [
        ("read_file", haystack(["".join(p.text or "" for p in m.content)]))
        for m in conversation
        if m.role == "user" and not m.metadata
    ]
    human, sources = haystack(humans), {}
    for path, value in context.leaves(args):
        if has(human, value):
            sources[path] = Source("human")
            continue
        tool = next((name for name, h in reversed(results) if has(h, value)), None)
        sources[path] = Source("tool", tool) if tool else Source("model")
    return sources


@settings(max_examples=150, deadline=None)
@given(
    turns=st.lists(st.lists(_message, min_size=1, max_size=4), min_size=1, max_size=5),
    values=st.lists(_value, min_size=1, max_size=8),
    cap=st.sampled_from([30, 80, 2 * 1024 * 1024]),
)
@example(  # "_x y" is in "a_x y": an edge "_" is not checked for the word going on
    turns=[[human_message("a_x y", by="U1", at=AT), human_message("_x", by="U1", at=AT)]],
    values=["_x y"],
    cap=2 * 1024 * 1024,
)
def test_the_index_finds_what_searching_the_whole_text_finds(
    turns: list[list[Message]], values: list[str | int | float], cap: int
) -> None:
    context.RECENT.clear()
    args = {f"v{i}": v for i, v in enumerate(values)}
    conversation: list[Message] = []
    with patch.object(context, "TRACE_TEXT_MAX", cap):
        for added in turns:
            conversation += added
            assert trace(args, conversation) == _reference(args, conversation)


def test_a_turn_reads_only_the_messages_that_are_new_to_the_process() -> None:
    context.RECENT.clear()
    thread = [human_message(f"message {i} of a long thread", by="U1", at=AT) for i in range(30)]
    thread[0] = human_message("a long first message " * 1000, by="U1", at=AT)  # kept: big
    read: list[str] = []
    analyse = context._Piece.of

    def reading(text: str) -> context._Piece:
        read.append(text)
        return analyse(text)

    with patch.object(context._Piece, "of", staticmethod(reading)):
        assert trace({"n": "message 3"}, thread) == {"n": Source("human")}
        assert len(read) == 30 and context.RECENT_MIN < len(thread[0].text) < 30_000
        read.clear()
        thread.append(human_message("yes, pay 1,500", by="U1", at=AT))
        assert trace({"n": "message 3", "amount": 1500}, thread) == {
            "n": Source("human"),
            "amount": Source("human"),
        }
        assert read == ["yes, pay 1,500"]
        with patch.object(context, "TRACE_TEXT_MAX", 20_000):  # the first one is cut to fit
            assert trace({"n": "message 3"}, thread) == {"n": Source("human")}
            read.clear()
            thread.append(human_message("and 2,000 more", by="U1", at=AT))
            assert trace({"n": "message 28"}, thread) == {"n": Source("human")}
        new, cut = sorted(read, key=len)
        assert new == "and 2,000 more" and thread[0].text.endswith(cut) and len(cut) < 20_000


def test_a_process_keeps_no_small_index() -> None:
    """Read again in a few milliseconds: kept, it would only grow memory with the threads."""
    kept = context._Recent(limit=1000, smallest=10)
    small, big = context._EMPTY.changed({"yes"}), context._EMPTY.changed({"a" * 10})
    kept.keep("yes", small, replacing=("", context._EMPTY))
    kept.keep("a" * 10, big, replacing=("", context._EMPTY))
    assert kept.near(["yes", "a" * 10]) == [("a" * 10, big)]


def test_the_indexes_a_process_keeps_are_bounded() -> None:
    """Kept by their latest text, a few under each, up to a number of characters."""
    kept = context._Recent(limit=25, per_text=2)
    nothing = ("", context._EMPTY)

    def build(latest: str, texts: set[str], base: tuple[str, Any] = nothing) -> Any:
        haystack = base[1].changed(texts)
        kept.keep(latest, haystack, replacing=base)
        return haystack

    build("a" * 10, {"a" * 10})
    b, c = build("b" * 10, {"b" * 10}), build("c" * 10, {"c" * 10})
    assert kept.near(["a" * 10]) == []  # out: over 25 characters, the least recently used
    assert kept.near(["b" * 10, "c" * 10]) == [("b" * 10, b), ("c" * 10, c)]
    d = build("d", {"c" * 10, "d"}, base=("c" * 10, c))  # c's thread's next turn
    assert kept.near(["c" * 10]) == [] and kept.near(["d"]) == [("d", d)]  # superseded
    # Threads whose latest message is the same: two kept under it.
    _, y2, y3 = (build("yes", {t, "yes"}) for t in "xzw")
    assert kept.near(["yes"]) == [("yes", y3), ("yes", y2)]


async def test_a_small_conversation_is_traced_on_the_loop_as_a_thread_would_trace_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two trips to a worker thread cost more than tracing a few words (agent/approval.py
    `INLINE_TRACE`); the answer is the same either way, and a conversation with a tool's
    result, or longer, still goes to the thread."""
    said = human_message("send 1,500 to acct 12345", by="U1", at=AT)
    small = [said, model(calling("transferMoney", {"amount": 1500, "toAccount": "12345"}))]
    big = [human_message("x" * (approval.INLINE_TRACE + 1), by="U1", at=AT), *small]
    fed = [said, result("lookup", {"acct": "12345"}), small[1]]
    assert [approval._small(c) for c in (small, big, fed)] == [True, False, False]
    args = {"amount": 1500, "toAccount": "12345"}

    async def traced(conversation: list[Message]) -> Context:
        scope = TurnScope(team_id="T1", requester="U1", conversation=list(conversation))
        return await approval.context_of(scope, "r1", args)

    inline = await traced(small)
    monkeypatch.setattr(approval, "INLINE_TRACE", 0)  # now it goes to the thread
    assert not approval._small(small)
    assert await traced(small) == inline
    assert inline.sources == {"amount": Source("human"), "toAccount": Source("human")}
