"""Block Kit rendering: nothing untrusted can ping anyone, and Slack's limits always hold."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

from agent.context import Line
from agent.outcomes import Busy
from bot import block_kit, messages, modals, refusals, safe_text, terminal
from bot.card import approval_card
from storage.domain import (
    Approval,
    Approved,
    Card,
    Context,
    Denied,
    Expired,
    Finished,
    History,
    NotStarted,
    Request,
    Said,
    Source,
    Started,
    Thread,
    Withdrawn,
)

NOW = datetime(2025, 3, 4, 12, 0, tzinfo=UTC)
NASTY = "<!channel> <!here> <@U999> <!subteam^S1> & <https://evil.example|click>"
CONTROL = re.compile(r"<[^>]*>")  # mentions, links, dates: anything Slack interprets
REQUEST = Request(
    tool="send_payment",
    ref="ref-1",
    input={"to": "ACME", "amount": 12},
    requester="U111",
    why="Moves money.",
    requested_at=NOW,
    expires_at=NOW + timedelta(hours=1),
)
DESCRIPTION = "Sends money to a vendor."
DECIDED_AT = NOW + timedelta(minutes=5)


def info(
    *,
    id: str = "ap-1",
    decision: Approved | Denied | Expired | Withdrawn | None = None,
    execution: NotStarted | Started | Finished | None = None,
    card_channel: str = "C0APPROVE",
    **request: Any,
) -> Approval:
    """A pending approval like the workflow hands out; `request` overrides REQUEST's fields."""
    return Approval(
        id=id,
        turn_id="turn-1",
        thread=Thread("T1", "D1", "1700000000.000100"),
        request=dataclasses.replace(REQUEST, **request),
        decision=decision,
        execution=execution or NotStarted(),
        card=Card(card_channel),
    )


def decided(kind: str, *, reason: str | None = None, **over: Any) -> Approval:
    decisions: dict[str, Approved | Denied | Expired | Withdrawn] = {
        "approved": Approved("U222", DECIDED_AT, reason),
        "denied": Denied("U222", DECIDED_AT, reason),
        "expired": Expired(DECIDED_AT),
        "withdrawn": Withdrawn("U111", DECIDED_AT),
    }
    return info(decision=decisions[kind], **over)


def render(a: Approval, *, description: str = DESCRIPTION, **kw: Any) -> dict[str, Any]:
    kw.setdefault("thread_link", None)
    return approval_card(a, description=description, now=NOW, **kw)


def strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in strings(v)]
    return []


def mentions(obj: Any) -> set[str]:
    """Every Slack control sequence, dates excepted (they never notify anyone)."""
    return {m for s in strings(obj) for m in CONTROL.findall(s) if not m.startswith("<!date^")}


def validate(message: dict[str, Any]) -> None:
    """slack_sdk's own validators, plus the limits it does not check itself."""
    assert message["text"] and len(message["text"]) <= 40000
    assert len(message.get("blocks", [])) <= 50
    for raw in message.get("blocks", []):
        block = Block.parse(raw)
        assert block is not None
        block.validate_json()
        for field in raw.get("fields", []):
            assert len(field["text"]) <= 2000
        for el in raw.get("elements", []):
            if el.get("type") in ("mrkdwn", "plain_text"):
                assert len(el["text"]) <= 3000


NASTY_REQUEST: dict[str, Any] = {
    "tool": "tool<!channel>",
    "input": {f"key {NASTY}": f"value {NASTY}", "nested": {"x": [NASTY]}},
    "why": f"why {NASTY}",
}


def nasty_approval() -> Approval:
    return info(**NASTY_REQUEST)


@pytest.mark.parametrize("text", ["<!channel>", "<@U123>", "<!subteam^S1>", "a & b"])
def test_escape(text: str) -> None:
    out = safe_text.escape(text)
    assert "<" not in out and ">" not in out
    assert out.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") == text


def test_card_escapes_everything_untrusted() -> None:
    shown = render(
        nasty_approval(), description=f"desc {NASTY}", thread_link="https://x.slack.com/a?b=1&c=2"
    )
    validate(shown)
    assert mentions(shown) == {
        "<@U111>",
        "<https://x.slack.com/a?b=1&amp;c=2|View the conversation>",
    }
    assert "&lt;!channel&gt;" in json.dumps(shown)


