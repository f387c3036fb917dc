"""Background work: bounded, in order, and drained at shutdown."""

from __future__ import annotations

import asyncio

from slack_sdk.web.async_client import AsyncWebClient

from bot.app import configure
from bot.background import Background
from tests.fakes.slack_api import FakeSlack


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
    assert background.waiting == 7  # greenlight_queue_depth
    release.set()
    assert await background.drain(5) == 0
    assert peak == 3 and started == list(range(10))
    assert background.waiting == 0


async def test_drain_cuts_off_running_and_waiting_work() -> None:
    background = Background(limit=1)
    never = asyncio.Event()
    background.spawn(never.wait(), name="stuck")  # type: ignore[arg-type]
    background.spawn(never.wait(), name="queued behind it")  # type: ignore[arg-type]
    assert await background.drain(0.05) == 2


async def test_work_waiting_outside_gives_its_slot_up_and_gets_it_back_first() -> None:
    background = Background(limit=1)
    second_started, model_answered = asyncio.Event(), asyncio.Event()
    steps: list[str] = []

    async def first() -> None:
        steps.append("first: before the model")
        async with background.outside():  # as the approval middleware waits on the model
            await second_started.wait()  # only possible if the slot was given up
            background.spawn(third(), name="third")
            model_answered.set()  # and, in the same step, back in line for a slot
        steps.append("first: after the model")

    async def second() -> None:
        steps.append("second")
        second_started.set()
        await model_answered.wait()  # the first is back in line before this slot is free

    async def third() -> None:
        steps.append("third")

    background.spawn(first(), name="first")
    background.spawn(second(), name="second")
    background.spawn(later(steps), name="later")
    assert await background.drain(5) == 0
    assert steps == [
        "first: before the model",
        "second",
        "first: after the model",  # before `later`, which came after it
        "third",  # spawned by the first piece: in its place, ahead of `later`
        "later",
    ]


async def later(steps: list[str]) -> None:
    steps.append("later")


async def test_parallel_waits_outside_take_the_slot_back_once() -> None:
    """A turn may call tools in parallel: however their waits overlap, no slot is lost."""
    background = Background(limit=1)
    first_out, second_out, both_back = asyncio.Event(), asyncio.Event(), asyncio.Event()
    straggler_may_return = asyncio.Event()
    stragglers: list[asyncio.Task[None]] = []

    async def wait_outside(out: asyncio.Event, back: asyncio.Event) -> None:
        async with background.outside():
            out.set()
            await back.wait()

    async def turn() -> None:
        done = asyncio.Event()
        await asyncio.gather(
            wait_outside(first_out, done),
            wait_outside(second_out, both_back),
            finish(first_out, second_out, done),
        )
        # A task of this turn still waiting outside after the turn has ended.
        stragglers.append(asyncio.create_task(wait_outside(asyncio.Event(), straggler_may_return)))

    async def finish(*events: asyncio.Event) -> None:
        for event in events[:-1]:
            await event.wait()
        events[-1].set()  # the first comes back while the second is still out
        both_back.set()

    background.spawn(turn(), name="turn")
    assert await background.drain(5) == 0
    straggler_may_return.set()
    await asyncio.wait_for(stragglers[0], timeout=5)
    ran = asyncio.Event()

    async def after() -> None:
        ran.set()

    for _ in range(3):  # every slot is back: each runs at once, one at a time
        ran.clear()
        assert background.has_room()
        background.spawn(after(), name="after")
        await asyncio.wait_for(ran.wait(), timeout=5)
        assert await background.drain(5) == 0


async def test_a_short_wait_outside_keeps_the_slot() -> None:
    """A fast model call's own work (building the request, reading the answer) stays in line."""
    background = Background(limit=1)
    steps: list[str] = []

    async def quick() -> None:
        async with background.outside():
            await asyncio.sleep(0)  # answered well within KEEP_SLOT_FOR
        steps.append("quick: answered")

    async def next_in_line() -> None:
        steps.append("next")

    background.spawn(quick(), name="quick")
    background.spawn(next_in_line(), name="next")
    assert await background.drain(5) == 0
    assert steps == ["quick: answered", "next"]


async def test_work_waiting_for_a_slow_slack_answer_gives_its_slot_up(
    fake_slack: FakeSlack,
) -> None:
    """Every call of the configured client waits for Slack outside (bot/app.py)."""
    background = Background(limit=1)
    client = configure(AsyncWebClient(token="xoxb-test"), fake_slack.base_url,
                       outside=background.outside)  # fmt: skip
    fake_slack.delays["chat.postMessage"] = 1.0  # 20 times KEEP_SLOT_FOR
    steps: list[str] = []

    async def posting() -> None:
        steps.append("posting: asked Slack")
        await client.chat_postMessage(channel="C1", text="hello")
        steps.append("posting: answered")

    async def other() -> None:
        steps.append("other work")

    try:
        background.spawn(posting(), name="posting")
        background.spawn(other(), name="other")
        assert await background.drain(10) == 0
    finally:
        assert client.session is not None
        await client.session.close()
    assert steps == ["posting: asked Slack", "other work", "posting: answered"]
