"""Provenance: what looking a call's argument values up in the conversation costs, and
whether the event loop stays free meanwhile.

    python -m bench.provenance

1 MB of human text and 300 argument values, traced as the approval middleware traces
them (agent/context.py: the turn's index built, then each value looked up), off the event
loop. Meanwhile a local aiohttp server acknowledges a request, as Bolt acknowledges Slack.
Targets: the trace under 20 ms; the acknowledgement under 100 ms.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from agent.context import Index, human_message, trace

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
        words = [
            rng.choice(_VOCAB) if rng.random() < 0.8 else f"ACC-{rng.randrange(99999):05d}"
            for _ in range(300)
        ]
        words.append(f"{rng.randrange(10_000):,}.00")
        text = " ".join(words)
        messages.append(human_message(text, by="UEMP", at=datetime(2026, 1, 1, tzinfo=UTC)))
        size += len(text)
    return messages


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


def traced(messages: list[Any], args: dict[str, Any]) -> float:
    started = time.perf_counter()
    trace(args, Index(messages))
    return (time.perf_counter() - started) * 1000


async def _ack_during(messages: list[Any], args: dict[str, Any]) -> tuple[float, float]:
    """(trace ms, slowest ack ms) with acks requested while the trace runs off the loop."""

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
            took = await work
    finally:
        await runner.cleanup()
    return took, max(acks) if acks else 0.0


def run(rounds: int = 5) -> dict[str, Any]:
    rng = random.Random(21)
    messages, args = conversation(rng), arguments(rng)
    traced(messages, args)  # warm: regexes compiled
    times, acks = [], []
    for _ in range(rounds):
        took, ack = asyncio.run(_ack_during(messages, args))
        times.append(took)
        acks.append(ack)
    trace_ms, ack_ms = statistics.median(times), max(acks)
    result = {
        "human_text_bytes": TEXT_BYTES,
        "values": VALUES,
        "trace_ms": round(trace_ms, 2),
        "slowest_ack_ms": round(ack_ms, 2),
        "trace_target_ms": TRACE_TARGET_MS,
        "ack_target_ms": ACK_TARGET_MS,
        "met": trace_ms < TRACE_TARGET_MS and ack_ms < ACK_TARGET_MS,
    }
    print(
        f"provenance, 1 MB of human text, {VALUES} values: trace {trace_ms:.1f} ms "
        f"(target < {TRACE_TARGET_MS:g}), slowest ack meanwhile {ack_ms:.1f} ms "
        f"(target < {ACK_TARGET_MS:g}): {'met' if result['met'] else 'MISSED'}"
    )
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    run()
