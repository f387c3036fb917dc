"""The bot benchmark's results read out: the issue's targets, ours over the baseline, the table."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from bench.harness import JSON

# The ratios whose targets the issue sets, shown pair by pair.
HEADLINE = (
    "service_cpu_per_conversation",
    "throughput",
    "message_to_card_ms_p50@1",
    "click_to_reply_ms_p50@1",
    "message_to_card_ms_p99@50",
    "click_to_reply_ms_p99@50",
)
NEW_CONN = "new_connections"  # opened while measuring: a pool that overflows under load


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def targets(
    ours: JSON,
    ratio: JSON | None = None,
    *,
    memory: JSON | None = None,
    file_tools: JSON | None = None,
) -> dict[str, JSON]:
    """The issues' targets, each with the measured value and whether it is met: absolute
    ones, then (issue 23) ratios over the baseline, memory growth and the file tools' cost."""

    def check(value: Any, limit: float, *, strict: bool = False, least: bool = False) -> JSON:
        met = value is not None and (
            value >= limit if least else value < limit if strict else value <= limit
        )
        return {"value": value, "limit": limit, "met": met}

    per = _get(ours, "saturation", "per_conversation") or {}
    relative: dict[str, JSON] = {}
    if ratio:
        relative = {
            "ratio_service_cpu_per_conversation_le_1.4": check(
                ratio.get("service_cpu_per_conversation"), 1.4
            ),
            "ratio_throughput_ge_0.7": check(ratio.get("throughput"), 0.7, least=True),
            "ratio_message_to_card_p50_at_1_le_1.5": check(
                ratio.get("message_to_card_ms_p50@1"), 1.5
            ),
            "ratio_click_to_reply_p50_at_1_le_1.5": check(
                ratio.get("click_to_reply_ms_p50@1"), 1.5
            ),
            "ratio_message_to_card_p99_at_50_le_1.5": check(
                ratio.get("message_to_card_ms_p99@50"), 1.5
            ),
            "ratio_click_to_reply_p99_at_50_le_1.5": check(
                ratio.get("click_to_reply_ms_p99@50"), 1.5
            ),
        }
    relative["slack_calls_per_conversation_le_6"] = check(per.get("slack_calls"), 6)
    relative["sql_statements_per_conversation_le_14"] = check(_get(per, "sql", "statements"), 14)
    if memory is not None:
        relative["rss_2000_over_200_conversations_le_1.1"] = check(memory.get("growth"), 1.1)
    for name, got in (file_tools or {}).items():
        if name.startswith("message_to_card_ms_p50"):
            relative[f"file_tools_mounted_{name}_le_1.2"] = check(got.get("ratio"), 1.2)

    levels = ours.get("levels", {})
    one, fifty = levels.get("1", {}), levels.get("50", {})
    acks = [_get(lv, "ack_ms", "p99") for lv in levels.values()]
    acks += [_get(ours, "burst", "ack_ms", "p99"), _get(ours, "saturation", "ack_ms", "p99")]
    worst_ack = None if any(a is None for a in acks) else max(acks)
    cont = ours.get("contention", {})
    runs = cont.get("tool_runs_ledger")
    return {
        "message_to_card_p50_at_1_le_25ms": check(_get(one, "message_to_card_ms", "p50"), 25),
        "click_to_reply_p50_at_1_le_40ms": check(_get(one, "click_to_reply_ms", "p50"), 40),
        "all_complete_at_50": {
            "value": f"{fifty.get('completed')}/{fifty.get('conversations')}",
            "limit": "all",
            "met": bool(fifty) and fifty.get("completed") == fifty.get("conversations"),
        },
        "message_to_card_p99_at_50_lt_1s": check(
            _get(fifty, "message_to_card_ms", "p99"), 1000, strict=True
        ),
        "ack_p99_every_level_le_100ms": check(worst_ack, 100),
        "contention_one_execution": {
            "value": runs,
            "limit": 1,
            "met": runs == 1 and cont.get("execution_started_audited", 1) == 1,
        },
        "contention_click_p99_le_200ms": check(_get(cont, "click_ms", "p99"), 200),
    } | relative


# Counts of what went right or wrong: the worst run's, never a median (one run of two that
# ran a tool twice must show).
WORST: dict[str, Callable[[list[float]], float]] = {
    "tool_runs_ledger": max,
    "execution_started_audited": max,
    "replies_in_thread": max,
    "failures": max,
    "stray_slack_posts": max,
    "completed": min,
    "acked_200": min,
    "cards_posted": min,
}


