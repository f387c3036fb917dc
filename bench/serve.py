"""`python -m bench.serve`: the service as `python -m bot` runs it, bound to 127.0.0.1.

Same settings (read from the environment), same logging set-up, same `bot.server.serve`; the
only differences are the host (`python -m bot` listens on every interface) and probes that
cost a few microseconds per statement:

- SQLAlchemy event counters: statements (by verb; those of the service's timers, the
  recovery sweep, follow-ups and the gateway's, apart), transactions begun / committed /
  rolled back, pool checkouts (each is a pre-ping round trip), new connections, and wall
  time spent inside statements;
- on SIGUSR1 the counters are written as JSON to $BENCH_STATS_FILE, so the benchmark can
  take a delta around each phase;
- SIGUSR2 starts recording every statement, transaction boundary and pool checkout with its
  time (perf_counter: CLOCK_MONOTONIC, comparable across processes); the next SIGUSR2 stops
  and writes them to $BENCH_STATS_FILE with the suffix `.trace.json`;
- garbage collections are timed (gc.callbacks): count, total and longest pause per
  generation, in the same SIGUSR1 dump;
- each statement's wall time by kind (verb and first table), and each Slack Web API
  method's (count and wall time, the client's `api_call` timed), in the same dump;
- SIGWINCH starts pyinstrument (with $BENCH_PYINSTRUMENT set: sampling every ms, the
  event loop's own stack); the next SIGWINCH stops it and writes its samples to that path
  (bench/profile.py `pieces` reads them);
- with $BENCH_HEAP set (a directory), each SIGUSR1 dump also writes there what the process
  holds by allocator (RSS, glibc's heap and its free chunks, pymalloc's arenas), and with
  $BENCH_TRACEMALLOC=<frames> too, tracemalloc's snapshot and the live objects by type
  (`heap_figures`: issue 23's probe of what grows between 200 and 2,000 conversations);
- with $BENCH_CPROFILE set, cProfile (timed by process CPU time, not wall time) runs from
  start-up to shut-down and writes its stats to that path. It is of limited use: it loses
  track across SQLAlchemy's greenlet switches (see bench/ops.py for direct CPU figures).
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import json
import os
import re
import signal
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

from bench.profile import Sampler
from bot.__main__ import run_loop, settings_or_exit
from bot.server import serve as bot_serve
from bot.settings import Settings

_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+(\w+)", re.IGNORECASE)
# The service's timers (bot/loops.py, gateway/sweep.py, gateway/waiting.py), by task name:
# what they run is counted apart, not charged to the conversations that run meanwhile.
TIMERS = frozenset(
    {"recovery sweep", "follow-ups", "gateway sweep", "gateway decisions", "gateway waiters"}
)


def _on_timer() -> bool:
    """Whether the running task is one of the service's timers."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no loop running (a statement at start-up or shut-down)
        return False
    return task is not None and task.get_name() in TIMERS


def _kind(statement: str) -> str:
    """ "INSERT seen_events", "WITH turns": the verb and the first table named."""
    words = statement.split(None, 1)
    verb = words[0].upper() if words else "?"
    table = _TABLE.search(statement)
    return f"{verb} {table[1]}" if table else verb


