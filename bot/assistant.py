"""Slack's assistant threads (the AI app's side panel): what the bot remembers of them.

An assistant thread is a thread in the app's DM. Slack tells the app when one starts and
which channel the employee has open beside it (`assistant_thread_started`,
`assistant_thread_context_changed`); the bot offers its suggested prompts and tells the
agent that channel with the employee's next message.

The channel is kept in this process only (bounded): it is a hint for the model, and a
replica that did not see the event simply does not pass it on. Bolt's own context store
keeps it in Slack message metadata instead, at a `conversations.replies` call per message.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # settings read this module: it stays light to import
    from storage.domain import Thread

THREADS_KEPT = 10_000
TITLE_MAX = 60


@dataclass(frozen=True)
class Prompt:
    """A suggested prompt: the button's title, and the message it sends."""

    title: str
    message: str


class AssistantThreads:
    def __init__(self, prompts: Sequence[Prompt]) -> None:
        self.prompts = tuple(prompts)
        # Assistant threads seen here, and the channel open beside each (None: not said).
        self._threads: OrderedDict[Thread, str | None] = OrderedDict()

    def viewing(self, thread: Thread) -> str | None:
        """The channel the employee has open beside the thread, if Slack said."""
        return self._threads.get(thread)

    def knows(self, thread: Thread) -> bool:
        """Whether the thread is an assistant thread (one seen here), which has a status
        line: a resume cannot tell from the thread alone."""
        return thread in self._threads

    def saw(self, thread: Thread, channel: str | None = None) -> None:
        """An assistant thread, opened or followed beside `channel`, or written in."""
        known = self._threads.pop(thread, None)
        self._threads[thread] = channel or known
        while len(self._threads) > THREADS_KEPT:
            self._threads.popitem(last=False)


def is_assistant_thread(event: dict[str, object]) -> bool:
    """A message in a thread of the app's DM: Slack's assistant thread (as Bolt decides)."""
    return event.get("channel_type") == "im" and event.get("thread_ts") is not None


def title_of(text: str) -> str:
    """The thread's title in the assistant's history: the first message, on one line."""
    line = " ".join(text.split())
    return line if len(line) <= TITLE_MAX else line[: TITLE_MAX - 1] + "…"