@pytest.mark.parametrize("kind", ["approved", "denied"])
def test_decided_card_mentions_only_people(kind: str) -> None:
    shown = render(decided(kind, reason=NASTY, **NASTY_REQUEST), description=NASTY)
    validate(shown)
    assert mentions(shown) == {"<@U111>", "<@U222>"}


def test_bad_ids_and_links_are_not_trusted() -> None:
    a = info(requester="<!channel>", card_channel="<!here>")
    assert mentions(render(a, thread_link="javascript:alert(1)|x")) == set()
    note = messages.requester_note(a, card_link="https://evil|<!channel>")
    assert mentions(note) == set()


def test_pending_card_layout() -> None:
    card = render(info(), thread_link="https://t.slack.com/p1")
    validate(card)
    header, *_ = card["blocks"]
    assert header == {
        "type": "header",
        "text": {"type": "plain_text", "text": "Approval needed: send_payment"},
    }
    fields = next(b["fields"] for b in card["blocks"] if "fields" in b)
    assert [f["text"] for f in fields] == ["*to*\nACME", "*amount*\n12"]
    actions = [b for b in card["blocks"] if b["type"] == "actions"]
    assert [a["block_id"] for a in actions] == ["request", "approval"]
    assert [b["action_id"] for b in actions[0]["elements"]] == ["show_conversation"]
    *buttons, menu = actions[1]["elements"]
    assert [(b["action_id"], b["value"], b.get("style")) for b in buttons] == [
        ("approve", "ap-1~1", "primary"),
        ("edit_approve", "ap-1~1", None),
        ("deny", "ap-1~1", "danger"),
    ]
    assert (menu["type"], menu["action_id"]) == ("overflow", "approve_menu")
    assert [(o["text"]["text"], o["value"]) for o in menu["options"]] == [
        ("Approve with note", "note:ap-1~1"),
        ("Show conversation", "conversation:ap-1"),
    ]
    assert "Full input" not in json.dumps(card)  # nothing was shortened
    assert f"<!date^{int((NOW + timedelta(hours=1)).timestamp())}^" in json.dumps(card)


def test_long_value_is_shortened_and_full_json_shown() -> None:
    card = render(info(input={"body": "x" * 5000, "n": 1}))
    validate(card)
    fields = next(b["fields"] for b in card["blocks"] if "fields" in b)
    assert fields[0]["text"].endswith("… _(shortened: 5,000 characters in all)_")
    assert len(fields[0]["text"]) < 2000
    full = [
        b["text"]["text"]
        for b in card["blocks"]
        if "Full input" in b.get("text", {}).get("text", "")
    ]
    assert len(full) == 1 and "```" in full[0] and "truncated" in full[0]


def test_many_keys_are_summarised_with_full_json() -> None:
    data = {f"k{i}": i for i in range(15)}
    card = render(info(input=data))
    validate(card)
    fields = next(b["fields"] for b in card["blocks"] if "fields" in b)
    assert len(fields) == 10 and "6 more keys" in fields[-1]["text"]
    full = next(
        b["text"]["text"]
        for b in card["blocks"]
        if "Full input" in b.get("text", {}).get("text", "")
    )
    assert '"k14": 14' in full and "truncated" not in full


def test_huge_input_respects_every_limit() -> None:
    big = "<!channel>&" * 10_000  # ~110 KB, escaping makes it longer still
    data: dict[str, Any] = {f"{'k' * 300}{i}": big for i in range(1000)}
    for a in (
        info(input=data, tool="t" * 300, why=big),
        decided("denied", input=data, reason=big),
    ):
        card = render(a, description=big)
        validate(card)
        assert mentions(card) <= {"<@U111>", "<@U222>"}
        note = messages.requester_note(a, card_link=None)
        assert len(note["text"]) < 1000 and mentions(note) == {"<#C0APPROVE>"}


