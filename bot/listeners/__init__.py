"""Listeners, one module per Slack surface; each module has `register(app, deps)`."""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.deps import Deps
from bot.listeners import actions, commands, events, views


def register(app: AsyncApp, deps: Deps) -> None:
    for surface in (events, actions, views, commands):
        surface.register(app, deps)
