"""`python -m bench`: every benchmark, one combined summary, bench/results.json.

    python -m bench [--only store|bot|policy|provenance|recovery|gateway] [--quick]
                    [--database-url URL]

- store: bench/session_store.py (bytes and time per save as a conversation grows);
- bot: bench/bot.py (latency, throughput, acks under a burst, contention; against a bare
  Bolt + Genkit baseline);
- policy: bench/policy.py (the cost of 20 CEL rules per tool call);
- provenance: bench/provenance.py (tracing 300 argument values through 1 MB of human text,
  and a Slack acknowledgement meanwhile);
- recovery: bench/recovery.py (seconds from a replacement process being up to the turn a
  killed or stopped bot left being completed);
- gateway: bench/gateway.py (an allowed MCP call's overhead over calling the tool directly,
  and 200 calls waiting for approval held by one process: memory, descriptors, CPU).

Run on their own: bench/ops.py (each step's CPU, in process), bench/latencies.py (both bots
with Slack and the model as slow as the real ones) and bench/interleaved.py (two code trees
at one conversation, alternated conversation by conversation: a change of a few percent).
Each prints its own table; the first two write their own JSON (bench/results-*.json) as
well. Without
--database-url each creates a temporary PostgreSQL database on 127.0.0.1:5432 and drops it.
--quick runs fewer rounds of the bot benchmark and one SIGKILL run of the recovery benchmark
(the store benchmark has one size).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.report import fmt

RESULTS = Path(__file__).parent / "results.json"


def summary(results: dict[str, Any]) -> str:
    lines = ["", "=" * 78, "summary", "=" * 78]
    store = results.get("session_store")
    if isinstance(store, dict):
        lines.append("session store")
        for name, value in (store.get("ratios") or {}).items():
            lines.append(f"  {name:<52}{fmt(value):>12}")
        for name, met in (store.get("targets") or {}).items():
            lines.append(f"  target {name:<45}{'met' if met else 'MISSED':>12}")
    elif store is not None:
        lines.append(f"session store: {store}")
    policy = results.get("policy")
    if isinstance(policy, dict):
        verdict = "met" if policy["met"] else "MISSED"
        lines.append("policy")
        lines.append(
            f"  target {'evaluation_20_rules_lt_0.2ms':<45}{verdict:>12}  "
            f"({fmt(policy['ms_per_call'])} ms vs {policy['target_ms']})"
        )
    prov = results.get("provenance")
    if isinstance(prov, dict):
        lines.append("provenance (1 MB of human text, 300 values)")
        for name, key, limit in (
            ("trace_lt_20ms", "trace_ms", "trace_target_ms"),
            ("ack_during_trace_lt_100ms", "slowest_ack_ms", "ack_target_ms"),
        ):
            verdict = "met" if prov[key] < prov[limit] else "MISSED"
            lines.append(
                f"  target {name:<45}{verdict:>12}  ({fmt(prov[key])} ms vs {prov[limit]})"
            )
        for name, key in (
            ("trace CPU, ms", "trace_cpu_ms"),
            ("cold trace (first in a process), ms", "cold_trace_ms"),
            ("cold trace CPU, ms", "cold_trace_cpu_ms"),
        ):
            if key in prov:
                lines.append(f"  {name:<52}{fmt(prov[key]):>12}")
    bot = results.get("bot")
    if isinstance(bot, dict):
        lines.append("bot")
        for name, ratio in (bot.get("ratios_ours_over_baseline") or {}).items():
            lines.append(f"  ours/baseline {name:<38}{fmt(ratio):>12}")
        for name, t in (bot.get("targets") or {}).items():
            verdict = "met" if t["met"] else "MISSED"
            lines.append(f"  target {name:<45}{verdict:>12}  ({fmt(t['value'])} vs {t['limit']})")
    recovery = results.get("recovery")
    if isinstance(recovery, dict):
        lines.append("recovery (replacement up -> turn completed)")
        for sig, r in recovery.items():
            times = r["replacement_up_to_reply_s"]
            verdict = "met" if r["met"] else "MISSED"
            lines.append(
                f"  after {sig:<46}{verdict:>12}  (max {fmt(times['max'])} s vs {r['target_s']})"
            )
    gateway = results.get("gateway")
    if isinstance(gateway, dict):
        call, held = gateway["allowed_call"], gateway["pending"]
        verdict = "met" if call["met"] else "MISSED"
        lines.append("gateway")
        lines.append(
            f"  target {'allowed_mcp_call_overhead_p50_lt_5ms':<45}{verdict:>12}  "
            f"({fmt(call['overhead_ms_p50'])} ms vs {call['target_ms']}; "
            f"load {gateway['load_average_1m']})"
        )
        lines.append(
            f"  {held['pending']} pending calls: RSS {held['before']['rss_mb']} -> "
            f"{held['held']['rss_mb']} MB, fds {held['before']['fds']} -> {held['held']['fds']}"
        )
    lines.append(f"elapsed: {results['elapsed_s']} s; written: {RESULTS}")
    return "\n".join(lines)


async def run(only: str | None, quick: bool, database_url: str | None) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {}
    if only in (None, "store"):
        try:
            store = importlib.import_module("bench.session_store")
        except ImportError as exc:
            results["session_store"] = f"not available ({exc})"
        else:
            print("== session store ==", file=sys.stderr, flush=True)
            results["session_store"] = await store.run(database_url)
    if only in (None, "policy"):
        from bench import policy

        print("== policy ==", file=sys.stderr, flush=True)
        results["policy"] = policy.run()
    if only in (None, "provenance"):
        from bench import provenance

        print("== provenance ==", file=sys.stderr, flush=True)
        results["provenance"] = await asyncio.to_thread(provenance.run)
    if only in (None, "bot"):
        from bench import bot

        print("== bot ==", file=sys.stderr, flush=True)
        results["bot"] = await bot.run(database_url, quick=quick)
    if only in (None, "recovery"):
        from bench import recovery

        print("== recovery ==", file=sys.stderr, flush=True)
        results["recovery"] = await recovery.run(database_url, runs=1 if quick else 3)
    if only in (None, "gateway"):
        from bench import gateway

        print("== gateway ==", file=sys.stderr, flush=True)
        results["gateway"] = await gateway.run(database_url, calls=100 if quick else 300)
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(summary(results))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", choices=("store", "bot", "policy", "provenance", "recovery", "gateway")
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds (bot benchmark)")
    parser.add_argument("--database-url", help="an existing PostgreSQL database to use")
    args = parser.parse_args()
    asyncio.run(run(args.only, args.quick, args.database_url))


if __name__ == "__main__":
    main()
