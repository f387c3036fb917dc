"""Which Genkit plugin serves a model id, and the middleware that keeps model calls going.

A provider's plugin is imported only when a model id uses its prefix: the others are
optional extras (`pip install 'greenlight[anthropic]'`) that an install may not have.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import ClientSession
    from genkit.middleware import BaseMiddleware


@dataclass(frozen=True)
class Provider:
    module: str  # the plugin's package
    extra: str | None  # greenlight's optional extra that installs it; None: always there


PROVIDERS = {
    "googleai": Provider("genkit_google_genai", None),
    "vertexai": Provider("genkit_google_genai", None),
    "anthropic": Provider("genkit_anthropic", "anthropic"),
    "openai": Provider("genkit_openai", "openai"),
    "ollama": Provider("genkit_ollama", "ollama"),
}


class ModelPluginError(ValueError):
    """A model id's plugin is not installed."""


def provider(model: str) -> str:
    """A model id's prefix: `anthropic` for `anthropic/claude-sonnet-4-5`."""
    return model.partition("/")[0]


def unknown_model(model: str) -> str | None:
    """Why `model` is not an id Greenlight can serve; None when it is."""
    prefix, slash, name = model.partition("/")
    if prefix not in PROVIDERS or not slash or not name.strip():
        known = ", ".join(f"{p}/…" for p in PROVIDERS)
        return f"{model!r} is not a model id Greenlight knows: use one of {known}"
    return None


def plugin_module(prefix: str) -> ModuleType:
    """Import the plugin for `prefix`, or say which extra installs it."""
    wanted = PROVIDERS[prefix]
    try:
        return importlib.import_module(wanted.module)
    except ImportError:
        raise ModelPluginError(_not_installed(prefix)) from None


def _not_installed(prefix: str) -> str:
    wanted = PROVIDERS[prefix]
    return (
        f"{prefix}/ models need the {wanted.module} plugin, which is not installed: "
        f"pip install 'greenlight[{wanted.extra}]'"
    )


def missing_plugins(models: Iterable[str]) -> list[str]:
    """One problem per known prefix among `models` whose plugin is not installed. Looked up,
    not imported: a configuration error is then printed at once, not after the seconds a
    provider's SDK takes to import (a plugin that is there but fails to import is the same
    ModelPluginError at start, from `plugin_module`)."""
    problems = []
    for prefix in dict.fromkeys(provider(m) for m in models):
        if prefix in PROVIDERS and importlib.util.find_spec(PROVIDERS[prefix].module) is None:
            problems.append(_not_installed(prefix))
    return problems


@dataclass(frozen=True)
class Credentials:
    gemini_api_key: str | None = None
    gemini_api_url: str | None = None
    anthropic_api_key: str | None = None
    openai_api_key: str | None = None
    openai_base_url: str | None = None
    ollama_server_address: str | None = None


def plugins(
    models: Iterable[str], credentials: Credentials, http: ClientSession | None = None
) -> list[Any]:
    """The plugins serving `models`, each once; ids without a known prefix (a model a test
    registers itself) need none. `http`: the aiohttp session Google AI's calls go through
    (agent/gemini.py `model_session`; None: google-genai's own)."""
    c = credentials
    made: list[Any] = []
    for prefix in dict.fromkeys(provider(m) for m in models):
        if prefix not in PROVIDERS:
            continue
        module = plugin_module(prefix)
        if prefix == "googleai":
            from agent.gemini import gemini_plugin

            made.append(gemini_plugin(c.gemini_api_key, c.gemini_api_url, http))
        elif prefix == "vertexai":
            from agent.gemini import vertex_plugin

            made.append(vertex_plugin())  # project, location, credentials: Google's env and ADC
        elif prefix == "anthropic":
            # The SDKs retry on their own; Retry below is the one place that does.
            made.append(module.Anthropic(api_key=c.anthropic_api_key, max_retries=0))
        elif prefix == "openai":
            made.append(
                module.OpenAI(api_key=c.openai_api_key, base_url=c.openai_base_url, max_retries=0)
            )
        else:
            made.append(module.Ollama(server_address=c.ollama_server_address))
    return made


@dataclass(frozen=True)
class Resilience:
    """AGENT_MODEL_RETRIES, AGENT_MODEL_RETRY_DELAY_SECONDS, AGENT_FALLBACK_MODELS."""

    retries: int = 3
    delay_seconds: float = 1.0  # the first backoff; it doubles. 0: retry at once, no jitter
    fallbacks: tuple[str, ...] = ()

    def middleware(self) -> list[BaseMiddleware[Any]]:
        """Fallback outside Retry: the primary model is retried with backoff first, then each
        fallback in turn. Both wrap the model call only (`wrap_model`): tools run between
        model calls, so a retried or replaced call never runs a tool again."""
        from genkit_middleware import Fallback, Retry

        mounted: list[BaseMiddleware[Any]] = []
        if self.fallbacks:
            mounted.append(Fallback(models=list(self.fallbacks)))
        if self.retries:
            delay_ms = round(self.delay_seconds * 1000)
            mounted.append(
                Retry(
                    max_retries=self.retries,
                    initial_delay_ms=delay_ms,
                    max_delay_ms=max(delay_ms, 30_000),
                    no_jitter=delay_ms == 0,
                )
            )
        return mounted
