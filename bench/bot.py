"""Bot benchmark: the real service over HTTP, against a fake Slack and a fake Gemini on loopback.

    python -m bench.bot [--database-url URL] [--quick] [--target both|ours|baseline] [--pairs N]
    python -m bench.bot --profile py-spy|cprofile

The service runs as a subprocess (`python -m bench.serve`: the very Service `python -m bot`
runs, bound to 127.0.0.1), so its CPU time is its own (read from /proc). This process runs
the fakes and the driver (bench/harness.py); requests whose response time is the figure (the
event burst, the 100 clicks) are sent from a separate worker process (bench/_load.py).

A conversation is one employee DM (signed `message.im`), the model calling `transferMoney`,
the card in the approver channel, an Approve click by someone else, the tool running and the
model's reply in the employee's thread: two agent turns.

Measured, for Greenlight and for a bare Bolt + Genkit bot with no database (bench/baseline.py),
in this order:
  1. message→card and click→reply latency (p50, p99) at 1, 10 and 50 concurrent
     conversations (bench/latency.py);
  2. throughput at saturation and CPU per conversation (service, PostgreSQL, this harness)
     (bench/throughput.py);
  3. acknowledgement latency under a burst of events (200/s), the model at zero latency
     (bench/burst.py);
  4. 100 concurrent Approve clicks on one card: executions (must be 1) and click latency
     (bench/contention.py).
This module sets each bot up and runs the phases; bench/report.py checks the targets and
renders the table. The two bots are started together PAIRS times and each phase is run on
one and then the other, in turn (bench/alternating.py): this VM's speed drifts by a quarter
from minute to minute, which would otherwise move a ratio as much as a change does. Each
figure is the median of its runs; the targets read the median of the pairs' ratios.

Without --database-url a temporary PostgreSQL database is created on 127.0.0.1:5432, migrated
and dropped at the end. Results: a table on stdout, JSON in bench/results-bot.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import aiohttp

from bench import _load
from bench.alternating import Step, all_up, in_turn
from bench.burst import burst
from bench.contention import contention
from bench.database import temporary_database
from bench.harness import (
    APPROVERS,
    FULL,
    JSON,
    QUICK,
    SECRET,
    Driver,
    LoopbackGemini,
    Observer,
    Plan,
    ServiceProcess,
    team_of,
    workspace,
)
from bench.latency import detailed_trace, level
from bench.report import median_of, ratios, table, targets
from bench.throughput import saturation
from tests.fakes.gemini import FakeGemini
from tests.fakes.slack_api import Call, FakeSlack

RESULTS = Path(__file__).parent / "results-bot.json"
PROFILE_DIR = Path(tempfile.gettempdir())
PY_SPY_OUT = PROFILE_DIR / "greenlight-bench-py-spy.txt"
CPROFILE_OUT = PROFILE_DIR / "greenlight-bench.pstats"
PYINSTRUMENT_OUT = PROFILE_DIR / "greenlight-bench-pyinstrument.json"

SERVICE_ENV: dict[str, str] = {}  # --service-env KEY=VALUE: experiments (MAX_CONCURRENT_TURNS=4)


def _env(slack: FakeSlack, gemini: FakeGemini, extra: dict[str, str]) -> dict[str, str]:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env |= {
        "PYTHONUNBUFFERED": "1",
        "SLACK_BOT_TOKEN": "xoxb-bench",
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_API_URL": slack.base_url,
        "GEMINI_API_KEY": "bench-key",
        "GEMINI_API_URL": gemini.base_url,
        "APPROVER_CHANNEL": APPROVERS,
        "AGENT_TOOLS": "tests.ledger_tools",
        "PORT": "0",
        "LOG_LEVEL": "INFO",
        # One workspace sends the whole load: counted as always (the check's cost is part of
        # what is measured), but never refused, so that every message is answered.
        "TEAM_MESSAGES_PER_MINUTE": "1000000",
        "MAX_QUEUED_TURNS": "1000000",
    }
    return env | extra | SERVICE_ENV


def _scratch() -> str | None:
    """The ledger fsyncs every tool run; keep that off the disk (tmpfs) when there is one."""
    shm = Path("/dev/shm")  # noqa: S108 - a private TemporaryDirectory is made inside
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@contextlib.contextmanager
def _spawn_pool() -> Iterator[ProcessPoolExecutor]:
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


@dataclasses.dataclass
class Bot:
    """One bot up: its driver, and what it says when it stops (`closing`: its log)."""

    name: str
    driver: Driver
    ledger: Path
    database_url: str | None
    closing: JSON = dataclasses.field(default_factory=dict)


@contextlib.asynccontextmanager
async def bot_up(
    name: str,
    module: str,
    plan: Plan,
    *,
    database_url: str | None,
    pool: ProcessPoolExecutor,
    profile: str | None = None,
    env: dict[str, str] | None = None,
    latency: tuple[float, float] = (0.0, 0.0),
) -> AsyncIterator[Bot]:
    """One bot (`bench.serve` or `bench.baseline`) running against its own fake Slack and
    Gemini, for as long as the block lasts; its log and any profile go in `closing`.

    `latency`: seconds each Slack call and each model call take to answer (bench/latencies.py).
    `profile`: "pyinstrument" or "cprofile" run the service under that profiler."""
    run_id = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(dir=_scratch()) as tmp:
        ledger = Path(tmp) / "ledger.jsonl"
        stats_file = Path(tmp) / "sql-stats.json" if database_url else None
        extra = {"GREENLIGHT_TEST_LEDGER": str(ledger)} | (env or {})
        if database_url is not None:
            extra |= {
                "DATABASE_URL": database_url,
                "MIGRATE_ON_START": "false",
                "RECOVERY_INTERVAL_SECONDS": "3600",
                "BENCH_STATS_FILE": str(stats_file),
            }
        if profile == "pyinstrument":
            PYINSTRUMENT_OUT.unlink(missing_ok=True)
            extra["BENCH_PYINSTRUMENT"] = str(PYINSTRUMENT_OUT)
        if profile == "cprofile":
            CPROFILE_OUT.unlink(missing_ok=True)
            extra["BENCH_CPROFILE"] = str(CPROFILE_OUT)
        slack = FakeSlack()
        slack.channels[APPROVERS] = {"is_private": True}  # the bot refuses a public one
        slack.team_id = team_of(run_id)
        # Greenlight: its people directory's sync lists them (unless the run turns it off).
        syncs = module == "bench.serve" and extra.get("PEOPLE_SYNC_MINUTES") != "0"
        slack.listed = workspace() if syncs else []
        slack.delays["*"] = latency[0]
        await slack.start()
        observer = Observer(slack)
        gemini = LoopbackGemini(observer.note, delay=latency[1])
        await gemini.__aenter__()
        service = ServiceProcess(name, module, _env(slack, gemini, extra), stats_file)
        connector = aiohttp.TCPConnector(limit=0)
        bot: Bot | None = None
        try:
            await service.start()
            if slack.listed:  # measured once the start-up sync is through
                await slack.wait_for("users.list", predicate=last_page(slack), timeout=120)
            async with aiohttp.ClientSession(connector=connector) as http:
                driver = Driver(name, service, slack, observer, gemini, http, pool, run_id)
                driver.deadline = time.perf_counter() + plan.budget
                bot = Bot(name, driver, ledger, database_url)
                yield bot
                bot.closing["stray_slack_posts"] = observer.stray
        finally:
            await service.stop()
            await gemini.__aexit__(None, None, None)
            await slack.stop()
            if bot is not None:
                bot.closing["service_log"] = {
                    "levels": dict(service.levels),
                    "problems": service.problems,
                }
                if profile == "cprofile" and CPROFILE_OUT.exists():
                    from bench.profile import summarize_pstats

                    bot.closing["cprofile"] = summarize_pstats(
                        CPROFILE_OUT, bot.driver.completed
                    ) | {"raw": str(CPROFILE_OUT)}


def last_page(slack: FakeSlack) -> Callable[[Call], bool]:
    """Whether a users.list call asks for the last page of `slack.listed`."""

    def last(call: Call) -> bool:
        start, limit = int(call.args.get("cursor") or 0), int(call.args.get("limit") or 100)
        return start + limit >= len(slack.listed)

    return last


async def bench_target(
    name: str,
    module: str,
    plan: Plan,
    *,
    database_url: str | None,
    pool: ProcessPoolExecutor,
    profile: str | None,
    log: Callable[[str], None],
    phases: str = "all",
    env: dict[str, str] | None = None,
    latency: tuple[float, float] = (0.0, 0.0),
) -> JSON:
    """Every phase against one bot, in one run (bench/alternating.py runs two in turn).

    `phases`: "all"; "latency" (warm-up and the levels only); "memory" (RSS after MEMORY_AT
    conversations at saturation, in a fresh service).

    `profile`: "py-spy" samples the service during saturation (and traces one conversation's
    SQL); "pyinstrument" gives issue 23's pieces; "cprofile" runs the service under cProfile
    and only warms up, traces one conversation and saturates, since the profiler slows
    everything else down.
    """
    async with bot_up(
        name, module, plan, database_url=database_url, pool=pool, profile=profile, env=env,
        latency=latency,
    ) as bot:  # fmt: skip
        result: JSON = await warm_up(bot, plan, log)
        if phases == "memory":
            result["memory"] = await memory(bot.driver, log)
        elif profile == "pyinstrument":
            if database_url is not None:
                result["trace"] = await detailed_trace(bot.driver)
            result |= await profile_pieces(bot.driver, plan, log)
        else:
            if profile and database_url is not None:
                result["trace"] = await detailed_trace(bot.driver)
            result |= await timed(bot, plan, log, latency_only=phases == "latency", profile=profile)
            if phases != "latency" and profile != "cprofile":
                result |= await loaded(bot, plan, log)
    return result | bot.closing


async def warm_up(bot: Bot, plan: Plan, log: Callable[[str], None]) -> JSON:
    """The warm-up conversations, as the run's "warmup"."""
    log(f"[{bot.name}] warm-up")
    return {"warmup": await bot.driver.warmup(plan.warmup)}