class SqlStats:
    """Counts what the service asks of the database, through SQLAlchemy's events."""

    def __init__(self) -> None:
        self.statements: Counter[str] = Counter()
        self.timer_statements = 0  # the timers' (TIMERS), not in `statements`
        self.statement_seconds = 0.0
        self.begins = 0
        self.commits = 0
        self.rollbacks = 0
        self.checkouts = 0
        self.connects = 0
        self.dumps = 0
        self.trace: list[tuple[float, str]] | None = None
        self.kinds: Counter[str] = Counter()
        self.kind_seconds: defaultdict[str, float] = defaultdict(float)
        self.slack: Counter[str] = Counter()
        self.slack_seconds: defaultdict[str, float] = defaultdict(float)
        self.gc_count = [0, 0, 0]
        self.gc_seconds = [0.0, 0.0, 0.0]
        self.gc_longest = [0.0, 0.0, 0.0]
        self._gc_started = 0.0
        self._names: dict[str, tuple[str, str]] = {}  # a statement's text: (verb, kind)

    def install(self) -> None:
        event.listen(Engine, "before_cursor_execute", self._before)
        event.listen(Engine, "after_cursor_execute", self._after)
        event.listen(Engine, "begin", self._begin)
        event.listen(Engine, "commit", self._commit)
        event.listen(Engine, "rollback", self._rollback)
        event.listen(Pool, "checkout", self._checkout)
        event.listen(Pool, "connect", self._connect)
        gc.callbacks.append(self._gc)
        from slack_sdk.web.async_base_client import AsyncBaseClient

        api_call = AsyncBaseClient.api_call

        async def timed(client: Any, api_method: str, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await api_call(client, api_method, *args, **kwargs)
            finally:
                self.slack[api_method] += 1
                self.slack_seconds[api_method] += time.perf_counter() - started

        AsyncBaseClient.api_call = timed  # type: ignore[method-assign,assignment]

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        generation = int(info.get("generation", 0))
        took = time.perf_counter() - self._gc_started
        self.gc_count[generation] += 1
        self.gc_seconds[generation] += took
        self.gc_longest[generation] = max(self.gc_longest[generation], took)

    def _named(self, statement: str) -> tuple[str, str]:
        """(verb, kind) of a statement, worked out once per text: the counters run on every
        statement of the service under measurement, so what they cost is charged to it."""
        named = self._names.get(statement)
        if named is None:
            verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else "?"
            named = self._names[statement] = (verb, _kind(statement))
        return named

    def _before(
        self, conn: Any, cursor: Any, statement: str, _params: Any, context: Any, *_: Any
    ) -> None:
        context.bench_started = time.perf_counter()  # the statement's own execution context
        if _on_timer():
            self.timer_statements += 1
        else:
            self.statements[self._named(statement)[0]] += 1
        if self.trace is not None:
            self.trace.append((time.perf_counter(), " ".join(statement.split())[:160]))

    def _after(
        self, conn: Any, cursor: Any, statement: str, _params: Any, context: Any, *_: Any
    ) -> None:
        started = getattr(context, "bench_started", None)
        if started is not None:
            took = time.perf_counter() - started
            self.statement_seconds += took
            kind = self._named(statement)[1]
            self.kinds[kind] += 1
            self.kind_seconds[kind] += took

    def _mark(self, what: str) -> None:
        if self.trace is not None:
            self.trace.append((time.perf_counter(), what))

    @staticmethod
    def _autocommit(conn: Any) -> bool:
        """SQLAlchemy still signals begin/commit in autocommit; nothing is sent for them."""
        return bool(conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")

    def _begin(self, conn: Any) -> None:
        if not self._autocommit(conn):
            self.begins += 1
            self._mark("(begin)")

    def _commit(self, conn: Any) -> None:
        if not self._autocommit(conn):
            self.commits += 1
            self._mark("COMMIT")

    def _rollback(self, conn: Any) -> None:
        if not self._autocommit(conn):
            self.rollbacks += 1
            self._mark("ROLLBACK")

    def _checkout(self, *args: Any) -> None:
        self.checkouts += 1
        self._mark("(pool checkout)")

    def _connect(self, *args: Any) -> None:
        self.connects += 1

    def snapshot(self) -> dict[str, Any]:
        self.dumps += 1
        return {
            "seq": self.dumps,
            "statements": dict(self.statements),
            "statement_total": sum(self.statements.values()),
            "timer_statements": self.timer_statements,
            "statement_seconds": self.statement_seconds,
            "begins": self.begins,
            "commits": self.commits,
            "rollbacks": self.rollbacks,
            "checkouts": self.checkouts,
            "connects": self.connects,
            "gc_count": list(self.gc_count),
            "gc_seconds": list(self.gc_seconds),
            "gc_longest_ms": [round(t * 1000, 2) for t in self.gc_longest],  # since last dump
            "kinds": dict(self.kinds),
            "kind_seconds": dict(self.kind_seconds),
            "slack": dict(self.slack),
            "slack_seconds": dict(self.slack_seconds),
        }

    def dump(self, path: Path) -> None:
        if heap_dir := os.environ.get("BENCH_HEAP"):
            heap_figures(Path(heap_dir), self.dumps + 1)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        tmp.replace(path)
        self.gc_longest = [0.0, 0.0, 0.0]

    def toggle_trace(self, path: Path) -> None:
        if self.trace is None:
            self.trace = []
            return
        trace, self.trace = self.trace, None
        out = path.with_suffix(".trace.json")
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(trace))
        tmp.replace(out)


# glibc's struct mallinfo2, in order: `arena` is the heap's size, `uordblks` in use in it,
# `fordblks` free in it, `hblkhd` in blocks mapped on their own.
_MALLINFO2 = (
    *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
    *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
)
_PYMALLOC = re.compile(
    r"^# (arenas allocated current|bytes in allocated blocks) += +([\d,]+)$", re.MULTILINE
)


def heap_figures(directory: Path, seq: int) -> None:
    """$BENCH_HEAP's probe (issue 23): what the process holds, by allocator, in
    `heap-{seq}.json` (and glibc's free chunks by size in `malloc-{seq}.xml`); with
    $BENCH_TRACEMALLOC, also the live objects by type after a full collection, and
    tracemalloc's snapshot in `snap-{seq}.pickle`.

    Live objects that grow (a cache keyed by user or thread) show in the snapshots'
    `compare_to(..., "lineno")`; what glibc or pymalloc hold without any live object in it
    (fragmentation, a high-water mark) only in the allocators' figures."""
    import ctypes
    import pickle
    import tempfile
    import tracemalloc

    out: dict[str, Any] = {"tracked": [len(gc.get_objects(g)) for g in range(3)]}
    rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]
    out["smaps_kb"] = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in rollup)}

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Mallinfo2
    info = libc.mallinfo2()
    out["mallinfo2"] = {name: getattr(info, name) for name in _MALLINFO2}
    libc.fopen.restype = ctypes.c_void_p
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    stream = libc.fopen(str(directory / f"malloc-{seq}.xml").encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    with tempfile.TemporaryFile() as err:  # pymalloc writes to the C stderr (logs too, meanwhile)
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        text = err.read().decode(errors="replace")
    out["pymalloc"] = {m[1]: int(m[2].replace(",", "")) for m in _PYMALLOC.finditer(text)}
    if tracemalloc.is_tracing():
        out["collected"] = gc.collect()
        out["types"] = Counter(type(o).__qualname__ for o in gc.get_objects()).most_common(200)
        with (directory / f"snap-{seq}.pickle").open("wb") as f:
            pickle.dump(tracemalloc.take_snapshot(), f)
    (directory / f"heap-{seq}.json").write_text(json.dumps(out))


async def serve(settings: Settings, stats: SqlStats) -> None:
    """bot.server.serve on 127.0.0.1, with the benchmark's signals and optional cProfile."""
    loop = asyncio.get_running_loop()
    stats_file = os.environ.get("BENCH_STATS_FILE")
    if stats_file:
        loop.add_signal_handler(signal.SIGUSR1, stats.dump, Path(stats_file))
        loop.add_signal_handler(signal.SIGUSR2, stats.toggle_trace, Path(stats_file))
    if samples := os.environ.get("BENCH_PYINSTRUMENT"):
        loop.add_signal_handler(signal.SIGWINCH, Sampler(Path(samples)).toggle)
    profile_path = os.environ.get("BENCH_CPROFILE")
    profiler = cProfile.Profile(time.process_time) if profile_path else None
    if profiler is not None:
        profiler.enable()
    try:
        await bot_serve(settings, host="127.0.0.1")
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)


def main() -> int:
    if frames := int(os.environ.get("BENCH_TRACEMALLOC", "0")):
        import tracemalloc

        tracemalloc.start(frames)  # before anything is imported: every block is traced
    settings = settings_or_exit()
    stats = SqlStats()
    stats.install()
    run_loop(serve(settings, stats))  # the loop `python -m bot` serves on
    return 0


if __name__ == "__main__":
    sys.exit(main())
