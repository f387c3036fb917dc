"""storage/redaction.py: what a request shows of its redacted fields, and what the tool gets."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from storage.domain import Context, Request, Said
from storage.redaction import Secret, hide, masked, reveal, scrub, scrubbed, tampered

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CALL: dict[str, Any] = {
    "user": "bob",
    "auth": {"password": "hunter22", "otp": 123456},
    "items": [{"password": 7}],
}


def test_keys_are_hidden_at_any_depth_and_put_back_for_the_tool() -> None:
    shown, secrets = hide(CALL, ("password",))
    assert shown == {
        "user": "bob",
        "auth": {"password": "•••• (8 characters)", "otp": 123456},
        "items": [{"password": "•••• (1 character)"}],
    }
    assert [s.name for s in secrets] == ["auth.password", "items.0.password"]
    assert reveal(shown, secrets) == CALL
    assert CALL["auth"]["password"] == "hunter22"  # the caller's input is left alone
    again, kept = hide(shown, ("password",), secrets)  # hidden before: the same secrets
    assert again == shown and kept == secrets


def test_an_edit_may_keep_a_mask_but_not_change_remove_or_add_one() -> None:
    shown, secrets = hide(CALL, ("password",))
    assert tampered(shown | {"user": "eve"}, ("password",), secrets) == []
    moved = shown | {"auth": {"password": "mine", "otp": 1}}
    assert tampered(moved, ("password",), secrets) == ["auth.password"]
    gone = shown | {"items": []}
    assert tampered(gone, ("password",), secrets) == ["items.0.password"]
    added = shown | {"extra": {"password": "x"}}
    assert tampered(added, ("password",), secrets) == ["extra.password"]


def test_free_text_loses_the_values_and_equal_values_have_equal_digests() -> None:
    secrets = (Secret(("password",), "hunter22"), Secret(("pin",), 12), Secret(("x",), "ab"))
    assert scrub("it is hunter22, pin 12, ab", secrets) == "it is •••• (8 characters), pin 12, ab"
    assert Secret(("a",), "s3cret!").sha256 == Secret(("b",), "s3cret!").sha256
    assert Secret(("a",), "s3cret!").sha256 == hashlib.sha256(b"s3cret!").hexdigest()
    result = {"echo": 'said "hunter22"', "password": "other"}
    assert scrubbed(result, ("password",), secrets) == {
        "echo": 'said "•••• (8 characters)"',
        "password": masked("other"),
    }


def test_a_request_made_with_redacted_fields_shows_only_masks() -> None:
    r = Request(
        tool="login",
        ref="r1",
        input={"user": "bob", "password": "hunter22"},
        requester="U1",
        why="",
        requested_at=NOW,
        expires_at=NOW,
        preview="Logs in bob with hunter22",
        context=Context(first=Said("my password is hunter22", 23)),
        redact=("password",),
    )
    assert r.input == {"user": "bob", "password": "•••• (8 characters)"}
    assert r.actual == {"user": "bob", "password": "hunter22"}
    assert r.preview == "Logs in bob with •••• (8 characters)"
    assert r.context.first is not None and "hunter22" not in r.context.first.text
    assert "hunter22" not in repr(r)