def test_full_json_cannot_close_the_code_block() -> None:
    card = render(info(input={"a": "```<!here>```", "b": "y" * 400}))
    full = next(
        b["text"]["text"]
        for b in card["blocks"]
        if "Full input" in b.get("text", {}).get("text", "")
    )
    assert full.count("```") == 2


def test_decided_states_have_no_buttons() -> None:
    cases = {
        "approved": "✅ Approved by <@U222> at <!date^",
        "denied": "❌ Denied by <@U222> at <!date^",
        "expired": "⌛ Expired at <!date^",
        "withdrawn": "↩️ Withdrawn by <@U111>, who asked for it, at <!date^",
    }
    for status, start in cases.items():
        card = render(decided(status, reason="too pricey"))
        validate(card)
        assert all(b.get("block_id") != "approval" for b in card["blocks"])
        last = card["blocks"][-1]["text"]["text"]
        assert last.startswith(start), last
    denied = render(decided("denied", reason="too pricey"))
    assert denied["blocks"][-1]["text"]["text"].endswith(": too pricey")
    expired = render(decided("expired"))
    assert "denied automatically" in expired["blocks"][-1]["text"]["text"]
    withdrawn = render(decided("withdrawn"))
    assert withdrawn["blocks"][0]["text"]["text"] == "Withdrawn: send_payment"
    assert withdrawn["blocks"][-1]["text"]["text"].endswith("was withdrawn, so nothing runs")


def test_execution_state_on_approved_card() -> None:
    ran = render(decided("approved", execution=Finished({"ok": True})))
    assert ran["blocks"][-1]["text"]["text"].endswith("Ran.")
    unknown = decided("approved", execution=Started())
    text = render(unknown)["blocks"][-1]["text"]["text"]
    assert "Outcome unknown" in text and "not run again" in text


def test_requester_note() -> None:
    a = info(input={"to": "ACME <!channel>", "amount": 12})
    note = messages.requester_note(a, card_link="https://t.slack.com/archives/C0APPROVE/p1")
    validate(note)
    text = note["text"]
    assert text.startswith(
        "⏳ Waiting for approval in <#C0APPROVE> "
        "(<https://t.slack.com/archives/C0APPROVE/p1|see the request>) "
        "to run `send_payment` (to: ACME &lt;!channel&gt;, amount: 12)"
    )
    assert text.endswith("I'll continue here once someone decides.")
    # Its requester may take it back from here: one Withdraw, naming the request, which
    # Slack asks them to confirm.
    [row] = [b for b in note["blocks"] if b["type"] == "actions"]
    [button] = row["elements"]
    assert (button["text"]["text"], button["action_id"], button["value"]) == (
        "Withdraw",
        "withdraw",
        "ap-1",
    )
    assert button["confirm"]["confirm"]["text"] == "Withdraw"
    # Once withdrawn from the note, the button goes and the note says so.
    after = messages.withdrawn_note(note["blocks"], "ap-1")
    assert "withdraw" not in json.dumps(after).replace("withdrew", "")
    assert "You withdrew this request" in json.dumps(after)
    many = messages.requester_note(
        [
            a,
            info(id="ap-2", tool="delete_user", input={}, card_channel="C0OTHER"),
        ],
        card_links=[None, "https://t.slack.com/y"],
    )
    assert "2 actions" in many["text"]
    assert "`delete_user` (<https://t.slack.com/y|see the request>)" in many["text"]
    assert "<#C0APPROVE> and <#C0OTHER>" in many["text"]
    validate(many)
    # One Withdraw per request, beside what it is.
    rows = [b for b in many["blocks"] if "accessory" in b]
    assert [(b["text"]["text"], b["accessory"]["value"]) for b in rows] == [
        ("`send_payment` (to: ACME &lt;!channel&gt;, amount: 12)", "ap-1"),
        ("`delete_user`", "ap-2"),
    ]
    assert {b["accessory"]["text"]["text"] for b in rows} == {"Withdraw"}
    after = messages.withdrawn_note(many["blocks"], "ap-2")
    assert [b.get("accessory", {}).get("value") for b in after if "text" in b][-2:] == [
        "ap-1",
        None,
    ]
    assert after[-1]["text"]["text"].endswith("↩️ _withdrawn_")
    assert messages.thinking_message()["text"]


