"""What led to a call (issue 17): the request, the agent's words, where each value came from."""

from __future__ import annotations

from datetime import UTC, datetime

from genkit import Message, Part, ToolRequest, ToolResponse

from agent.context import (
    SAID_MAX,
    as_provenance,
    call_context,
    conversation_lines,
    human_message,
    trace,
)
from storage.domain import Source

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
