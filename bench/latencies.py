"""Latency with Slack and the model answering as slowly as the real ones: what a person waits.

    python -m bench.latencies [--slack-ms 100] [--model-ms 800] [--pairs 2] [--database-url URL]

bench/bot.py measures against fakes that answer at once, so a ratio there is about the
milliseconds the service itself adds (SQL round trips, CPU): the bare bot keeps everything in
memory, and at one conversation Greenlight's durable writes are most of both figures. Here every
Slack call takes --slack-ms and every model call --model-ms (defaults: a Web API call from a
cloud region, a short answer from a fast model) and the same conversation is timed at 1, 10
and 50 at once, both bots alternating, each figure the median of its runs. What it shows is
what an employee and an approver see: the time added by each call made one after another
(the bare bot's placeholder before the model call, say), by
the database, and by work waiting for a slot (MAX_CONCURRENT_TURNS) at 10 and 50 at once.

Results: a table on stdout, JSON in bench/results-latencies.json. Not a target (issue 23 sets
them at zero latency); reported beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path

from bench.bot import _spawn_pool, bench_target
from bench.database import temporary_database
from bench.harness import JSON, QUICK
from bench.report import median_of

RESULTS = Path(__file__).parent / "results-latencies.json"
PLAN = dataclasses.replace(QUICK, levels=((1, 10), (10, 2), (50, 2)), warmup=2)
METRICS = ("message_to_card_ms", "click_to_reply_ms")


async def run(database_url: str | None, *, slack_ms: float, model_ms: float, pairs: int) -> JSON:
    latency = (slack_ms / 1000, model_ms / 1000)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    runs: dict[str, list[JSON]] = {"greenlight": [], "baseline": []}
    with _spawn_pool() as pool:
        for _ in range(pairs):
            async with temporary_database(database_url) as url:
                got = await bench_target(
                    "greenlight", "bench.serve", PLAN, database_url=url, pool=pool,
                    profile=None, log=log, phases="latency", latency=latency,
                )  # fmt: skip
            runs["greenlight"].append(got.get("levels", {}))
            got = await bench_target(
                "baseline", "bench.baseline", PLAN, database_url=None, pool=pool,
                profile=None, log=log, phases="latency", latency=latency,
            )  # fmt: skip
            runs["baseline"].append(got.get("levels", {}))
    merged = {name: median_of(levels) for name, levels in runs.items()}
    rows: JSON = {}
    for concurrency, _ in PLAN.levels:
        for metric in METRICS:
            for p in ("p50", "p99"):
                ours, base = (
                    merged[n].get(str(concurrency), {}).get(metric, {}).get(p)
                    for n in ("greenlight", "baseline")
                )
                rows[f"{metric} {p} @{concurrency}"] = {
                    "greenlight": ours,
                    "baseline": base,
                    "added_ms": round(ours - base, 1) if ours and base else None,
                    "ratio": round(ours / base, 2) if ours and base else None,
                }
    return {"slack_ms": slack_ms, "model_ms": model_ms, "pairs": pairs, "rows": rows}


def table(result: JSON) -> str:
    lines = [
        f"each Slack call {result['slack_ms']:g} ms, each model call {result['model_ms']:g} ms "
        f"(medians of {result['pairs']} alternating pairs)",
        f"{'':32}{'greenlight':>12}{'baseline':>10}{'added':>9}{'ratio':>7}",
    ]
    for name, r in result["rows"].items():
        cells = [r[k] if r[k] is not None else "-" for k in ("greenlight", "baseline")]
        added, ratio = r["added_ms"], r["ratio"]
        lines.append(
            f"{name:32}{cells[0]:>12}{cells[1]:>10}"
            f"{added if added is not None else '-':>9}{ratio if ratio is not None else '-':>7}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="an existing PostgreSQL database (migrated)")
    parser.add_argument("--slack-ms", type=float, default=100.0)
    parser.add_argument("--model-ms", type=float, default=800.0)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    result = asyncio.run(
        run(
            args.database_url,
            slack_ms=args.slack_ms,
            model_ms=args.model_ms,
            pairs=max(1, args.pairs),
        )
    )
    print(table(result))
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwritten: {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
