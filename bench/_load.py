"""Sends signed requests from a process of its own, so the measured response times are not
delayed by the fakes that share the benchmark's event loop.

`post_all` is called through a `ProcessPoolExecutor` (spawn); it returns, per request in
order, (perf_counter at send, HTTP status or -1, seconds to the response). perf_counter is
CLOCK_MONOTONIC on Linux, so the send times compare with the parent's clock.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.fakes import slack_payloads as sp

Result = tuple[float, int, float]


def post_all(
    url: str,
    secret: str,
    bodies: list[tuple[bytes, str]],
    rate: float | None,
    limit: float,
) -> list[Result]:
    """POST every body signed; paced at `rate` per second, or all at once when None.

    Bounded: a fixed list, and whatever is not answered within `limit` seconds is cancelled
    and reported with status -1.
    """
    return asyncio.run(_post_all(url, secret, bodies, rate, limit))


async def _post_all(
    url: str, secret: str, bodies: list[tuple[bytes, str]], rate: float | None, limit: float
) -> list[Result]:
    results: list[Result] = [(0.0, -1, float("nan"))] * len(bodies)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=limit)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        start = time.perf_counter() + 0.05

        async def one(i: int, body: bytes, content_type: str) -> None:
            if rate is not None:
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            sent = time.perf_counter()
            try:
                status, _ = await sp.post_signed(http, url, secret, body, content_type)
            except (aiohttp.ClientError, TimeoutError):
                status = -1
            results[i] = (sent, status, time.perf_counter() - sent)

        tasks = [asyncio.create_task(one(i, b, ct)) for i, (b, ct) in enumerate(bodies)]
        _, late = await asyncio.wait(tasks, timeout=limit)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    return results


def ping() -> bool:
    """Warms the worker process up (imports) before anything is timed."""
    return True
