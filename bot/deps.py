"""What every listener shares, built once by the application."""

from __future__ import annotations

from dataclasses import dataclass

from agent.keys import ApiKeys
from agent.limits import MessageLimits
from agent.workflow import Workflow
from bot.assistant import AssistantThreads
from bot.background import Background
from bot.clicks import ClickLimit
from bot.delivery import Delivery
from bot.home import HomeTabs
from bot.people import People


@dataclass
class Deps:
    """Listeners receive it as their `deps` argument (see bot/app.py)."""

    workflow: Workflow
    delivery: Delivery
    people: People
    background: Background
    clicks: ClickLimit
    limits: MessageLimits  # messages per person and workspace per minute
    assistant: AssistantThreads
    home: HomeTabs
    keys: ApiKeys  # the gateway's API keys (`/approvals keys`)