def test_reply_message() -> None:
    assert mentions(messages.reply_message(NASTY)) == set()
    long = messages.reply_message("<@U1>" * 20_000)
    assert len(long["text"]) <= 40_000 and "shortened" in long["text"] and mentions(long) == set()
    assert messages.reply_message("   ")["text"]


def test_busy_and_failure_messages() -> None:
    t = Thread("T1", "D1", "1.2")
    assert messages.busy_message(Busy(t))["text"] == "I'm still working on your previous message."
    waiting = messages.busy_message(Busy(t, (info(), info(id="ap-2"))))["text"]
    assert (
        waiting == "Still waiting for approval of `send_payment` — I'll continue when it's decided."
    )
    assert messages.failure_message(False)["text"].endswith("Please try again in a moment.")
    assert messages.failure_message(True)["text"].endswith("I'll retry automatically.")
    unavailable = "The model is unavailable right now. Try again in a few minutes."
    assert messages.failure_message(False, model_unavailable=True) == {"text": unavailable}
    assert messages.failure_message(True, model_unavailable=True)["text"].endswith("automatically.")


def test_refusal_text() -> None:
    assert "someone else" in refusals.refusal_text("self_approval", info())
    assert "`send_payment`" in refusals.refusal_text("not_an_approver", info())
    text = refusals.refusal_text("already_decided", decided("approved"))
    assert text.startswith("Already approved by <@U222> at <!date^")
    assert refusals.refusal_text("already_decided", decided("expired")).startswith(
        "Already expired"
    )
    assert "can't find" in refusals.refusal_text("not_found", None)


def test_deny_modal_validates() -> None:
    modal = modals.deny_modal(nasty_approval())
    View(**modal).validate_json()
    assert modal["private_metadata"] == "ap-1" and modal["callback_id"] == "deny_reason"
    element = modal["blocks"][-1]["element"]
    assert (modal["blocks"][-1]["block_id"], element["action_id"], element["max_length"]) == (
        "reason",
        "reason",
        500,
    )
    assert mentions(modal) == {"<@U111>"}


def test_card_as_text() -> None:
    a = info(input={"to": "A & B <x>", "amount": 12})
    text = terminal.card_as_text(render(a, thread_link="https://t.slack.com/p1"))
    assert "Approval needed: send_payment" in text
    assert "Requested by @U111" in text and "View the conversation (https://t.slack.com/p1)" in text
    assert "to: A & B <x>" in text and "amount: 12" in text
    assert "[ Approve ]  [ Edit & approve ]  [ Deny ]" in text and "2025-03-04T13:00Z" in text
    done = terminal.card_as_text(render(decided("denied", reason="no")))
    assert "Denied by @U222" in done and "[ Approve ]" not in done


def text_objects(obj: Any) -> list[dict[str, Any]]:
    """Every mrkdwn text object in a message or view."""
    if isinstance(obj, dict):
        own = [obj] if obj.get("type") == "mrkdwn" else []
        return own + [t for v in obj.values() for t in text_objects(v)]
    if isinstance(obj, list):
        return [t for v in obj for t in text_objects(v)]
    return []


def test_every_text_object_is_verbatim_so_slack_links_nothing_by_itself() -> None:
    t = Thread("T1", "D1", "1.2")
    sent = [
        render(nasty_approval(), thread_link="https://t.slack.com/p1"),
        render(decided("denied", reason="see https://evil.example #general @here")),
        messages.reply_message("Done. See https://evil.example and #general, @channel"),
        messages.requester_note(info(input={"to": "https://evil.example"})),
        messages.busy_message(Busy(t, (info(),))),
        modals.deny_modal(info()),
    ]
    for message in sent:
        objects = text_objects(message)
        assert objects and all(o.get("verbatim") is True for o in objects), message
    reply = messages.reply_message("x " * 4000)  # longer than one section: split, all verbatim
    validate(reply)
    assert len(reply["blocks"]) == 3 and reply["text"].startswith("x x")


