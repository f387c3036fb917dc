"""Latency of a conversation at 1, 10 and 50 at once: message→card and click→reply (p50, p99).

At concurrency 1 each conversation is traced on its own, so the result also says when each
Slack and Gemini request falls (the median timeline); with --profile, one conversation is
traced with every SQL statement the service ran as well.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter

from bench.harness import JSON, Driver, Outcome, summarize


async def level(driver: Driver, concurrency: int, rounds: int) -> JSON:
    """`rounds` rounds of `concurrency` conversations started together."""
    timeline: list[list[tuple[str, float]]] = []

    async def body() -> list[Outcome]:
        outcomes: list[Outcome] = []
        for _ in range(rounds):
            if time.perf_counter() > driver.deadline:
                break
            if concurrency == 1:
                outcomes.append(await _traced(driver, timeline))
            else:
                outcomes += await asyncio.gather(
                    *(driver.conversation() for _ in range(concurrency))
                )
        return outcomes

    outcomes, usage = await driver.measured(body)
    result = summarize(outcomes, usage)
    result["concurrency"], result["rounds"] = concurrency, rounds
    if timeline:
        result["timeline_ms"] = _timeline(timeline)
    return result


async def _traced(driver: Driver, timeline: list[list[tuple[str, float]]]) -> Outcome:
    """One conversation with every Slack and Gemini request it caused, timed; the next
    starts once the service is quiet again (the card's last redraw follows the reply)."""
    trace: list[tuple[float, str]] = []
    driver.observer.trace = trace
    out = await driver.conversation()
    await driver.observer.quiesce()
    driver.observer.trace = None
    if out.ok and trace:
        start = next((at for at, label in trace if label == "» DM sent"), trace[0][0])
        timeline.append([(label, at - start) for at, label in trace if at >= start])
    return out


def _timeline(traces: list[list[tuple[str, float]]]) -> list[JSON]:
    """Median offset of each request a conversation causes (nth call of a method), in order."""
    by_step: dict[str, list[float]] = {}
    for trace in traces:
        seen: Counter[str] = Counter()
        for label, offset in trace:
            seen[label] += 1
            by_step.setdefault(f"{label} #{seen[label]}", []).append(offset)
    steps = [
        {"step": step, "at_ms": round(statistics.median(v) * 1000, 1), "n": len(v)}
        for step, v in by_step.items()
    ]
    return sorted(steps, key=lambda s: s["at_ms"])


async def detailed_trace(driver: Driver) -> list[JSON]:
    """One conversation at concurrency 1 with every SQL statement the service ran, merged
    with the Slack and Gemini requests, in time order (ms after the DM was sent)."""
    await driver.observer.quiesce()
    await driver.service.sql_trace()
    trace: list[tuple[float, str]] = []
    driver.observer.trace = trace
    out = await driver.conversation()
    await driver.observer.quiesce()
    driver.observer.trace = None
    sql = await driver.service.sql_trace()
    events = sorted(trace + [(at, f"  sql: {what}") for at, what in sql or []])
    start = next((at for at, label in events if label == "» DM sent"), 0.0)
    rows = [{"at_ms": round((at - start) * 1000, 2), "event": label} for at, label in events]
    return rows if out.ok else [{"at_ms": 0, "event": f"failed at {out.failed_at}"}]
