"""100 concurrent Approve clicks on one card: the tool must run once, every click answered.

The clicks are sent at once from a worker process (bench/_load.py); the count of executions
comes from the tool's own ledger and, for Greenlight, from the audit trail, both by the
card's approval id (not its buttons' value, which names the version too: `<id>~<n>`); the
others are refused with an ephemeral message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

from sqlalchemy import text

from bench import _load
from bench.harness import CONV_TIMEOUT, JSON, SECRET, Driver, dist_ms
from storage.db import make_engine


async def contention(driver: Driver, clicks: int, ledger: Path | None, db_url: str | None) -> JSON:
    """`clicks` Approve clicks at once, by different people, on one card."""
    conv = driver.new_conv()
    try:
        async with asyncio.timeout(CONV_TIMEOUT):
            await driver.post(driver.dm_payload(conv))
            card = await conv.card
    except TimeoutError:
        driver.observer.forget(conv)
        return {"error": "no card within the time limit"}
    bodies = [
        (p.body, p.content_type)
        for p in (driver.click_payload(card, f"UCLICK{i:04d}") for i in range(clicks))
    ]
    loop = asyncio.get_running_loop()

    def refusals() -> int:
        return sum(c.method == "chat.postEphemeral" for c in driver.slack.calls)

    async def body() -> tuple[list[_load.Result], float | None]:
        sent = await loop.run_in_executor(
            driver.pool, _load.post_all, driver.url, SECRET, bodies, None, 30.0
        )
        clicked = min((at for at, _, _ in sent if at > 0), default=time.perf_counter())
        reply_ms: float | None = None
        with contextlib.suppress(TimeoutError):
            replied = await asyncio.wait_for(conv.reply, timeout=CONV_TIMEOUT)
            reply_ms = (replied - clicked) * 1000
        deadline = time.perf_counter() + 20
        while refusals() < clicks - 1 and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # anything late (a second resume, a second reply) shows now
        return sent, reply_ms

    # On a quiet service (measured() waits for it), not one still busy with the card.
    (sent, reply_ms), usage = await driver.measured(body)
    driver.observer.forget(conv)
    latencies = [lat for _, status, lat in sent if status == 200]
    result: JSON = {
        "clicks": clicks,
        "acked_200": len(latencies),
        "click_ms": dist_ms(latencies),
        "click_to_reply_ms": None if reply_ms is None else round(reply_ms, 1),
        "replies_in_thread": conv.replies,
        "refusals_posted": refusals(),
        "tool_runs_ledger": _ledger_runs(ledger, card.approval_id) if ledger else None,
        "usage_per_click": usage.per(clicks),
    }
    if db_url is not None:
        result["execution_started_audited"] = await _audited(db_url, card.approval_id)
    if conv.replies and not result["tool_runs_ledger"]:  # a count of nothing proves nothing
        result["error"] = f"a reply came, yet no run of approval {card.approval_id} was counted"
    return result


def _ledger_runs(ledger: Path, approval_id: str) -> int:
    """How many times the tool really ran for the approval (the ledger it appends to)."""
    if not ledger.exists():
        return 0
    runs = 0
    for line in ledger.read_text().splitlines():
        if line and json.loads(line).get("key") == approval_id:
            runs += 1
    return runs


async def _audited(db_url: str, approval_id: str) -> int:
    """How many `execution_started` audit rows the service wrote for the approval."""
    engine = make_engine(db_url)
    try:
        async with engine.connect() as conn:
            query = text(
                "SELECT count(*) FROM audit_events "
                "WHERE approval_id = :a AND action = 'execution_started'"
            )
            return int((await conn.execute(query, {"a": approval_id})).scalar_one())
    finally:
        await engine.dispose()