def test_hidden_characters_are_shown_as_escapes_and_flagged() -> None:
    sneaky = "1234\u202e98765"  # a right-to-left override: Slack would show 123456789
    shown = render(info(input={"toAccount": sneaky, "note": "zero\u200bwidth", "ok": "plain"}))
    validate(shown)
    dumped = json.dumps(shown, ensure_ascii=False)
    assert "\u202e" not in dumped and "\u200b" not in dumped
    fields = {
        f["text"].split("\n")[0]: f["text"]
        for f in next(b["fields"] for b in shown["blocks"] if "fields" in b)
    }
    assert "1234\\u202e98765" in fields["*toAccount*"]
    assert "contains hidden characters" in fields["*toAccount*"]
    assert "zero\\u200bwidth" in fields["*note*"] and "hidden" in fields["*note*"]
    assert "hidden" not in fields["*ok*"]
    reply = messages.reply_message("pay 1234\u202e98765")
    assert "1234\\u202e98765" in reply["text"] and "\u202e" not in json.dumps(reply)


def test_look_alike_letters_from_another_alphabet_are_flagged() -> None:
    shown = render(info(input={"payee": "p\u0430ypal", "city": "Москва", "to": "paypal"}))
    fields = {
        f["text"].split("\n")[0]: f["text"]
        for f in next(b["fields"] for b in shown["blocks"] if "fields" in b)
    }
    assert "mixes alphabets" in fields["*payee*"]  # a Cyrillic a (U+0430) among Latin ones
    assert "mixes alphabets" not in fields["*city*"]  # all Cyrillic: a word, not a trick
    assert "mixes alphabets" not in fields["*to*"]


def test_a_whole_word_in_look_alike_letters_of_another_alphabet_is_flagged() -> None:
    cyrillic_ext = "\u0415\u0425\u0422999"  # Cyrillic Ie, Ha, Te: reads as EXT999
    greek_bank = "\u0392\u0391\u039d\u039a"  # Greek Beta, Alpha, Nu, Kappa: BANK
    shown = render(
        info(
            input={"toAccount": cyrillic_ext, "bank": greek_bank, "city": "Москва", "to": "EXT999"}
        )
    )
    fields = {
        f["text"].split("\n")[0]: f["text"]
        for f in next(b["fields"] for b in shown["blocks"] if "fields" in b)
    }
    assert "look-alike letters" in fields["*toAccount*"]
    assert "look-alike letters" in fields["*bank*"]
    assert "look-alike letters" not in fields["*city*"]  # a Russian word: letters of its own
    assert "look-alike letters" not in fields["*to*"]


MARKUP = {
    "bold": "*EXT999*",
    "italic": "_urgent_",
    "strike": "~ACC-1~",
    "code": "`ACC-1`",
    "lines": "ACC-1\n*toAccount*\nEXT999",
    "quote": "> approved by the CFO",
}


def test_values_cannot_restyle_themselves_on_a_card() -> None:
    """A value with mrkdwn markup (or a line break: a forged field of its own) is shown as
    code, where Slack formats nothing; the card's own markup stays the only markup."""
    shown = render(info(input={**MARKUP, "to_*key*": "x", "plain": "ACC-1"}))
    validate(shown)
    fields = next(b["fields"] for b in shown["blocks"] if "fields" in b)
    for field in fields:
        text = field["text"]
        outside = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        key = text.split("\n")[0]
        if key == "*plain*":
            assert text == "*plain*\nACC-1"
            continue
        if key.startswith("```"):  # a key with markup is code too
            assert outside.strip() == "x"
            continue
        assert outside == f"{key}\n", text  # only the key's own bold outside code
        assert MARKUP[key.strip("*")].replace(">", "&gt;") in text
    summary = block_kit.summary({"to": "*EXT999*", "memo": "a `b` c"})
    assert summary == "`to: *EXT999*, memo: a 'b' c`"  # inline code: nothing restyled
    assert block_kit.summary({"to": "ACC-1"}) == "to: ACC-1"


def test_every_invisible_kind_of_character_is_caught() -> None:
    missed = [
        f"U+{code:04X}"
        for code in range(sys.maxunicode + 1)
        if (ch := chr(code)) not in "\n "
        and unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs", "Zl", "Zp", "Zs")
        and not safe_text.has_hidden(ch)
    ]
    assert missed == []
    assert not safe_text.has_hidden("plain text, accents é, 漢字, emoji 🙂\nand lines")