def median_of(runs: list[Any], pick: Callable[[list[float]], float] | None = None) -> Any:
    """Runs of the same phases merged: each number the median of the runs' (for two, their
    mean), a count in WORST the worst run's, the service's log whole (its levels' largest
    counts, every run's problems), anything else (a timeline, a trace, a label) the first
    run's."""
    first = runs[0]
    if isinstance(first, dict) and "problems" in first:  # the service's log: all of it
        levels = median_of([r.get("levels", {}) for r in runs], max)
        return {"levels": levels, "problems": [p for r in runs for p in r.get("problems", [])]}
    if isinstance(first, dict):
        keys = dict.fromkeys(k for r in runs if isinstance(r, dict) for k in r)
        return {
            k: median_of([r[k] for r in runs if isinstance(r, dict) and k in r], WORST.get(k, pick))
            for k in keys
        }
    numbers = [r for r in runs if isinstance(r, int | float) and not isinstance(r, bool)]
    if numbers and len(numbers) == len(runs):
        merged = (pick or statistics.median)(numbers)
        whole = all(isinstance(n, int) for n in numbers) and merged == int(merged)
        return int(merged) if whole else merged  # a count stays a count: 100, not 100.0
    return first


def ratios(ours: JSON, base: JSON) -> JSON:
    """Greenlight's figure over the baseline's, for the headline measurements."""

    def ratio(*path: str) -> float | None:
        a, b = _get(ours, *path), _get(base, *path)
        if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
            return None
        return round(a / b, 2)

    out: JSON = {}
    for level in ("1", "10", "50"):
        for metric in ("message_to_card_ms", "click_to_reply_ms"):
            for q in ("p50", "p99"):
                out[f"{metric}_{q}@{level}"] = ratio("levels", level, metric, q)
    out["throughput"] = ratio("saturation", "conversations_per_s")
    out["service_cpu_per_conversation"] = ratio("saturation", "per_conversation", "service_cpu_ms")
    out["burst_ack_p99"] = ratio("burst", "ack_ms", "p99")
    out["contention_click_p99"] = ratio("contention", "click_ms", "p99")
    return out


def fmt(v: Any) -> str:
    """A figure as the tables and summaries print it: a ratio to three significant digits
    (1.06 is under a 1.1 target; "1.1" would not say so), milliseconds to a tenth."""
    if v is None:
        return "-"
    if isinstance(v, float):
        if abs(v) < 10:
            return f"{v:.3g}"
        return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"
    return str(v)