async def timed(
    bot: Bot,
    plan: Plan,
    log: Callable[[str], None],
    *,
    latency_only: bool = False,
    profile: str | None = None,
) -> JSON:
    """The phases whose ratios the issue sets: the latency levels, then saturation (its
    throughput and CPU a conversation), within the plan's budget from now."""
    driver, name = bot.driver, bot.name
    driver.deadline = time.perf_counter() + plan.budget
    result: JSON = {"levels": {}}

    def over(phase: str) -> bool:
        if time.perf_counter() < driver.deadline:
            return False
        result.setdefault("skipped_over_budget", []).append(phase)
        log(f"[{name}] over the {plan.budget:g} s budget: skipping {phase}")
        return True

    for concurrency, rounds in plan.levels:
        if profile == "cprofile" or over(f"level {concurrency}"):
            continue
        log(f"[{name}] {concurrency} concurrent x {rounds} rounds")
        result["levels"][str(concurrency)] = await level(driver, concurrency, rounds)
    if latency_only or over("saturation"):
        return result
    log(f"[{name}] saturation: {plan.saturation_total} conversations")
    spy = _start_py_spy(driver.service.pid) if profile == "py-spy" else None
    result["saturation"] = await saturation(
        driver, plan.saturation_workers, plan.saturation_total, plan.saturation_limit
    )
    if spy is not None:
        result["py_spy"] = _stop_py_spy(spy)
    return result


