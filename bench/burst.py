"""Slack's acknowledgements under a burst of events (200/s), the model at zero latency.

Slack retries an event it has not had a 200 for within 3 seconds, so what matters is how fast
each request is acknowledged while the service is flooded; the DMs are sent from a worker
process (bench/_load.py) so the fakes' work here does not delay them. Then: how long the
service takes to post every card.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import asdict

from bench import _load
from bench.harness import JSON, SECRET, Driver, dist_ms


async def burst(driver: Driver, events: int, rate: float, drain_limit: float) -> JSON:
    """`events` DMs sent at `rate` per second, then up to `drain_limit` s for their cards."""
    convs = [driver.new_conv() for _ in range(events)]
    bodies = [(p.body, p.content_type) for p in map(driver.dm_payload, convs)]
    loop = asyncio.get_running_loop()
    send_limit = events / rate + 30.0

    async def body() -> tuple[list[_load.Result], float]:
        sent = await loop.run_in_executor(
            driver.pool, _load.post_all, driver.url, SECRET, bodies, rate, send_limit
        )
        for conv, (at, _, _) in zip(convs, sent, strict=True):
            conv.sent = at
        await asyncio.wait([c.card for c in convs], timeout=drain_limit)
        return sent, time.perf_counter()

    (sent, finished), usage = await driver.measured(body)
    acks = [lat for _, status, lat in sent if status == 200]
    carded = [c for c in convs if c.card.done() and c.sent > 0]  # sent: not cancelled
    to_card = [c.card.result().at - c.sent for c in carded]
    first_sent = min((at for at, _, _ in sent if at), default=finished)
    last_card = max((c.card.result().at for c in carded), default=finished)
    for conv in convs:
        driver.observer.forget(conv)
    send_span = max(at for at, _, _ in sent) - first_sent if sent else 0.0
    return {
        "events": events,
        "rate_per_s": rate,
        "achieved_rate_per_s": round((events - 1) / send_span, 1) if send_span else None,
        "acked_200": len(acks),
        "statuses": dict(Counter(str(status) for _, status, _ in sent)),
        "ack_ms": dist_ms(acks),
        "cards_posted": len(carded),
        "message_to_card_ms": dist_ms(to_card),
        "drain_s": round(last_card - first_sent, 2),
        "turns_per_s_while_draining": round(len(carded) / (last_card - first_sent), 2)
        if carded and last_card > first_sent
        else None,
        "usage": asdict(usage) | {"per_conversation": usage.per(len(carded))},
    }
