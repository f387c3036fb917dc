"""Throughput at saturation: conversations per second, and what each cost.

Enough conversations run back to back that the service is never idle; the cost per completed
conversation is the service's CPU (and of it, the kernel's), PostgreSQL's, the benchmark's own,
the Slack and Gemini calls, and the SQL statements, transactions and GC pauses the service
counted.
"""

from __future__ import annotations

import asyncio
import time

from bench.harness import JSON, Driver, Outcome, summarize


async def saturation(driver: Driver, workers: int, total: int, limit: float) -> JSON:
    """`workers` conversations back to back each, `total` in all or until `limit` seconds."""
    left = total
    deadline = min(time.perf_counter() + limit, driver.deadline)

    async def worker() -> list[Outcome]:
        nonlocal left
        done: list[Outcome] = []
        while left > 0 and time.perf_counter() < deadline:
            left -= 1
            done.append(await driver.conversation())
        return done

    async def body() -> list[Outcome]:
        per_worker = await asyncio.gather(*(worker() for _ in range(workers)))
        return [o for outs in per_worker for o in outs]

    outcomes, usage = await driver.measured(body)
    result = summarize(outcomes, usage)
    done = result["completed"]
    result["workers"] = workers
    result["conversations_per_s"] = round(done / usage.wall, 2) if usage.wall else None
    result["agent_turns_per_s"] = round(2 * done / usage.wall, 2) if usage.wall else None
    result["service_cpu_utilisation"] = round(usage.service_cpu / usage.wall, 2)
    result["service_rss_mb"] = driver.service.rss_mb()
    return result