async def loaded(bot: Bot, plan: Plan, log: Callable[[str], None]) -> JSON:
    """The burst of events and the contended card: bounded on their own (send and drain
    limits), with absolute targets only."""
    driver = bot.driver
    driver.deadline = math.inf
    log(f"[{bot.name}] burst: {plan.burst_events} events at {plan.burst_rate:g}/s")
    result: JSON = {
        "burst": await burst(driver, plan.burst_events, plan.burst_rate, plan.burst_drain_limit)
    }
    log(f"[{bot.name}] contention: {plan.clicks} clicks on one card")
    result["contention"] = await contention(driver, plan.clicks, bot.ledger, bot.database_url)
    return result


PROFILED, PROFILED_AT_ONCE = 60, 4


async def profile_pieces(driver: Driver, plan: Plan, log: Callable[[str], None]) -> JSON:
    """Issue 23's profile: each SQL statement's and Slack method's wall time per
    conversation at concurrency 1, then pyinstrument's samples during saturation by piece."""
    from bench.harness import _sql_delta
    from bench.profile import pieces

    log("[profile] 20 conversations at concurrency 1, walls by statement and Slack method")
    before = await driver.service.sql_stats()
    one = await level(driver, 1, 20)
    delta = _sql_delta(before, await driver.service.sql_stats()) or {}
    n = max(one.get("completed") or 1, 1)

    def walls(count: str, seconds: str) -> JSON:
        return {
            k: {"per_conversation": round(v / n, 2), "ms": round(1000 * delta[seconds][k] / n, 2)}
            for k, v in sorted(delta.get(count, {}).items(), key=lambda kv: -kv[1])
        }

    out: JSON = {"walls_at_1": {"sql": walls("kinds", "kind_seconds")}}
    out["walls_at_1"]["slack"] = walls("slack", "slack_seconds")
    # The profiler slows the service down several times: few enough at once that none
    # runs out of time (each sampled conversation must be counted).
    log(f"[profile] {PROFILED} conversations, {PROFILED_AT_ONCE} at once, under pyinstrument")
    driver.deadline = math.inf  # every conversation sampled is counted
    driver.service.proc.send_signal(signal.SIGWINCH)  # type: ignore[union-attr]
    sat = await saturation(driver, PROFILED_AT_ONCE, PROFILED, 300.0)
    driver.service.proc.send_signal(signal.SIGWINCH)  # type: ignore[union-attr]
    async with asyncio.timeout(60):
        while not PYINSTRUMENT_OUT.exists():  # noqa: ASYNC110 - another process writes it
            await asyncio.sleep(0.1)
    records = json.loads(PYINSTRUMENT_OUT.read_text())
    out["pieces"] = pieces(records, sat["completed"])
    out["pieces"]["service_cpu_ms_per_conversation"] = _cpu(sat)
    return out


