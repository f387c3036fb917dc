"""Does retention slow turns down? Conversations run while the sweep purges a large backlog.

    python -m bench.retention [--database-url URL] [--backlog 50000] [--conversations 300]

Against a real PostgreSQL: `--backlog` conversations last active 200 days ago are written
in bulk, each as the workflow leaves one (a session of two snapshots and six messages, a
paused turn with its approval and a vote, a Slack event id, an audit row 500 days old). Then
the same load of conversations (each: a message that pauses on transferMoney, the Approve,
the resume and reply; 4 at a time, in process, a model that answers at once, no Slack) runs
twice: without a purge, and with `Retention.purge` running back to back until the backlog is
gone (harder than the service, which purges once per RECOVERY_INTERVAL_SECONDS). Prints
p50/p99 of each step and of the whole conversation, with and without, and the purge rate;
writes bench/results-retention.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from agent.assemble import build_workflow
from agent.clock import utc_now
from agent.outcomes import AwaitingApproval, Resumed
from agent.policy import ApproverFacts, PolicyDefaults
from agent.runtime import AgentConfig
from bench.database import temporary_database
from bench.ops import scripted
from storage.db import SessionFactory, make_engine, make_session_factory
from storage.domain import Thread
from storage.retention import Purged, Retention

RESULTS = Path(__file__).parent / "results-retention.json"
TEAM = "TRETAIN"
OLD = timedelta(days=200)  # the backlog's last activity

# One statement per table, each row derived from the series number: the backlog of `n`
# conversations in seconds rather than minutes.
SEED = [
    """INSERT INTO agent_snapshots (team_id, snapshot_id, session_id, parent_id, created_at,
        meta, message_count, inherited, digest, version)
    SELECT :team, 'old-' || i || '-' || k, 'old-session-' || i,
        CASE WHEN k = 1 THEN NULL ELSE 'old-' || i || '-1' END,
        :created,
        '{}', 3 * k, 3 * (k - 1), 'd', 1
    FROM generate_series(1, :n) i, generate_series(1, 2) k""",
    """INSERT INTO agent_messages (team_id, snapshot_id, position, data)
    SELECT :team, 'old-' || i || '-' || k, p,
        json_build_object('role', 'user', 'content', json_build_array(
            json_build_object('text', repeat('an old message ', 20))))
    FROM generate_series(1, :n) i, generate_series(1, 2) k,
        generate_series(3 * (k - 1), 3 * k - 1) p""",
    """INSERT INTO conversations (id, team_id, channel_id, thread_ts, snapshot_id, busy_until,
        created_at, last_active_at, participants)
    SELECT 'old-' || i, :team, 'D0OLD', 'old.' || i, 'old-' || i || '-2', NULL,
        now() - CAST(:old AS interval), now() - CAST(:old AS interval), '["UEMP"]'
    FROM generate_series(1, :n) i""",
    """INSERT INTO turns (id, team_id, conversation_id, session_id, snapshot_id, state,
        lease_until, attempts, created_at, updated_at)
    SELECT 'old-' || i, :team, 'old-' || i, 'old-session-' || i, 'old-' || i || '-2', 'done',
        NULL, 1, now() - CAST(:old AS interval), now() - CAST(:old AS interval)
    FROM generate_series(1, :n) i""",
    """INSERT INTO approvals (id, team_id, turn_id, tool, ref, input, requester, requested_at,
        expires_at, why, participants, status, decided_by, decided_at, execution,
        card_channel, card_ts, card_state, approvals_needed, votes, reminder, escalation)
    SELECT 'old-' || i, :team, 'old-' || i, 'transferMoney', 'r',
        '{"amount": 5, "toAccount": "12345"}', 'UEMP', now() - CAST(:old AS interval),
        now() - CAST(:old AS interval) + interval '1 day', 'policy', '["UEMP"]', 'approved',
        'UBOSS',
        now() - CAST(:old AS interval), 'finished', 'C0APPR', '1.1', 'posted', 1, 1, 'none', 'none'
    FROM generate_series(1, :n) i""",
    """INSERT INTO approval_votes (approval_id, voter, at)
    SELECT 'old-' || i, 'UBOSS', now() - CAST(:old AS interval) FROM generate_series(1, :n) i""",
    """INSERT INTO seen_events (event_id, received_at)
    SELECT 'Evold' || i, now() - CAST(:old AS interval) FROM generate_series(1, :n) i""",
    """INSERT INTO audit_events (team_id, at, actor, action, tool, approval_id, detail)
    SELECT :team, now() - interval '500 days', 'UBOSS', 'approved', 'transferMoney',
        'old-' || i, '{}' FROM generate_series(1, :n) i""",
]


async def seed(sessions: SessionFactory, n: int) -> float:
    started = time.perf_counter()
    created = (utc_now() - OLD).isoformat()  # as Genkit writes it
    async with sessions() as db, db.begin():
        for statement in SEED:
            await db.execute(
                text(statement), {"n": n, "team": TEAM, "old": OLD, "created": created}
            )
    async with sessions() as db:
        await db.execute(text("ANALYZE"))
    return time.perf_counter() - started


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def summary(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        step: {"p50_ms": round(statistics.median(v), 1), "p99_ms": pct(v, 0.99), "n": len(v)}
        for step, v in samples.items()
    }


async def load(
    sessions: SessionFactory,
    conversations: int,
    workers: int,
    tag: str,
    until: asyncio.Event | None = None,
) -> dict[str, list[float]]:
    """`conversations` conversations (or as many as run `until` it is set), `workers` at a
    time: message → approval request, Approve, resume → reply; each step's wall time in ms."""
    workflow = build_workflow(
        sessions,
        AgentConfig(model="bench", tool_modules=("agent.example_tools",)),
        defaults=PolicyDefaults(channel="C0APPR", timeout=timedelta(hours=1)),
        setup=scripted,
    )
    samples: dict[str, list[float]] = {"message": [], "approve": [], "resume": [], "total": []}
    todo = iter(range(conversations))

    async def timed(step: str, call: Awaitable[Any]) -> Any:
        t0 = time.perf_counter()
        out = await call
        samples[step].append((time.perf_counter() - t0) * 1000)
        return out

    async def worker() -> None:
        for i in todo:
            if until is not None and until.is_set():
                return
            thread = Thread(TEAM, "D0NEW", f"{tag}.{i}")
            t0 = time.perf_counter()
            out = await timed("message", workflow.turns.start(thread, "UEMP", "send 5"))
            assert isinstance(out, AwaitingApproval), out
            approval = out.approvals[0]
            facts = ApproverFacts(in_channel=True)
            await timed(
                "approve",
                workflow.decisions.decide(TEAM, approval.id, "UBOSS", approve=True, facts=facts),
            )
            resumed = await timed("resume", workflow.turns.resume(approval.turn_id))
            assert isinstance(resumed, Resumed), resumed
            samples["total"].append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return samples