def test_a_value_hidden_after_whitespace_says_how_long_it_is() -> None:
    padded = "12345" + " " * 4000 + "99999"
    shown = render(info(input={"toAccount": padded}))
    fields = next(b["fields"] for b in shown["blocks"] if "fields" in b)
    assert "shortened: 4,010 characters in all" in fields[0]["text"]


def test_the_full_request_shows_every_character_of_a_shortened_card() -> None:
    padded = {"toAccount": "12345" + " " * 4000 + "99999", "memo": "1234\u202e98765"}
    card = render(info(input=padded))
    (show,) = [b for b in card["blocks"] if b.get("block_id") == "request"]
    assert [(e["action_id"], e["value"]) for e in show["elements"]] == [
        ("show_conversation", "ap-1"),
        ("show_request", "ap-1"),
    ]
    assert "99999" not in json.dumps(card)  # the card alone never showed it
    modal = modals.full_request_modal(info(input=padded))
    View(**modal).validate_json()
    shown = "".join(t["text"] for t in text_objects(modal))
    assert shown.count(" ") >= 4000 and "99999" in shown and "1234\\u202e98765" in shown
    assert "contains hidden characters" in shown
    huge = modals.full_request_modal(info(input={"k": "x" * 400_000}))
    View(**huge).validate_json()
    assert len(huge["blocks"]) == modals.MODAL_BLOCKS
    assert "more characters, too many for one Slack view" in json.dumps(huge["blocks"][-1])
    assert "show_request" not in json.dumps(render(info()))  # nothing was cut


def test_what_led_to_the_call_is_quoted_escaped_and_within_limits() -> None:
    worst = "<!channel>\u202e" * 45 + "\n" * 40  # escapes to many times its length
    context = Context(
        first=Said(worst, length=9000, by="UALICE"),
        latest=Said(NASTY, length=len(NASTY), by="<!here>"),
        agent=Said("I will pay <@U999> now.", length=23),
        sources={
            "to": Source("tool", "lookup<!channel>"),
            "amount": Source("model"),
            **{f"to.x{i}": Source("model") for i in range(5)},
        },
        history=History(approved=3, denied=1),
    )
    card = render(info(context=context))
    validate(card)
    assert mentions(card) == {"<@U111>", "<@UALICE>"}  # the requester and the first author
    text = json.dumps(card, ensure_ascii=False)
    assert "shortened: 9,000 characters in all" in text and "\\u202e" in text
    assert "*The agent said before the call:*\\n&gt; I will pay &lt;@U999&gt; now." in text
    to_field, amount_field = next(b["fields"] for b in card["blocks"] if "fields" in b)
    assert "from lookup&lt;!channel&gt;'s result" in to_field["text"]
    assert "…and 4 more" in to_field["text"]
    assert "🔎 _not in the conversation_" in amount_field["text"]
    assert "<@U111>: 3 approved, 1 denied in the last 30 days" in text


def test_the_conversation_pages_fit_a_view_and_lose_nothing() -> None:
    lines = [Line("human", f"m{i} " + "<x> " * 5000, by="UALICE", at=NOW) for i in range(20)]
    lines.append(Line("tool", "getBalance returned {}"))
    pages = modals.conversation_pages(lines)
    assert len(pages) > 1
    shown = ""
    for page in range(len(pages)):
        modal = modals.conversation_modal(info(), pages, page)
        View(**modal).validate_json()
        assert len(modal["blocks"]) <= modals.MODAL_BLOCKS
        assert len(json.dumps(modal)) < 60_000
        assert mentions(modal) <= {"<@U111>", "<@UALICE>"}
        shown += "".join(t["text"] for t in text_objects(modal))
    assert all(f"m{i} " in shown for i in range(20)) and shown.count("&lt;x&gt;") == 20 * 5000
    assert "🔧 getBalance returned {}" in shown
    empty = modals.conversation_modal(info(), modals.conversation_pages([]), 0)
    View(**empty).validate_json()
    assert "Nothing was recorded" in json.dumps(empty)