def _cpu(sat: JSON) -> float | None:
    per = sat.get("per_conversation") or {}
    value = per.get("service_cpu_ms")
    return value if isinstance(value, int | float) else None


MEMORY_AT = (200, 2000)  # conversations after which the service's RSS is read
FILES_PLAN_LEVELS = ((1, 20), (50, 2))
PAIRS = 4  # pairs of the two bots, started together; each figure the median of its runs
LOADED_PAIRS = 2  # of the burst and the contended card, whose targets are absolute
FILES_PAIRS = 4  # pairs, started together as the bots are (bench/alternating.py)


async def memory(driver: Driver, log: Callable[[str], None]) -> JSON:
    """RSS after 200 and after 2,000 conversations: per-process caches must be bounded."""
    rss: JSON = {}
    done = 0
    for at in MEMORY_AT:
        log(f"[memory] {at - done} conversations, then RSS")
        driver.deadline = math.inf
        await saturation(driver, 32, at - done, 600.0)
        await driver.observer.quiesce(idle=0.2)
        done = at
        rss[str(at)] = driver.service.rss_mb()
    first, last = rss[str(MEMORY_AT[0])], rss[str(MEMORY_AT[-1])]
    return {"rss_mb": rss, "growth": round(last / first, 3) if first and last else None}


