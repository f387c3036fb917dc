"""Summaries of the service's profiles, by component (SQLAlchemy, Genkit, Bolt, ...).

- py-spy (`py-spy record --format raw`, collapsed stacks): wall-clock samples of a thread
  that is not idle, so time spent runnable but preempted (2 cores shared with PostgreSQL)
  shows up in whatever frame was current, typically a socket write that woke PostgreSQL.
  Each sample is charged to the innermost known component ("self") and to every component
  on its stack ("inclusive").
- cProfile (bench.serve with $BENCH_CPROFILE): deterministic, timed by process CPU time;
  builtins (C functions) are charged to the component of their callers.

- pyinstrument (bench.serve with $BENCH_PYINSTRUMENT; `python -m bench.bot --profile
  pyinstrument`): in-process samples every millisecond, during saturation only, with the idle
  event loop left out, so what remains is the service's running time. `pieces` charges each
  sample to the issue-23 pieces: the outermost named operation on its stack (a session save,
  a store method's SQL, a Slack method, the Home refresh, ...), else the innermost library.

    python -m bench.profile bench/profile-bot.txt
    python -m bench.profile bench/profile-bot.pstats [conversations]
"""

from __future__ import annotations

import json
import pstats
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

# Checked in order: the first match names the component.
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("asyncpg", ("asyncpg/",)),
    ("SQLAlchemy", ("sqlalchemy/",)),
    ("Gemini plugin + google-genai", ("genkit_google_genai/", "google/genai/")),
    ("genkit-middleware", ("genkit_middleware/",)),
    ("Genkit", ("genkit/",)),
    ("OpenTelemetry", ("opentelemetry/",)),
    ("Bolt", ("slack_bolt/",)),
    ("slack_sdk", ("slack_sdk/",)),
    ("aiohttp + yarl + multidict", ("aiohttp/", "yarl/", "multidict/")),
    ("httpx/httpcore", ("httpx/", "httpcore/", "anyio/")),
    ("pydantic", ("pydantic/", "pydantic_core/")),
    ("json", ("json/",)),
    ("logging", ("logging/",)),
    ("structlog", ("structlog/",)),
    ("Greenlight: bot/", ("bot/",)),
    ("Greenlight: agent/", ("agent/",)),
    ("Greenlight: storage/", ("storage/",)),
    ("tests.ledger_tools", ("ledger_tools",)),
    ("asyncio", ("asyncio/", "uvloop/")),
)


# Named operations, checked outermost first on a stack: (piece, file needle, functions or ()).
OPERATIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Home refresh", "bot/home.py", ()),
    ("permalinks", "bot/delivery.py", ("_permalink", "_lookup", "_ask", "_address", "link")),
    ("metrics observer", "bot/metrics.py", ()),
    ("metrics observer", "agent/observer.py", ("settled", "_turn_ended", "_executed")),
    ("streaming decision", "bot/streaming.py", ()),
    ("message-limit upsert", "agent/limits.py", ()),
    ("heartbeat tasks", "agent/leases.py", ("_beat",)),
    ("session load", "storage/session_store.py", ("get_snapshot",)),
    ("session save", "storage/session_store.py", ("save_snapshot",)),
)
STORES = (
    *(f"storage/{m}.py" for m in ("turns", "decisions", "executions", "follow_ups", "reads")),
    "storage/rows.py",
    "storage/policies.py",
    "storage/retention.py",
)
SLACK = "slack_sdk/web/async_client.py"
# The event loop waiting for I/O; pyinstrument sometimes records the poll itself as the
# innermost frame (a built-in), which counted the wait as busy "asyncio" time (3.4 ms a
# conversation of Greenlight's first halves, 0.3 of the bare bot's, which waits less).
IDLE = (
    ("select", "selectors.py"),
    ("_run_once", "asyncio/base_events.py"),
    ("epoll.poll", "<built-in>"),
    ("run", "asyncio/runners.py"),  # uvloop: its loop is C, below asyncio.run
)


