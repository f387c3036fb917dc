"""Model ids, their plugins, and a resume that the model fails: the agent's side."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from genkit import GenkitError
from genkit.exp import Genkit
from genkit.model import ModelRequest, ModelResponse
from genkit.plugin_api import ActionKind

from agent.gemini import model_session
from agent.models import Credentials, ModelPluginError, Resilience, plugins
from agent.outcomes import AwaitingApproval, Failed, Resumed
from agent.turns import MAX_RESUME_ATTEMPTS, RETRY_DELAY
from storage.db import SessionFactory
from tests.agent.conftest import IN_CHANNEL, NO_RETRY, harness
from tests.fakes.gemini import FakeGemini, text
from tests.fakes.scripted_model import calls


def down(request: ModelRequest[Any]) -> ModelResponse:
    raise GenkitError(status="UNAVAILABLE", message="overloaded")


async def test_a_resume_the_model_fails_retries_then_says_the_model_is_unavailable(
    pg_sessions: SessionFactory, team: str, ledger: Any
) -> None:
    """The approved tool runs once; each later attempt fails on the model, the last says so."""
    h = harness(pg_sessions, team, NO_RETRY)
    h.model.script(calls(("transferMoney", {"amount": 5, "toAccount": "1"})))
    h.model.script(*[down] * MAX_RESUME_ATTEMPTS)
    out = await h.workflow.turns.start(h.thread(), "U_EMP", "send 5 to 1")
    assert isinstance(out, AwaitingApproval)
    [approval] = out.approvals
    await h.workflow.decisions.decide(h.team, approval.id, "U_BOSS", approve=True, facts=IN_CHANNEL)

    outcomes: list[Resumed] = []
    first = await h.workflow.turns.resume(approval.turn_id)
    assert first is not None
    outcomes.append(first)
    while len(outcomes) < MAX_RESUME_ATTEMPTS:
        h.clock.advance(seconds=RETRY_DELAY.total_seconds() + 1)
        outcomes += (await h.workflow.follow_ups.sweep(h.team)).resumed
    thread = h.thread()
    assert [r.outcome for r in outcomes] == [
        Failed(thread, retrying=True, model_unavailable=True),
        Failed(thread, retrying=True, model_unavailable=True),
        Failed(thread, retrying=False, model_unavailable=True),
    ]
    assert len(h.ledger()) == 1  # the tool ran in the first resume only
    assert h.model.replies == []


def test_a_plugin_is_made_only_for_the_prefixes_in_use() -> None:
    made = plugins(
        ["openai/gpt-4o", "ollama/llama3.2", "openai/gpt-4o-mini", "scripted"],
        Credentials(openai_api_key="k", ollama_server_address="http://127.0.0.1:1"),
    )
    assert [p.name for p in made] == ["openai", "ollama"]


@pytest.mark.parametrize(
    ("model", "credentials"),
    [
        ("anthropic/claude-sonnet-4-5", Credentials(anthropic_api_key="k")),
        ("openai/gpt-4o", Credentials(openai_api_key="k", openai_base_url="http://127.0.0.1:1")),
        ("ollama/llama3.2", Credentials(ollama_server_address="http://127.0.0.1:1")),
        ("googleai/gemini-2.5-flash", Credentials(gemini_api_key="k")),
    ],
)
async def test_each_provider_resolves_its_models_without_a_network_call(
    model: str, credentials: Credentials
) -> None:
    ai = Genkit(plugins=plugins([model], credentials))
    assert await ai.registry.resolve_action(ActionKind.MODEL, model) is not None


def test_a_plugin_that_is_not_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "genkit_ollama", None)  # as if absent
    with pytest.raises(ModelPluginError, match=r"pip install 'greenlight\[ollama\]'"):
        plugins(["ollama/llama3.2"], Credentials())


def test_retry_sits_inside_fallback() -> None:
    """Fallback wraps Retry: the primary is retried first, then each fallback is tried."""
    mounted = Resilience(retries=2, delay_seconds=0.5, fallbacks=("ollama/x",)).middleware()
    assert [type(m).__name__ for m in mounted] == ["Fallback", "Retry"]
    retry = mounted[1].config
    assert (retry.max_retries, retry.initial_delay_ms, retry.no_jitter) == (2, 500, False)
    assert Resilience(retries=0).middleware() == []


PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there


async def test_google_ai_reads_its_proxy_from_the_environment_when_its_session_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not at each call (two trips to a worker thread before each, with google-genai's own
    session): a proxy set later is not used; one set before the session is."""
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    gemini_model = "googleai/gemini-2.5-flash"
    async with FakeGemini() as gemini:
        gemini.script(text("direct"), text("still direct"))
        credentials = Credentials(gemini_api_key="k", gemini_api_url=gemini.base_url)
        async with model_session(gemini.base_url) as http:
            ai = Genkit(plugins=plugins([gemini_model], credentials, http))
            assert (await ai.generate(model=gemini_model, prompt="hi")).text == "direct"
            monkeypatch.setenv("HTTP_PROXY", DEAD_PROXY)
            assert (await ai.generate(model=gemini_model, prompt="hi")).text == "still direct"
        async with model_session(gemini.base_url) as http:  # made with the proxy set
            ai = Genkit(plugins=plugins([gemini_model], credentials, http))
            failed = await ai.generate(model=gemini_model, prompt="hi")  # refused there
            assert (failed.finish_reason, failed.text) == ("failed", "")
        assert len(gemini.generate_requests()) == 2
