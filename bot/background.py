"""Work that runs after Slack's acknowledgement, in order of arrival, a few pieces at once."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
import logging
from collections.abc import AsyncIterator, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

KEEP_SLOT_FOR = 0.05  # seconds a piece waits outside before its slot goes to the next
WIND_DOWN = 5.0  # seconds work cut off at shutdown has to hand back what it held


class Background:
    """Work that runs after Slack's acknowledgement, served in order of arrival.

    At most `limit` pieces work at once; a piece waiting on the model or a tool for more than
    KEEP_SLOT_FOR (see `outside`) gives its slot up meanwhile and gets it back
    before anything that came after it. So under a burst the earliest requests finish
    first, instead of all of them sharing the loop and finishing late together, and a click
    on an early card waits behind the messages that came before it rather than slowing them
    down. Work a piece spawns (a click's resume) keeps the piece's place in line. Fewer live
    turns also keep each garbage collection (which stops the loop, and Slack's
    acknowledgements) short.
    """

    def __init__(self, limit: int, *, queue: int | None = None) -> None:
        """`limit` pieces work at once; `queue`: the backlog past which `full()` says so."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._queue = queue
        self._free = limit
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap: place, seq
        self._places = itertools.count()
        self._seq = itertools.count()

    def has_room(self) -> bool:
        """Whether work spawned now would start at once."""
        return self._free > 0

    @property
    def waiting(self) -> int:
        """Pieces of work waiting for a slot now (greenlight_queue_depth)."""
        return sum(not handed.done() for _, _, handed in self._waiting)

    def full(self) -> bool:
        """Whether the work begun and not finished (running, waiting for a slot, or waiting
        outside: on the model, a tool, Slack) has reached `queue`. New requests are then
        better refused than kept waiting without bound."""
        return self._queue is not None and len(self._tasks) >= self._queue

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> None:
        parent = _current.get()
        work = _Work(next(self._places) if parent is None else parent.place)
        task = asyncio.create_task(self._guard(coro, name, work), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, coro: Coroutine[Any, Any, None], name: str, work: _Work) -> None:
        _current.set(work)  # this task's own context: what it spawns inherits the piece
        try:
            await self._take(work)
            await coro
        except Exception:
            log.exception("background work %s failed", name)
        finally:
            work.done = True
            self._give(work)
            coro.close()  # cut off before it began (shutdown): closed, not left un-awaited

    async def _take(self, work: _Work) -> None:
        if self._free > 0:
            self._free -= 1
        else:
            handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (work.place, next(self._seq), handed))
            try:
                await handed
            except asyncio.CancelledError:
                if handed.done() and not handed.cancelled():
                    self._pass_on()  # handed a slot just as it was cancelled
                raise
        if work.done:  # a straggler task of a piece that has ended: not its slot to keep
            self._pass_on()
        else:
            work.holding = True

    def _give(self, work: _Work) -> None:
        if work.holding:
            work.holding = False
            self._pass_on()

    def _pass_on(self) -> None:
        while self._waiting:
            handed = heapq.heappop(self._waiting)[2]
            if not handed.done():  # a waiter cancelled meanwhile left its future behind
                handed.set_result(None)
                return
        self._free += 1

    @contextlib.asynccontextmanager
    async def outside(self) -> AsyncIterator[None]:
        """Wait on something outside this process (the model, a tool, Slack) in here: the hook
        the agent is given at wiring time (agent.scope.Outside).

        The slot is given up while any of the piece's tasks waits outside (a turn may call
        tools in parallel) and taken back, once, when the last of them returns. Outside
        background work (a test driving the workflow directly) it does nothing.
        """
        work = _current.get()
        if work is None:
            yield
            return
        work.away += 1
        # A wait that ends soon keeps the slot: a model call's own CPU work (building the
        # request, parsing the answer) runs inside it, and a zero-latency model would
        # otherwise let every queued turn start before any finished.
        timer = asyncio.get_running_loop().call_later(KEEP_SLOT_FOR, self._give, work)
        try:
            yield
        finally:
            timer.cancel()
            work.away -= 1
            async with work.returning:  # one return to the line at a time
                if not (work.done or work.holding or work.away):
                    await self._take(work)

    async def drain(self, grace: float) -> int:
        """Wait for in-flight and waiting work; returns how many pieces were cut off.

        Work cut off is cancelled, then waited for (WIND_DOWN at most) while it hands back
        what it held (a resume lets go of its turn), before the database closes."""
        if not self._tasks:
            return 0
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=WIND_DOWN)
        return len(pending)


@dataclass(eq=False)
class _Work:
    """One piece of background work: its place in line, and whether it holds a slot now."""

    place: int
    holding: bool = False
    away: int = 0  # its tasks now waiting outside
    done: bool = False
    returning: asyncio.Lock = field(default_factory=asyncio.Lock)


# The piece the running task belongs to. Which piece a wait belongs to is a property of the
# asyncio task (and of the tasks Genkit starts for parallel tool calls, which inherit it):
# passing the piece through Genkit's middleware explicitly is not possible, so a context
# variable it is, private to this module.
_current: ContextVar[_Work | None] = ContextVar("greenlight_work", default=None)


def detached(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task of its own, in an empty context: a kept lookup is shared by whoever asks next,
    and must not keep alive, for as long as it is kept, the context of the conversation that
    started it (its turn, its piece of background work), nor count as that work's."""
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