def table(result: JSON) -> str:
    """Both bots side by side, then the targets and one conversation's timeline."""
    ours, base = result.get("greenlight") or {}, result.get("baseline") or {}
    rows: list[tuple[str, Any, Any]] = []

    def row(label: str, *path: str) -> None:
        rows.append((label, _get(ours, *path), _get(base, *path)))

    for level in result["config"]["levels"]:
        lv = str(level[0])
        row(f"{lv:>2} conv  message→card p50 ms", "levels", lv, "message_to_card_ms", "p50")
        row(f"{lv:>2} conv  message→card p99 ms", "levels", lv, "message_to_card_ms", "p99")
        row(f"{lv:>2} conv  click→reply p50 ms", "levels", lv, "click_to_reply_ms", "p50")
        row(f"{lv:>2} conv  click→reply p99 ms", "levels", lv, "click_to_reply_ms", "p99")
        row(f"{lv:>2} conv  DM ack p99 ms", "levels", lv, "ack_ms", "p99")
        row(f"{lv:>2} conv  click ack p99 ms", "levels", lv, "click_ack_ms", "p99")
        row(f"{lv:>2} conv  completed", "levels", lv, "completed")
    row("saturation conversations/s", "saturation", "conversations_per_s")
    row("saturation message→card p99 ms", "saturation", "message_to_card_ms", "p99")
    row("service CPU ms / conversation", "saturation", "per_conversation", "service_cpu_ms")
    row("  of which kernel (syscalls)", "saturation", "per_conversation", "service_cpu_kernel_ms")
    row("PostgreSQL CPU ms / conversation", "saturation", "per_conversation", "postgres_cpu_ms")
    row("harness CPU ms / conversation", "saturation", "per_conversation", "harness_cpu_ms")
    row("Slack calls / conversation", "saturation", "per_conversation", "slack_calls")
    row("SQL statements / conversation", "saturation", "per_conversation", "sql", "statements")
    row("  and the timers' meanwhile", "saturation", "per_conversation", "sql", "timer_statements")
    row("SQL transactions / conversation", "saturation", "per_conversation", "sql", "transactions")
    row("SQL round trips / conv (est.)", "saturation", "per_conversation", "sql", "round_trips_est")
    row("new DB connections / conv (50)", "levels", "50", "per_conversation", "sql", NEW_CONN)
    row("  at saturation", "saturation", "per_conversation", "sql", NEW_CONN)
    row("SQL time ms / conv (1 conv)", "levels", "1", "per_conversation", "sql", "statement_ms")
    row(
        "GC pause ms / conversation",
        "saturation",
        "per_conversation",
        "gc",
        "pause_ms_per_conversation",
    )
    row(
        "longest GC pause ms (saturation)",
        "saturation",
        "per_conversation",
        "gc",
        "longest_pause_ms",
    )
    row(
        "longest GC pause ms (burst)",
        "burst",
        "usage",
        "per_conversation",
        "gc",
        "longest_pause_ms",
    )
    row("service RSS MB after saturation", "saturation", "service_rss_mb")
    row("burst ack p50 ms", "burst", "ack_ms", "p50")
    row("burst ack p99 ms", "burst", "ack_ms", "p99")
    row("burst cards posted", "burst", "cards_posted")
    row("burst message→card p99 ms", "burst", "message_to_card_ms", "p99")
    row("burst drain s", "burst", "drain_s")
    row("contention tool runs", "contention", "tool_runs_ledger")
    row("contention replies in thread", "contention", "replies_in_thread")
    row("contention click p50 ms", "contention", "click_ms", "p50")
    row("contention click p99 ms", "contention", "click_ms", "p99")
    row("contention service CPU ms / click", "contention", "usage_per_click", "service_cpu_ms")
    row("contention SQL statements / click", "contention", "usage_per_click", "sql", "statements")
    row("contention longest GC pause ms", "contention", "usage_per_click", "gc", "longest_pause_ms")
    width = max(len(r[0]) for r in rows) + 2
    lines = [f"{'bot benchmark':<{width}}{'greenlight':>12}{'baseline':>12}{'ratio':>8}"]
    for label, a, b in rows:
        r = (
            f"{a / b:.2f}"
            if isinstance(a, int | float) and isinstance(b, int | float) and b
            else "-"
        )
        lines.append(f"{label:<{width}}{fmt(a):>12}{fmt(b):>12}{r:>8}")
    lines.append("")
    for name, t in result["targets"].items():
        verdict = "met" if t["met"] else "MISSED"
        lines.append(f"target {name}: {verdict} ({fmt(t['value'])} vs {t['limit']})")
    memory = result.get("memory")
    if memory:
        lines.append("")
        sizes = ", ".join(f"{n}: {mb} MB" for n, mb in memory["rss_mb"].items())
        lines.append(f"service RSS after conversations: {sizes} (x{memory['growth']})")
    files = result.get("file_tools")
    if files:
        lines.append("")
        lines.append("file tools mounted (no file tool called), medians of pairs run alternately:")
        for name, got in files.items():
            lines.append(
                f"  {name:<28} with {fmt(got['with'])}  without {fmt(got['without'])}"
                f"  x{fmt(got['ratio'])}"
            )
    by_pair = result.get("ratios_by_pair")
    if by_pair:
        lines.append("")
        lines.append(
            f"ratios of each pair run in turn ({len(by_pair)}; the targets read their medians):"
        )
        for name in HEADLINE:
            lines.append(f"  {name:<34} " + "  ".join(fmt(p.get(name)) for p in by_pair))
    trace = ours.get("trace")
    if trace:
        lines.append("")
        lines.append("one traced conversation, with the service's SQL (ms after the DM is sent):")
        lines += [f"  {e['at_ms']:>8.2f}  {e['event']}" for e in trace]
    timeline = _get(ours, "levels", "1", "timeline_ms")
    if timeline:
        lines.append("")
        lines.append("one conversation at concurrency 1 (median ms after the DM is sent):")
        lines += [f"  {s['at_ms']:>8.1f}  {s['step']}" for s in timeline]
    return "\n".join(lines)
