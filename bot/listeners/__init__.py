"""Listeners, one module per Slack surface; each module has `register(app)`.

Listeners are module-level functions: Bolt passes each the request's parts by name, and
`deps` from the request's context (bot/app.py puts it there), so a test can call them too.
"""

from __future__ import annotations

from slack_bolt.async_app import AsyncApp

from bot.listeners import actions, assistant, commands, events, home, people, views


def register(app: AsyncApp) -> None:
    for surface in (events, assistant, actions, views, commands, home, people):
        surface.register(app)