async def files_comparison(
    database_url: str | None, pool: ProcessPoolExecutor, log: Callable[[str], None]
) -> JSON:
    """The same flow (no file tool called) with and without AGENT_FILES_ROOT (one small
    file), both up at once and run in turn: what mounting the file tools costs a turn."""
    plan = dataclasses.replace(QUICK, levels=FILES_PLAN_LEVELS, warmup=3)
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "notes.txt").write_text("hello\n")

        @contextlib.asynccontextmanager
        async def both() -> AsyncIterator[list[Bot]]:
            async with (
                temporary_database(database_url) as plain_url,
                temporary_database(database_url) as files_url,
                all_up([
                    bot_up("without", "bench.serve", plan, database_url=plain_url, pool=pool),
                    bot_up(
                        "with", "bench.serve", plan, database_url=files_url, pool=pool,
                        env={"AGENT_FILES_ROOT": root},
                    ),
                ]) as bots,
            ):  # fmt: skip
                yield bots

        got = await in_turn(
            FILES_PAIRS,
            both,
            [
                lambda bot, _: warm_up(bot, plan, log),
                lambda bot, _: timed(bot, plan, log, latency_only=True),
            ],
        )
    runs = {kind: [r.get("levels", {}) for r in rs] for kind, rs in got.items()}
    merged = {kind: median_of(levels) for kind, levels in runs.items()}

    def p50(kind: str, lv: str, metric: str) -> float | None:
        value = merged[kind].get(lv, {}).get(metric, {}).get("p50")
        return value if isinstance(value, int | float) else None

    out: JSON = {}
    for lv, _ in FILES_PLAN_LEVELS:
        for metric in ("message_to_card_ms", "click_to_reply_ms"):
            a, b = p50("with", str(lv), metric), p50("without", str(lv), metric)
            out[f"{metric}_p50@{lv}"] = {
                "with": a,
                "without": b,
                "ratio": round(a / b, 2) if a and b else None,
            }
    return out


def _start_py_spy(pid: int) -> subprocess.Popen[bytes] | None:
    exe = Path(sys.executable).parent / "py-spy"
    if not exe.exists():
        print("py-spy is not installed (.venv/bin/pip install py-spy); no profile", file=sys.stderr)
        return None
    args = [str(exe), "record", "--pid", str(pid), "--rate", "250", "--nonblocking"]
    args += ["--format", "raw", "--output", str(PY_SPY_OUT)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603


def _stop_py_spy(spy: subprocess.Popen[bytes]) -> JSON:
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=30)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait()
    if not PY_SPY_OUT.exists():
        return {"error": "py-spy wrote nothing"}
    from bench.profile import summarize_collapsed

    return summarize_collapsed(PY_SPY_OUT.read_text()) | {"raw": str(PY_SPY_OUT)}


async def side_by_side(
    plan: Plan,
    pairs: int,
    database_url: str | None,
    pool: ProcessPoolExecutor,
    log: Callable[[str], None],
) -> dict[str, list[JSON]]:
    """Both bots started together `pairs` times, each phase run on one and then the other
    (bench/alternating.py); the burst and the contended card in the first LOADED_PAIRS."""

    @contextlib.asynccontextmanager
    async def both() -> AsyncIterator[list[Bot]]:
        async with temporary_database(database_url) as url, all_up([
            bot_up("greenlight", "bench.serve", plan, database_url=url, pool=pool),
            bot_up("baseline", "bench.baseline", plan, database_url=None, pool=pool),
        ]) as bots:  # fmt: skip
            yield bots

    async def heavy(bot: Bot, i: int) -> JSON:
        return await loaded(bot, plan, log) if i < LOADED_PAIRS else {}

    steps: list[Step] = [
        lambda bot, _: warm_up(bot, plan, log),
        lambda bot, _: timed(bot, plan, log),
        heavy,
    ]
    return await in_turn(pairs, both, steps)


