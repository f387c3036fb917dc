"""Background work: bounded, in order, and drained at shutdown."""

from __future__ import annotations

import asyncio

from bot.deps import Background


async def test_at_most_limit_pieces_run_at_once_and_the_rest_wait_in_order() -> None:
    background = Background(limit=3)
    release, three_started = asyncio.Event(), asyncio.Event()
    running: list[int] = []
    started: list[int] = []
    peak = 0

    async def work(i: int) -> None:
        nonlocal peak
        started.append(i)
        running.append(i)
        peak = max(peak, len(running))
        if len(started) == 3:
            three_started.set()
        await release.wait()
        running.remove(i)

    assert background.has_room()
    for i in range(10):
        background.spawn(work(i), name=f"work {i}")
    await asyncio.wait_for(three_started.wait(), timeout=5)
    # Spawned together, every task allowed to start took its first step before this resumed.
    assert started == [0, 1, 2] and not background.has_room()
    release.set()
    assert await background.drain(5) == 0
    assert peak == 3 and started == list(range(10))


async def test_drain_cuts_off_running_and_waiting_work() -> None:
    background = Background(limit=1)
    never = asyncio.Event()
    background.spawn(never.wait(), name="stuck")  # type: ignore[arg-type]
    background.spawn(never.wait(), name="queued behind it")  # type: ignore[arg-type]
    assert await background.drain(0.05) == 2
