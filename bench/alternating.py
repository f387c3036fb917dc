"""Bots under test started together, each phase run on one and then the other, so that the
two figures a ratio compares are taken seconds apart rather than minutes.

This VM's speed drifts by a quarter or more from one minute to the next, and one process of
a bot runs steadily faster or slower than the next (saturation six times in one process:
ours 57 to 65 ms of CPU a conversation, then 68 to 80 in the next process, minutes later).
Run whole, one bot after the other (about 90 s each), a pair's ratio moved by as much as a
change does (service CPU 1.19 in one pair and 1.64 in the next, the same code). Here every
pair is two new processes, started together and measured phase by phase, A B then B A in
the next pair; the median of the pairs' ratios is what the targets read.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.bot import Bot

JSON = dict[str, Any]
Step = Callable[["Bot", int], Awaitable[JSON]]


@contextlib.asynccontextmanager
async def all_up(
    starting: Sequence[contextlib.AbstractAsyncContextManager[Bot]],
) -> AsyncIterator[list[Bot]]:
    """Every bot started, in order; all stopped when the block ends (the last first)."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(up) for up in starting]


async def in_turn(
    pairs: int,
    up: Callable[[], contextlib.AbstractAsyncContextManager[Sequence[Bot]]],
    steps: Sequence[Step],
) -> dict[str, list[JSON]]:
    """`pairs` times: the bots started afresh (`up`), then each step (given the bot and the
    pair's index) run on every bot before the next step, in the order A B in one pair and
    B A in the next. Each bot's runs, with what it said as it stopped, in `up`'s order."""
    runs: dict[str, list[JSON]] = {}
    for i in range(pairs):
        async with up() as bots:
            got: dict[str, JSON] = {bot.name: {} for bot in bots}
            for step in steps:
                for bot in bots if i % 2 == 0 else bots[::-1]:
                    got[bot.name] |= await step(bot, i)
        for bot in bots:
            runs.setdefault(bot.name, []).append(got[bot.name] | bot.closing)
    return runs