async def run(
    database_url: str | None = None,
    *,
    quick: bool = False,
    target: str = "both",
    profile: str | None = None,
    pairs: int = PAIRS,
) -> JSON:
    """Run every phase against Greenlight and/or the baseline (`target`: both, ours,
    baseline), both `pairs` times in turn (once when profiling or running one); print the
    table and write bench/results-bot.json."""
    plan = QUICK if quick else FULL

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    result: JSON = {
        "config": asdict(plan)
        | {
            "quick": quick,
            "cpus": os.cpu_count(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "model": "FakeGemini on loopback, zero latency",
            "tools": "tests.ledger_tools (ledger on tmpfs)",
            "percentiles": "linear interpolation; p99 of n<100 samples is near the max",
        }
    }
    with _spawn_pool() as pool:
        await asyncio.get_running_loop().run_in_executor(pool, _load.ping)
        if target == "both" and profile is None:
            runs = await side_by_side(plan, pairs, database_url, pool, log)
            result |= {name: median_of(got) for name, got in runs.items()}
            # Each pair's two runs were seconds apart: the median of their ratios is what
            # the targets read (the table's ratio column divides the medians).
            result["ratios_by_pair"] = [
                ratios(ours, base) for ours, base in zip(*runs.values(), strict=True)
            ]
            result["ratios_ours_over_baseline"] = median_of(result["ratios_by_pair"])
            async with temporary_database(database_url) as url:
                mem = await bench_target(
                    "memory", "bench.serve", plan, database_url=url, pool=pool,
                    profile=None, log=log, phases="memory",
                )  # fmt: skip
            result["memory"] = mem.get("memory")
            result["file_tools"] = await files_comparison(database_url, pool, log)
        else:
            if target in ("both", "ours"):
                async with temporary_database(database_url) as url:
                    result["greenlight"] = await bench_target(
                        "greenlight", "bench.serve", plan, database_url=url, pool=pool,
                        profile=profile, log=log,
                    )  # fmt: skip
            if target in ("both", "baseline"):
                result["baseline"] = await bench_target(
                    "baseline", "bench.baseline", plan, database_url=None, pool=pool,
                    profile="pyinstrument" if profile == "pyinstrument" else None, log=log,
                )  # fmt: skip
            if "greenlight" in result and "baseline" in result:
                result["ratios_ours_over_baseline"] = ratios(
                    result["greenlight"], result["baseline"]
                )
    result["targets"] = targets(
        result.get("greenlight") or {},
        result.get("ratios_ours_over_baseline") or {},
        memory=result.get("memory"),
        file_tools=result.get("file_tools"),
    )
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(table(result))
    ours = result.get("greenlight") or {}
    for name in ("greenlight", "baseline"):
        if "pieces" in (result.get(name) or {}):
            from bench.profile import render_pieces

            print(f"\n{name}: " + render_pieces(result[name]["pieces"]))
    if "walls_at_1" in ours:
        for what, rows in ours["walls_at_1"].items():
            print(f"\n{what} at concurrency 1, per conversation (count, wall ms):")
            for name, got in rows.items():
                print(f"  {got['per_conversation']:6.2f}  {got['ms']:8.2f} ms  {name}")
    if "py_spy" in ours or "cprofile" in ours:
        from bench.profile import render, render_pstats

        if "py_spy" in ours:
            print("\npy-spy during saturation (wall-clock samples; see bench/profile.py):")
            print(render(ours["py_spy"]))
        if "cprofile" in ours:
            print("\n" + render_pstats(ours["cprofile"]))
    out = RESULTS if profile is None else PROFILE_DIR / "greenlight-bench-profile.json"
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwritten: {out}", file=sys.stderr)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="an existing PostgreSQL database (migrated)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--target", choices=("both", "ours", "baseline"), default="both")
    parser.add_argument(
        "--profile",
        choices=("py-spy", "cprofile", "pyinstrument"),
        help="py-spy: sample the service during saturation; cprofile: a profiling run only "
        "(warm-up, saturation). Both print one conversation's SQL trace.",
    )
    parser.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the bot under test (an experiment: MAX_CONCURRENT_TURNS=4)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=PAIRS,
        help=f"runs of both bots, alternating; each figure is the median (default {PAIRS})",
    )
    args = parser.parse_args()
    SERVICE_ENV.update(item.split("=", 1) for item in args.service_env)
    asyncio.run(
        run(
            args.database_url,
            quick=args.quick,
            target=args.target,
            profile=args.profile,
            pairs=max(1, args.pairs),
        )
    )


if __name__ == "__main__":
    main()