class Sampler:
    """pyinstrument in a service under the benchmark: each call of `toggle` (on SIGWINCH)
    starts sampling every millisecond, or stops and writes the samples to `path` (written
    whole, then renamed, so the benchmark never reads half a file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._profiler: Any = None

    def toggle(self) -> None:
        from pyinstrument import Profiler

        if self._profiler is None:
            self._profiler = Profiler(interval=0.001, async_mode="disabled")
            self._profiler.start()
            return
        session, self._profiler = self._profiler.stop(), None
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(session.frame_records))
        tmp.replace(self.path)


def _frame(info: str) -> tuple[str, str]:
    function, path, *_ = [*info.split("\x01")[0].split("\x00"), "", ""][:3]
    return function, path


def operation(function: str, path: str) -> str | None:
    for piece, needle, functions in OPERATIONS:
        if needle in path and (not functions or function in functions):
            return piece
    if any(store in path for store in STORES) and not function.startswith("_"):
        return f"SQL: {path.rsplit('/', 1)[-1][:-3]}.{function}"
    if SLACK in path and "_" in function and function not in ("api_call", "_perform_urllib"):
        return f"Slack: {function}"
    return None


def pieces(records: list[tuple[list[str], float]], conversations: int) -> dict[str, Any]:
    """Seconds of samples by piece (see OPERATIONS), idle left out, per conversation."""
    by: defaultdict[str, float] = defaultdict(float)
    idle = 0.0
    for stack, seconds in records:
        frames = [_frame(f) for f in stack]
        if frames and any(f == frames[-1][0] and p in frames[-1][1] for f, p in IDLE):
            idle += seconds
            continue
        named = next((op for f, p in frames if (op := operation(f, p)) is not None), None)
        if named is None and frames and frames[-1][0].startswith("socket.send"):
            named = "socket writes (the kernel; a core is given up to PostgreSQL)"
        if named is None:
            found = [c for _, p in reversed(frames) if (c := component(f"({p}")) is not None]
            named = found[0] if found else "other"
            if named == "pydantic":  # validation for whom: the first other library out
                named += " for " + next((c for c in found if c != "pydantic"), "other")
        by[named] += seconds
    busy = sum(by.values()) or 1e-9
    per = max(conversations, 1)
    ranked = sorted(by.items(), key=lambda kv: -kv[1])
    return {
        "busy_s": round(busy, 2),
        "idle_s": round(idle, 2),
        "conversations": conversations,
        "ms_per_conversation": {k: round(1000 * v / per, 2) for k, v in ranked},
        "percent": {k: round(100 * v / busy, 1) for k, v in ranked},
    }


def render_pieces(summary: dict[str, Any]) -> str:
    lines = [
        f"pyinstrument: {summary['busy_s']} s busy, {summary['idle_s']} s idle, "
        f"{summary['conversations']} conversations; ms of the service's time per conversation:"
    ]
    for name, ms in summary["ms_per_conversation"].items():
        lines.append(f"  {ms:8.2f}  {summary['percent'][name]:5.1f}%  {name}")
    return "\n".join(lines)


def component(frame: str) -> str | None:
    where = frame[frame.rfind("(") + 1 :] if "(" in frame else frame
    for name, needles in COMPONENTS:
        if any(n in where for n in needles):
            return name
    return None


def _parse(raw: str) -> list[tuple[list[str], int]]:
    samples = []
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            samples.append((stack.split(";"), int(count)))
    return samples


def summarize_collapsed(raw: str, top: int = 25) -> dict[str, Any]:
    samples = _parse(raw)
    total = sum(n for _, n in samples) or 1
    self_by: Counter[str] = Counter()
    incl_by: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    for frames, n in samples:
        leaf[frames[-1]] += n
        names = [component(f) for f in frames]
        innermost = next((c for c in reversed(names) if c is not None), "other")
        self_by[innermost] += n
        for c in set(names) - {None}:
            incl_by[str(c)] += n
        for f in {f for f, c in zip(frames, names, strict=True) if c and "Greenlight" in c}:
            ours[f] += n

    def share(counter: Counter[str], k: int | None = None) -> dict[str, float]:
        return {name: round(100 * v / total, 1) for name, v in counter.most_common(k)}

    return {
        "samples": total,
        "self_percent": share(self_by),
        "inclusive_percent": share(incl_by),
        "top_leaf_frames_percent": share(leaf, top),
        "greenlight_frames_inclusive_percent": share(ours, top),
    }


def render(summary: dict[str, Any]) -> str:
    lines = [f"py-spy samples: {summary['samples']}"]
    for key in (
        "self_percent",
        "inclusive_percent",
        "top_leaf_frames_percent",
        "greenlight_frames_inclusive_percent",
    ):
        lines.append(f"\n{key}:")
        lines += [f"  {pct:5.1f}%  {name}" for name, pct in summary[key].items()]
    return "\n".join(lines)


def summarize_pstats(path: Path, conversations: int = 0, top: int = 30) -> dict[str, Any]:
    """CPU seconds by component, top functions by own time, Greenlight's by cumulative."""
    stats: dict[Any, Any] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values()) or 1e-9
    by_component: Counter[str] = Counter()
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    for (filename, line, func), (_, _calls, tottime, cumtime, callers) in stats.items():
        name = f"{func} ({filename.split('site-packages/')[-1]}:{line})"
        own[name] += tottime
        if filename == "~":  # a builtin: charge its callers' components
            for (cfile, _, _), caller in callers.items():
                by_component[component(cfile) or "other"] += caller[2]
        else:
            where = component(filename) or "other"
            by_component[where] += tottime
            if where.startswith("Greenlight"):
                ours[name] = max(ours[name], cumtime)

    def ms(counter: Counter[str], k: int | None = None) -> dict[str, float]:
        per = max(conversations, 1)
        return {n: round(1000 * v / per, 2) for n, v in counter.most_common(k)}

    return {
        "cpu_s": round(total, 2),
        "per": f"ms per conversation ({conversations})" if conversations else "ms in total",
        "by_component": ms(by_component),
        "top_own_time": ms(own, top),
        "greenlight_cumulative": ms(ours, top),
    }


def render_pstats(summary: dict[str, Any]) -> str:
    lines = [f"cProfile, process CPU time: {summary['cpu_s']} s; figures in {summary['per']}"]
    for key in ("by_component", "top_own_time", "greenlight_cumulative"):
        lines.append(f"\n{key}:")
        lines += [f"  {v:8.2f}  {name}" for name, v in summary[key].items()]
    return "\n".join(lines)


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/profile-bot.txt")
    if path.suffix == ".pstats":
        n = int(sys.argv[2]) if len(sys.argv) > 2 else 0
        print(render_pstats(summarize_pstats(path, n)))
    else:
        print(render(summarize_collapsed(path.read_text())))


if __name__ == "__main__":
    main()
