"""Provenance: what looking a call's argument values up in the conversation costs, and
whether the event loop stays free meanwhile.

    python -m bench.provenance

1 MB of human text and 300 argument values, traced as the approval middleware traces
them (agent/context.py: the model answer's index built, then each value looked up), off
the event loop. Meanwhile a local aiohttp server acknowledges a request, as Bolt
acknowledges Slack.

- trace: a turn's, the employee's new message added to a conversation whose earlier turns
  this process traced already (the index is derived from theirs: only the new message is
  read). Each round adds a message of its own. Target: under 20 ms.
- cold trace: the same conversation read whole, as the first trace of it in a process
  (after a restart, or when no earlier turn needed one): no target, reported.
- the slowest acknowledgement during either. Target: under 100 ms.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from agent.context import RECENT, Index, human_message, trace

RESULTS = Path(__file__).parent / "results-provenance.json"
TRACE_TARGET_MS = 20.0
ACK_TARGET_MS = 100.0
TEXT_BYTES = 1_000_000
VALUES = 300
_VOCAB = ("the", "invoice", "for", "march", "please", "pay", "account", "vendor", "thanks")


def conversation(rng: random.Random) -> list[Any]:
    """Human messages of about 2 KB each, 1 MB in all: words, account ids, amounts."""
    messages, size = [], 0
    while size < TEXT_BYTES:
        messages.append(message(rng))
        size += len(messages[-1].content[0].text)
    return messages


def message(rng: random.Random) -> Any:
    """About 2 KB an employee wrote: words, account ids, an amount."""
    words = [
        rng.choice(_VOCAB) if rng.random() < 0.8 else f"ACC-{rng.randrange(99999):05d}"
        for _ in range(300)
    ]
    words.append(f"{rng.randrange(10_000):,}.00")
    return human_message(" ".join(words), by="UEMP", at=datetime(2026, 1, 1, tzinfo=UTC))


def arguments(rng: random.Random) -> dict[str, Any]:
    """300 values: account ids (found or not), phrases, amounts."""
    return {
        "items": [
            {
                "account": f"ACC-{rng.randrange(99999):05d}",
                "note": f"pay the vendor {i}",
                "amount": rng.randrange(10_000),
            }
            for i in range(VALUES // 3)
        ]
    }


def traced(messages: list[Any], args: dict[str, Any]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one trace: the CPU time is the thread's own, what a loaded
    machine or the event loop's share of the interpreter does not inflate."""
    started, cpu = time.perf_counter(), time.thread_time()
    trace(args, Index(messages))
    return (time.perf_counter() - started) * 1000, (time.thread_time() - cpu) * 1000


async def _ack_during(messages: list[Any], args: dict[str, Any]) -> tuple[float, float, float]:
    """(trace ms, its CPU ms, slowest ack ms), acks requested while the trace runs off the
    loop."""

    async def ack(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/slack/events", ack)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    acks: list[float] = []
    try:
        async with aiohttp.ClientSession() as http:
            work = asyncio.ensure_future(asyncio.to_thread(traced, messages, args))
            while not work.done():
                started = time.perf_counter()
                async with http.post(f"http://127.0.0.1:{port}/slack/events") as r:
                    await r.read()
                acks.append((time.perf_counter() - started) * 1000)
            took, cpu = await work
    finally:
        await runner.cleanup()
    return took, cpu, max(acks) if acks else 0.0


def run(rounds: int = 5) -> dict[str, Any]:
    rng = random.Random(21)
    messages, args = conversation(rng), arguments(rng)
    traced(messages[:50], args)  # warm: regexes compiled
    RECENT.clear()
    gc.collect()  # building the conversation's messages is not the trace's garbage
    cold, cold_cpu, cold_ack = asyncio.run(_ack_during(messages, args))
    times, cpus, acks = [], [], [cold_ack]
    for _ in range(rounds):
        messages.append(message(rng))  # a new turn: one message this process has not read
        gc.collect()
        took, cpu, ack = asyncio.run(_ack_during(messages, args))
        times.append(took)
        cpus.append(cpu)
        acks.append(ack)
    trace_ms, cpu_ms, ack_ms = statistics.median(times), statistics.median(cpus), max(acks)
    result = {
        "human_text_bytes": TEXT_BYTES,
        "values": VALUES,
        "trace_ms": round(trace_ms, 2),
        "trace_cpu_ms": round(cpu_ms, 2),
        "cold_trace_ms": round(cold, 2),
        "cold_trace_cpu_ms": round(cold_cpu, 2),
        "slowest_ack_ms": round(ack_ms, 2),
        "trace_target_ms": TRACE_TARGET_MS,
        "ack_target_ms": ACK_TARGET_MS,
        "met": trace_ms < TRACE_TARGET_MS and ack_ms < ACK_TARGET_MS,
    }
    verdict = {True: "met", False: "MISSED"}
    print(
        f"provenance, 1 MB of human text, {VALUES} values:\n"
        f"  trace (a new message) {trace_ms:.1f} ms ({cpu_ms:.1f} ms of CPU), median of "
        f"{rounds} (target < {TRACE_TARGET_MS:g}): {verdict[trace_ms < TRACE_TARGET_MS]}\n"
        f"  slowest ack meanwhile {ack_ms:.1f} ms "
        f"(target < {ACK_TARGET_MS:g}): {verdict[ack_ms < ACK_TARGET_MS]}\n"
        f"  cold trace (the first of the conversation in a process) {cold:.1f} ms "
        f"({cold_cpu:.1f} ms of CPU; no target)"
    )
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    run()
