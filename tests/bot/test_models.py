"""Model resilience through the running service: Retry, Fallback and an outage, as the
employee sees them, with the fake Gemini failing on cue behind the real plugin."""

from __future__ import annotations

import os

import pytest

from bot.messages import MODEL_UNAVAILABLE
from bot.server import Service
from bot.settings import ConfigError, load_settings
from tests.bot.conftest import DM, SlackClient, new_ts, settle
from tests.bot.test_e2e import REQUESTER, said, text_of, thread_posts
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, text
from tests.fakes.slack_api import FakeSlack

PRIMARY = "gemini-flash-latest"  # AGENT_MODEL's, googleai/ stripped
FALLBACK = "gemini-2.5-flash"


async def replied(fake_slack: FakeSlack, text: str) -> None:
    """Wait until the DM shows `text` (a streamed reply, or the placeholder replaced)."""
    await said(fake_slack, text, DM)


@pytest.mark.parametrize("service_overrides", [{"AGENT_MODEL_RETRIES": 2}])
async def test_a_503_is_retried_and_the_employee_gets_the_reply(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    gemini.fail(1, status=503)
    gemini.script(text("Here you are."))
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "hello", ts=ts))[0] == 200
    await replied(fake_slack, "Here you are.")
    assert len(gemini.generate_requests(PRIMARY)) == 2  # the 503, then the retry


@pytest.mark.parametrize(
    "service_overrides",
    [{"AGENT_MODEL_RETRIES": 1, "AGENT_FALLBACK_MODELS": [f"googleai/{FALLBACK}"]}],
)
async def test_a_primary_that_keeps_failing_falls_back(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str
) -> None:
    gemini.fail(1000, status=503, model=PRIMARY)
    gemini.script(text("From the fallback."), model=FALLBACK)
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "hello", ts=ts))[0] == 200
    await replied(fake_slack, "From the fallback.")
    assert len(gemini.generate_requests(PRIMARY)) == 2  # tried, retried once, then replaced
    [fallback] = gemini.generate_requests(FALLBACK)
    assert fallback.json is not None and fallback.json["contents"][-1]["parts"][0]["text"]


@pytest.mark.parametrize("service_overrides", [{"AGENT_MODEL_RETRIES": 2}])
async def test_an_outage_is_one_short_reply_and_frees_the_thread(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    gemini.fail(1000, status=503)
    ts = new_ts()
    assert (await client.dm(team, REQUESTER, "hello", ts=ts))[0] == 200
    await replied(fake_slack, MODEL_UNAVAILABLE)
    await settle(service)
    assert len(gemini.generate_requests()) == 3  # the call and its two retries
    assert len(thread_posts(fake_slack, ts)) == 1  # the placeholder, replaced: one reply
    assert [text_of(c) for c in fake_slack.calls_to("chat.update")] == [MODEL_UNAVAILABLE]

    gemini.fail(0)  # the model is back: the same thread takes the next message
    gemini.script(text("Back."))
    follow_up = sp.message_im_event(team, REQUESTER, DM, "again", new_ts(), thread_ts=ts)
    assert (await client.send(follow_up))[0] == 200
    await replied(fake_slack, "Back.")


# -- settings --------------------------------------------------------------------------------

SERVING = {
    "SLACK_BOT_TOKEN": "xoxb-1",
    "SLACK_SIGNING_SECRET": "s",
    "APPROVER_CHANNEL": "C0APPROVE",
}


def problems(monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    """What `python -m bot` would refuse to start with, from this environment alone."""
    for name in list(os.environ):
        if name.startswith(("SLACK_", "GEMINI_", "AGENT_", "OPENAI_", "ANTHROPIC_", "OLLAMA_")):
            monkeypatch.delenv(name)
    for name, value in {**SERVING, **env}.items():
        monkeypatch.setenv(name, value)
    try:
        load_settings(serving=True)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"AGENT_MODEL": "mistral/large"}, "AGENT_MODEL: 'mistral/large' is not a model id"),
        ({"AGENT_MODEL": "gemini-flash-latest"}, "AGENT_MODEL: 'gemini-flash-latest' is not"),
        (
            {"GEMINI_API_KEY": "k", "AGENT_FALLBACK_MODELS": "googleai/x, bedrock/y"},
            "AGENT_FALLBACK_MODELS: 'bedrock/y' is not a model id",
        ),
    ],
)
def test_an_unknown_model_prefix_is_a_validation_error(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    found = problems(monkeypatch, **env)
    assert any(p.startswith(named) for p in found), found
    assert any("googleai/…, vertexai/…, anthropic/…, openai/…, ollama/…" in p for p in found)


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        ({"AGENT_MODEL": "anthropic/claude-sonnet-4-5"}, "ANTHROPIC_API_KEY is not set"),
        ({"AGENT_MODEL": "openai/gpt-4o"}, "OPENAI_API_KEY is not set"),
        (  # a fallback needs its key as much as the primary
            {"GEMINI_API_KEY": "k", "AGENT_FALLBACK_MODELS": "openai/gpt-4o"},
            "OPENAI_API_KEY is not set (needed for openai/gpt-4o)",
        ),
    ],
)
def test_the_chosen_providers_key_is_required(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], missing: str
) -> None:
    assert [p for p in problems(monkeypatch, **env) if missing in p]


@pytest.mark.parametrize(
    "env",
    [
        {"AGENT_MODEL": "ollama/llama3.2", "OLLAMA_SERVER_ADDRESS": "http://127.0.0.1:11434"},
        {"AGENT_MODEL": "vertexai/gemini-2.5-flash"},  # Google's ADC, no key of ours
        {"AGENT_MODEL": "anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY": "k"},
        {"AGENT_MODEL": "openai/m", "OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://h/v1"},
    ],
)
def test_providers_configured_as_documented_start(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    assert problems(monkeypatch, **env) == []


def test_addresses_must_be_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    found = problems(
        monkeypatch,
        GEMINI_API_KEY="k",
        OPENAI_BASE_URL="localhost:8000",
        OLLAMA_SERVER_ADDRESS="ollama:11434",
    )
    assert {p.split(":")[0] for p in found} == {"OPENAI_BASE_URL", "OLLAMA_SERVER_ADDRESS"}
