"""Two code trees A/B at one conversation, alternated conversation by conversation.

    python -m bench.interleaved TREE_A TREE_B [--conversations 60] [--rounds 4]

A tree is a checkout of this repository (a `git worktree`); `bare` is the bare Bolt + Genkit
bot of this checkout (bench/baseline.py). Both services run at once, each from its own tree
(PYTHONPATH), against fakes of their own, on one temporary database; one conversation goes
to A, one to B, then B, A, and so on, so that both see the same minutes of this VM. Each
round starts both afresh (one process runs steadily faster or slower than the next) and
prints both medians of message → card and Approve → reply and B's ratio to A; the last line,
the median ratio of the rounds.

For a change too small for `python -m bench.bot`'s pairs to see: their ratios spread by a
tenth between pairs (a whole phase on one bot, minutes apart), so a 5% change needs many of
them; here an unchanged tree against itself reads 0.95 to 1.00 (the bot started second ran
about 2% faster on the card), and a change of 3 to 5% shows in every round. Run it both ways
(A B, then B A) when the change is that small.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor

from bench.bot import Bot, _spawn_pool, bot_up
from bench.database import temporary_database
from bench.harness import QUICK

WARM_UP = 10  # conversations each service runs before it is measured


def _up(
    tree: str, url: str, pool: ProcessPoolExecutor
) -> contextlib.AbstractAsyncContextManager[Bot]:
    """The service in `tree` (or the bare bot of this checkout), its own code on its path."""
    bare = tree == "bare"
    path = os.getcwd() if bare else os.path.abspath(tree)
    env = {"PYTHONPATH": path, "PYTHONSAFEPATH": "1"}  # not this checkout's bot/, agent/, ...
    module = "bench.baseline" if bare else "bench.serve"
    return bot_up(tree, module, QUICK, database_url=None if bare else url, pool=pool, env=env)


@contextlib.asynccontextmanager
async def _both(a: str, b: str, url: str, pool: ProcessPoolExecutor) -> AsyncIterator[list[Bot]]:
    async with _up(a, url, pool) as first, _up(b, url, pool) as second:
        for bot in (first, second):
            bot.driver.deadline = time.perf_counter() + 3600
            await bot.driver.warmup(WARM_UP)
        yield [first, second]


async def _round(bots: list[Bot], conversations: int) -> list[tuple[float, float]]:
    """Each bot's (card, reply) medians in ms over `conversations` of its own."""
    got: list[list[tuple[float, float]]] = [[], []]
    for i in range(conversations):
        for k in (0, 1) if i % 2 == 0 else (1, 0):
            await bots[k].driver.observer.quiesce()
            out = await bots[k].driver.conversation()
            if out.ok and out.to_card is not None and out.to_reply is not None:
                got[k].append((out.to_card * 1000, out.to_reply * 1000))
    return [(statistics.median(c for c, _ in g), statistics.median(r for _, r in g)) for g in got]


async def run(a: str, b: str, conversations: int, rounds: int) -> None:
    ratios: dict[str, list[float]] = {"message → card": [], "Approve → reply": []}
    async with temporary_database(None) as url:
        with _spawn_pool() as pool:
            for n in range(rounds):
                async with _both(a, b, url, pool) as bots:
                    (card_a, reply_a), (card_b, reply_b) = await _round(bots, conversations)
                for name, got_a, got_b in (
                    ("message → card", card_a, card_b),
                    ("Approve → reply", reply_a, reply_b),
                ):
                    ratios[name].append(got_b / got_a)
                    print(f"round {n + 1} {name} p50: A {got_a:.2f} ms, B {got_b:.2f} ms, "
                          f"B/A {got_b / got_a:.3f}", flush=True)  # fmt: skip
    for name, each in ratios.items():
        spread = ", ".join(f"{r:.3f}" for r in each)
        print(f"{name} p50 B/A: {statistics.median(each):.3f} ({spread})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="a checkout of this repository, or `bare`")
    parser.add_argument("b", help="the other")
    parser.add_argument("--conversations", type=int, default=60, help="each, a round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(run(args.a, args.b, args.conversations, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