async def run(
    database_url: str | None, backlog: int, conversations: int, workers: int, pace: float
) -> dict[str, Any]:
    async with temporary_database(database_url) as url:
        engine = make_engine(url, pool_size=workers + 4)
        sessions = make_session_factory(engine)
        try:
            seeded = await seed(sessions, backlog)
            print(f"seeded {backlog} old conversations in {seeded:.1f} s", flush=True)
            await load(sessions, 40, workers, f"warm-{uuid.uuid4().hex[:6]}")  # warm-up
            quiet = await load(sessions, conversations, workers, f"quiet-{uuid.uuid4().hex[:6]}")

            retention = Retention(sessions, pace=pace)
            purged: list[Purged] = []
            gone = asyncio.Event()

            async def purge_until_done() -> float:
                started = time.perf_counter()
                while (done := await retention.purge(now=utc_now())).rows:
                    purged.append(done)
                gone.set()
                return time.perf_counter() - started

            # Conversations for as long as the purge runs (at most 100 times the quiet load).
            purging = asyncio.create_task(purge_until_done())
            tag = f"purge-{uuid.uuid4().hex[:6]}"
            busy = await load(sessions, 100 * conversations, workers, tag, until=gone)
            purge_s = await purging
        finally:
            await engine.dispose()
    rows = sum(p.rows for p in purged)
    totals = {f: sum(getattr(p, f) for p in purged) for f in Purged.__dataclass_fields__}
    return {
        "backlog_conversations": backlog,
        "conversations_per_phase": conversations,
        "workers": workers,
        "pace": pace,
        "without_purge": summary(quiet),
        "with_purge": summary(busy),
        "purged": totals,
        "purge_s": round(purge_s, 1),
        "purge_rows_per_s": round(rows / purge_s),
        "purge_conversations_per_s": round(totals["conversations"] / purge_s),
        "purge_rounds": len(purged),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'step (ms)':<12}{'p50 without':>14}{'p50 with':>10}{'p99 without':>14}{'p99 with':>10}"
    ]
    for step, quiet in result["without_purge"].items():
        busy = result["with_purge"][step]
        lines.append(
            f"{step:<12}{quiet['p50_ms']:>14}{busy['p50_ms']:>10}"
            f"{quiet['p99_ms']:>14}{busy['p99_ms']:>10}"
        )
    lines.append(
        f"purged {result['purged']} in {result['purge_s']} s "
        f"({result['purge_rounds']} rounds): {result['purge_rows_per_s']} rows/s, "
        f"{result['purge_conversations_per_s']} conversations/s"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="an existing PostgreSQL database to use")
    parser.add_argument("--backlog", type=int, default=50_000, help="old conversations")
    parser.add_argument("--conversations", type=int, default=300, help="per phase")
    parser.add_argument("--workers", type=int, default=4, help="conversations at once")
    parser.add_argument("--pace", type=float, default=1.0, help="Retention's pause factor")
    args = parser.parse_args()
    result = asyncio.run(
        run(args.database_url, args.backlog, args.conversations, args.workers, args.pace)
    )
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
