"""bench/alternating.py: each pair started afresh, every step on both bots before the next,
A B in one pair and B A in the next (what keeps a ratio's two figures seconds apart)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from bench.alternating import in_turn


@dataclass
class Stand:
    """What `in_turn` reads of a bot: its name, and what it said as it stopped."""

    name: str
    closing: dict[str, Any] = field(default_factory=dict)


async def test_pairs_alternate_which_bot_goes_first_and_each_pair_starts_afresh() -> None:
    seen: list[str] = []
    started = 0

    @contextlib.asynccontextmanager
    async def up() -> AsyncIterator[list[Any]]:
        nonlocal started
        started += 1
        bots = [Stand("a"), Stand("b")]
        seen.append("up")
        yield bots
        for bot in bots:
            bot.closing["stopped"] = started

    async def first(bot: Any, i: int) -> dict[str, Any]:
        seen.append(f"first {bot.name}{i}")
        return {"first": i}

    async def second(bot: Any, i: int) -> dict[str, Any]:
        seen.append(f"second {bot.name}{i}")
        return {"second": i}

    runs = await in_turn(3, up, [first, second])

    assert seen == [
        "up", "first a0", "first b0", "second a0", "second b0",
        "up", "first b1", "first a1", "second b1", "second a1",
        "up", "first a2", "first b2", "second a2", "second b2",
    ]  # fmt: skip
    assert list(runs) == ["a", "b"]  # up's order, whoever went first
    assert runs["b"] == [{"first": i, "second": i, "stopped": i + 1} for i in range(3)]
