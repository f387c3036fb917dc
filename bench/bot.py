"""Bot benchmark: the real service over HTTP, against a fake Slack and a fake Gemini on loopback.

    python -m bench.bot [--database-url URL] [--quick] [--target both|ours|baseline]
    python -m bench.bot --profile py-spy|cprofile

The service runs as a subprocess (`python -m bench.serve`: the very Service `python -m bot`
runs, bound to 127.0.0.1), so its CPU time is its own (read from /proc). This process runs
the fakes (FakeSlack, a FakeGemini that answers at once and never runs out of script) and the
driver; requests whose response time is the figure (the event burst, the 100 clicks) are sent
from a separate worker process so the fakes' work does not delay them.

A conversation is one employee DM (signed `message.im`), the model calling `transferMoney`,
the card in the approver channel, an Approve click by someone else, the tool running and the
model's reply in the employee's thread: two agent turns.

Measured, for Greenlight and for a bare Bolt + Genkit bot with no database (bench/baseline.py):
  1. message→card and click→reply latency (p50, p99) at 1, 10 and 50 concurrent conversations;
  2. throughput at saturation and CPU per conversation (service, PostgreSQL, this harness);
  3. acknowledgement latency under a burst of events (200/s), the model at zero latency;
  4. 100 concurrent Approve clicks on one card: executions (must be 1) and click latency.

Without --database-url a temporary PostgreSQL database is created on 127.0.0.1:5432, migrated
and dropped at the end. Results: a table on stdout, JSON in bench/results-bot.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from sqlalchemy import text

from bench import _load
from bench.database import temporary_database
from storage.db import make_engine
from tests.fakes import gemini as fg
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, RecordedRequest
from tests.fakes.slack_api import FakeSlack

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results-bot.json"
PROFILE_DIR = Path(tempfile.gettempdir())
PY_SPY_OUT = PROFILE_DIR / "greenlight-bench-py-spy.txt"
CPROFILE_OUT = PROFILE_DIR / "greenlight-bench.pstats"

SECRET = "bench-signing-secret"
APPROVERS = "C0BENCHAPPR"
THINKING = "_Thinking…_"
KEY = re.compile(r"acct\d{7}")
UP = re.compile(r"is up \(HTTP :(\d+)\)")
LEVEL = re.compile(r" (WARNING|ERROR|CRITICAL) ")
CONV_TIMEOUT = 20.0  # seconds for one conversation, DM to reply
JSON = dict[str, Any]


@dataclass(frozen=True)
class Plan:
    levels: tuple[tuple[int, int], ...]  # (concurrent conversations, rounds)
    warmup: int
    saturation_workers: int
    saturation_total: int
    saturation_limit: float
    burst_events: int
    burst_rate: float
    burst_drain_limit: float
    clicks: int
    budget: float  # seconds for the timed phases against one bot; later ones are skipped after


FULL = Plan(
    levels=((1, 50), (10, 10), (50, 4)),
    warmup=5,
    saturation_workers=64,
    saturation_total=320,
    saturation_limit=90.0,
    burst_events=600,
    burst_rate=200.0,
    burst_drain_limit=60.0,
    clicks=100,
    budget=150.0,
)
QUICK = Plan(
    levels=((1, 20), (10, 4), (50, 2)),
    warmup=3,
    saturation_workers=64,
    saturation_total=128,
    saturation_limit=45.0,
    burst_events=400,
    burst_rate=200.0,
    burst_drain_limit=40.0,
    clicks=100,
    budget=90.0,
)


# -- statistics ------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float | None:
    """Percentile by linear interpolation between closest ranks (q in [0, 1])."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def dist_ms(values: Sequence[float]) -> JSON:
    """p50 / p99 / max in milliseconds, with the sample count."""

    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 1)

    return {
        "n": len(values),
        "p50": ms(pct(values, 0.5)),
        "p99": ms(pct(values, 0.99)),
        "max": ms(max(values) if values else None),
    }


# -- the fakes -------------------------------------------------------------------------------


class _Forever(deque[fg.Script]):
    """A script queue whose one entry is never used up."""

    def popleft(self) -> fg.Script:
        return self[0]


DONE = fg.text("Done: the transfer went through.")


def model_reply(body: JSON) -> fg.Reply:
    """Call transferMoney for a user message; answer in text after the function response."""
    contents = body.get("contents") or []
    parts = (contents[-1].get("parts") if contents else None) or []
    if any("functionResponse" in p for p in parts):
        return DONE
    said = " ".join(str(p.get("text", "")) for p in parts)
    found = KEY.search(said)
    account = found.group(0) if found else "unknown"
    return fg.function_call("transferMoney", {"amount": 5, "toAccount": account}, id="call-1")


class LoopbackGemini(FakeGemini):
    """FakeGemini at zero latency with a reply function that never runs out."""

    def __init__(self, on_request: Callable[[str], None]) -> None:
        super().__init__()
        self._script = _Forever([model_reply])
        self._on_request = on_request
        self.generated = 0

    async def _generate(
        self, request: web.Request, rec: RecordedRequest, *, stream: bool
    ) -> web.StreamResponse:
        self.generated += 1
        self._on_request("gemini.generate")
        self.requests.clear()  # nothing reads them; keep memory flat
        return await super()._generate(request, rec, stream=stream)


@dataclass(frozen=True)
class Card:
    at: float
    ts: str
    approval_id: str
    text: str
    blocks: list[JSON]


@dataclass(eq=False)
class Conv:
    key: str
    user: str
    channel: str
    ts: str
    placeholder: asyncio.Future[float]
    card: asyncio.Future[Card]
    reply: asyncio.Future[float]
    sent: float = 0.0
    replies: int = 0
    cards: int = 0


def _approve_value(blocks: list[JSON]) -> str:
    for block in blocks:
        if block.get("type") == "actions":
            for element in block.get("elements", []):
                if element.get("action_id") == "approve":
                    return str(element["value"])
    return ""


class Observer:
    """Wraps FakeSlack's handlers: times cards, placeholders and replies per conversation."""

    def __init__(self, slack: FakeSlack) -> None:
        self.by_key: dict[str, Conv] = {}
        self.by_thread: dict[tuple[str, str], Conv] = {}
        self.stray = 0
        self.trace: list[tuple[float, str]] | None = None
        self.last_call = 0.0  # when the service last called Slack or Gemini
        for method, handler in list(slack.handlers.items()):
            slack.handlers[method] = self._wrap(method, handler)

    def note(self, label: str) -> None:
        if self.trace is not None:
            self.trace.append((time.perf_counter(), label))
        if label == "gemini.generate":
            self.last_call = time.perf_counter()

    async def quiesce(self, idle: float = 0.05, limit: float = 10.0) -> None:
        """Wait until the service has called neither Slack nor Gemini for `idle` seconds."""
        deadline = time.perf_counter() + limit
        while time.perf_counter() < deadline:
            quiet = time.perf_counter() - self.last_call
            if quiet >= idle:
                return
            await asyncio.sleep(idle - quiet)

    def _wrap(self, method: str, handler: Callable[[JSON], JSON]) -> Callable[[JSON], JSON]:
        def wrapped(args: JSON) -> JSON:
            at = self.last_call = time.perf_counter()
            if self.trace is not None:
                self.trace.append((at, method))
            result = handler(args)
            if method == "chat.postMessage" and result.get("ok"):
                self._posted(at, args, result)
            return result

        return wrapped

    def add(self, conv: Conv) -> None:
        self.by_key[conv.key] = conv
        self.by_thread[(conv.channel, conv.ts)] = conv

    def forget(self, conv: Conv) -> None:
        self.by_key.pop(conv.key, None)
        self.by_thread.pop((conv.channel, conv.ts), None)

    def _posted(self, at: float, args: JSON, result: JSON) -> None:
        channel = args.get("channel")
        if channel == APPROVERS:
            raw = args.get("blocks") or []
            blocks: list[JSON] = json.loads(raw) if isinstance(raw, str) else raw
            found = KEY.search(json.dumps(blocks))
            conv = self.by_key.get(found.group(0)) if found else None
            if conv is None:
                self.stray += 1
                return
            conv.cards += 1
            if not conv.card.done():
                text = str(args.get("text", ""))
                ts = str(result["ts"])
                conv.card.set_result(Card(at, ts, _approve_value(blocks), text, blocks))
            return
        conv = self.by_thread.get((str(channel), str(args.get("thread_ts"))))
        if conv is None:
            self.stray += 1
        elif args.get("text") == THINKING:
            if not conv.placeholder.done():
                conv.placeholder.set_result(at)
        else:
            conv.replies += 1
            if not conv.reply.done():
                conv.reply.set_result(at)


# -- the process under test ------------------------------------------------------------------


def _proc_cpu(stat: str) -> tuple[str, float, float]:
    """(comm, own utime+stime, reaped children's) in clock ticks, from /proc/<pid>/stat."""
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat.rsplit(")", 1)[1].split()
    own = float(fields[11]) + float(fields[12])
    children = float(fields[13]) + float(fields[14])
    return comm, own, children


TICK = float(os.sysconf("SC_CLK_TCK"))


def postgres_cpu() -> float | None:
    """CPU seconds of every local `postgres` process, plus what the postmaster reaped."""
    total, found = 0.0, False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm, own, children = _proc_cpu((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        if comm.startswith("postgres"):
            found = True
            total += own + children
    return total / TICK if found else None


class ServiceProcess:
    """A bot as a subprocess: started, its port read from the log, its CPU read from /proc."""

    def __init__(self, name: str, module: str, env: dict[str, str], stats_file: Path | None):
        self.name, self.module, self.env, self.stats_file = name, module, env, stats_file
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.levels: Counter[str] = Counter()
        self.problems: list[str] = []
        self.tail: deque[str] = deque(maxlen=60)
        self._reader: asyncio.Task[None] | None = None
        self._seq = 0
        self._tracing = False

    async def start(self, timeout: float = 90.0) -> None:  # noqa: ASYNC109
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self.module,
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            limit=2**20,
        )
        assert self.proc.stderr is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.proc.stderr.readline()
                if not line:
                    await self.proc.wait()
                    tail = "\n".join(self.tail)
                    raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{tail}")
                self._keep(line)
                if found := UP.search(line.decode(errors="replace")):
                    self.port = int(found.group(1))
                    break
        self._reader = asyncio.create_task(self._read_rest())

    def _keep(self, raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip()
        self.tail.append(line)
        if found := LEVEL.search(line):
            self.levels[found.group(1)] += 1
            if len(self.problems) < 20:
                self.problems.append(line[:400])
        elif line.startswith(("Traceback", "    ", "  File")) and len(self.problems) < 40:
            self.problems.append(line[:400])
        elif line and not line[0].isdigit() and len(self.problems) < 40 and self.problems:
            self.problems.append(line[:400])  # an exception's last line

    async def _read_rest(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self._keep(line)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu(self) -> float:
        _, own, _ = _proc_cpu(Path(f"/proc/{self.pid}/stat").read_text())
        return own / TICK

    def sys_cpu(self) -> float:
        """Kernel-mode CPU seconds (stime) alone: syscalls, loopback TCP."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return float(fields[12]) / TICK

    def rss_mb(self) -> float | None:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
        return None

    async def sql_stats(self) -> JSON | None:
        """Ask the service for its SQL counters (SIGUSR1 → $BENCH_STATS_FILE)."""
        if self.stats_file is None or self.proc is None:
            return None
        self.proc.send_signal(signal.SIGUSR1)
        self._seq += 1
        async with asyncio.timeout(10):
            while True:
                with contextlib.suppress(OSError, ValueError):
                    stats: JSON = json.loads(self.stats_file.read_text())
                    if stats["seq"] >= self._seq:
                        self._seq = stats["seq"]
                        return stats
                await asyncio.sleep(0.005)

    async def sql_trace(self) -> list[tuple[float, str]] | None:
        """Toggle the service's SQL trace (SIGUSR2); returns what it recorded when stopping."""
        if self.stats_file is None or self.proc is None:
            return None
        out = self.stats_file.with_suffix(".trace.json")
        stopping = self._tracing
        self._tracing = not stopping
        with contextlib.suppress(OSError):
            out.unlink()
        self.proc.send_signal(signal.SIGUSR2)
        if not stopping:
            await asyncio.sleep(0.05)  # let the handler run before anything is traced
            return None
        async with asyncio.timeout(10):
            while True:
                with contextlib.suppress(OSError, ValueError):
                    return [(at, what) for at, what in json.loads(out.read_text())]
                await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=40)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._reader, timeout=5)


# -- the driver ------------------------------------------------------------------------------


@dataclass
class Outcome:
    ok: bool
    failed_at: str | None = None
    ack: float | None = None
    click: float | None = None
    to_placeholder: float | None = None
    to_card: float | None = None
    to_reply: float | None = None


@dataclass
class Usage:
    """What one phase cost, read before and after it."""

    wall: float = 0.0
    service_cpu: float = 0.0
    service_sys_cpu: float = 0.0
    postgres_cpu: float | None = None
    harness_cpu: float = 0.0
    slack_calls: dict[str, int] = field(default_factory=dict)
    gemini_calls: int = 0
    sql: JSON | None = None

    def per(self, n: int) -> JSON:
        """Per completed conversation."""
        if n <= 0:
            return {}
        out: JSON = {
            "service_cpu_ms": round(self.service_cpu * 1000 / n, 2),
            "service_cpu_kernel_ms": round(self.service_sys_cpu * 1000 / n, 2),
            "postgres_cpu_ms": None
            if self.postgres_cpu is None
            else round(self.postgres_cpu * 1000 / n, 2),
            "harness_cpu_ms": round(self.harness_cpu * 1000 / n, 2),
            "slack_calls": round(sum(self.slack_calls.values()) / n, 2),
            "slack_calls_by_method": {
                k: round(v / n, 2) for k, v in sorted(self.slack_calls.items())
            },
            "gemini_calls": round(self.gemini_calls / n, 2),
        }
        if self.sql is not None:
            sql = self.sql
            statements = sql["statement_total"]
            out["sql"] = {
                "statements": round(statements / n, 2),
                "by_verb": {k: round(v / n, 2) for k, v in sorted(sql["statements"].items())},
                "transactions": round(sql["begins"] / n, 2),
                "pool_checkouts": round(sql["checkouts"] / n, 2),
                "new_connections": round(sql["connects"] / n, 2),
                # asyncpg: BEGIN, each statement and COMMIT/ROLLBACK are one round trip each
                # (connections idle for long are pinged too, but not in a busy benchmark).
                "round_trips_est": round(
                    (statements + sql["begins"] + sql["commits"] + sql["rollbacks"]) / n, 1
                ),
                "statement_ms": round(sql["statement_seconds"] * 1000 / n, 2),
            }
            out["gc"] = {
                "collections_by_generation": sql["gc_count"],
                "pause_ms_per_conversation": round(sum(sql["gc_seconds"]) * 1000 / n, 2),
                "longest_pause_ms": max(sql["gc_longest_ms"]),
            }
        return out


def _sql_delta(before: JSON | None, after: JSON | None) -> JSON | None:
    if before is None or after is None:
        return None
    verbs: Counter[str] = Counter(after["statements"])
    verbs.subtract(before["statements"])
    out: JSON = {k: after[k] - before[k] for k in after if isinstance(after[k], int | float)}
    out["statements"] = {k: v for k, v in verbs.items() if v}
    out["gc_count"] = [a - b for a, b in zip(after["gc_count"], before["gc_count"], strict=True)]
    out["gc_seconds"] = [
        a - b for a, b in zip(after["gc_seconds"], before["gc_seconds"], strict=True)
    ]
    out["gc_longest_ms"] = after["gc_longest_ms"]
    return out


class Driver:
    def __init__(
        self,
        name: str,
        service: ServiceProcess,
        slack: FakeSlack,
        observer: Observer,
        gemini: LoopbackGemini,
        http: aiohttp.ClientSession,
        pool: ProcessPoolExecutor,
        run_id: str,
    ) -> None:
        self.name, self.service, self.slack, self.observer = name, service, slack, observer
        self.gemini, self.http, self.pool = gemini, http, pool
        self.team = f"TB{run_id.upper()}"
        self.deadline = math.inf
        self.completed = 0
        self._n = itertools.count(1)
        self._run_id = run_id

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service.port}/slack/events"

    def new_conv(self) -> Conv:
        n = next(self._n)
        loop = asyncio.get_running_loop()
        conv = Conv(
            key=f"acct{n:07d}",
            user=f"UB{n:07d}",
            channel=f"DB{n:07d}",
            ts=f"1700000000.{n:06d}",
            placeholder=loop.create_future(),
            card=loop.create_future(),
            reply=loop.create_future(),
        )
        self.observer.add(conv)
        return conv

    def dm_payload(self, conv: Conv) -> sp.Payload:
        return sp.message_im_event(
            self.team,
            conv.user,
            conv.channel,
            f"please send 5 to {conv.key}",
            conv.ts,
            event_id=f"Ev{self._run_id}{conv.key}",
        )

    def click_payload(self, card: Card, user: str) -> sp.Payload:
        n = next(self._n)
        return sp.block_actions(
            self.team,
            user,
            APPROVERS,
            card.ts,
            "approve",
            card.approval_id,
            f"trigger-{n}",
            self.slack.response_url(f"click-{n}"),
            block_id="approval",
            message_text=card.text,
            message_blocks=card.blocks,
        )

    async def _post(self, payload: sp.Payload) -> tuple[int, float]:
        started = time.perf_counter()
        status, _ = await sp.post_signed(self.http, self.url, SECRET, *payload)
        return status, time.perf_counter() - started

    async def conversation(self) -> Outcome:
        """DM → card → Approve (by someone else) → reply; None of it may take > CONV_TIMEOUT."""
        conv = self.new_conv()
        out = Outcome(ok=False)
        stage = "dm"
        try:
            limit = max(0.1, min(CONV_TIMEOUT, self.deadline - time.perf_counter()))
            async with asyncio.timeout(limit):
                payload = self.dm_payload(conv)
                conv.sent = time.perf_counter()
                self.observer.note("» DM sent")
                dm_status, out.ack = await self._post(payload)
                self.observer.note("« DM acknowledged")
                stage = "card"
                card = await conv.card
                out.to_card = card.at - conv.sent
                if conv.placeholder.done():
                    out.to_placeholder = conv.placeholder.result() - conv.sent
                stage = "click"
                clicked = time.perf_counter()
                self.observer.note("» Approve clicked")
                click_status, out.click = await self._post(
                    self.click_payload(card, f"UAPPR{conv.key[4:]}")
                )
                self.observer.note("« click acknowledged")
                stage = "reply"
                out.to_reply = await conv.reply - clicked
                out.ok = dm_status == 200 and click_status == 200
                self.completed += out.ok
                if not out.ok:
                    out.failed_at = f"http {dm_status}/{click_status}"
        except TimeoutError:
            out.failed_at = stage
        except aiohttp.ClientError as exc:
            out.failed_at = f"{stage}: {type(exc).__name__}"
        finally:
            self.observer.forget(conv)
        return out

    async def measured(self, body: Callable[[], Awaitable[Any]]) -> tuple[Any, Usage]:
        """Run `body` once the service is quiet, returning its result and what it cost."""
        await self.observer.quiesce(idle=0.2)
        self.slack.calls.clear()
        self.slack.messages.clear()
        sql0 = await self.service.sql_stats()
        gem0 = self.gemini.generated
        db = self.service.stats_file is not None  # the baseline has no database
        cpu0, pg0, own0 = self.service.cpu(), postgres_cpu() if db else None, time.process_time()
        sys0 = self.service.sys_cpu()
        t0 = time.perf_counter()
        result = await body()
        wall = time.perf_counter() - t0
        cpu1, pg1, own1 = self.service.cpu(), postgres_cpu() if db else None, time.process_time()
        sys1 = self.service.sys_cpu()
        sql1 = await self.service.sql_stats()
        usage = Usage(
            wall=wall,
            service_cpu=cpu1 - cpu0,
            service_sys_cpu=sys1 - sys0,
            postgres_cpu=None if pg0 is None or pg1 is None else pg1 - pg0,
            harness_cpu=own1 - own0,
            slack_calls=dict(Counter(c.method for c in self.slack.calls)),
            gemini_calls=self.gemini.generated - gem0,
            sql=_sql_delta(sql0, sql1),
        )
        return result, usage

    # -- phases ------------------------------------------------------------------------

    async def warmup(self, n: int) -> JSON:
        first = await self.conversation()
        rest = [await self.conversation() for _ in range(n - 1)]
        await asyncio.gather(*(self.conversation() for _ in range(10)))  # fill the pools
        return {
            "first_conversation_ok": first.ok,
            "first_message_to_card_ms": None if first.to_card is None else first.to_card * 1000,
            "first_click_to_reply_ms": None if first.to_reply is None else first.to_reply * 1000,
            "ok": sum(o.ok for o in [first, *rest]),
        }

    async def level(self, concurrency: int, rounds: int) -> JSON:
        timeline: list[list[tuple[str, float]]] = []

        async def body() -> list[Outcome]:
            outcomes: list[Outcome] = []
            for _ in range(rounds):
                if time.perf_counter() > self.deadline:
                    break
                if concurrency == 1:
                    outcomes.append(await self._traced(timeline))
                else:
                    outcomes += await asyncio.gather(
                        *(self.conversation() for _ in range(concurrency))
                    )
            return outcomes

        outcomes, usage = await self.measured(body)
        result = summarize(outcomes, usage)
        result["concurrency"], result["rounds"] = concurrency, rounds
        if timeline:
            result["timeline_ms"] = _timeline(timeline)
        return result

    async def _traced(self, timeline: list[list[tuple[str, float]]]) -> Outcome:
        """One conversation with every Slack and Gemini request it caused, timed; the next
        starts once the service is quiet again (the card's last redraw follows the reply)."""
        trace: list[tuple[float, str]] = []
        self.observer.trace = trace
        out = await self.conversation()
        await self.observer.quiesce()
        self.observer.trace = None
        if out.ok and trace:
            start = next((at for at, label in trace if label == "» DM sent"), trace[0][0])
            timeline.append([(label, at - start) for at, label in trace if at >= start])
        return out

    async def detailed_trace(self) -> list[JSON]:
        """One conversation at concurrency 1 with every SQL statement the service ran, merged
        with the Slack and Gemini requests, in time order (ms after the DM was sent)."""
        await self.observer.quiesce()
        await self.service.sql_trace()
        trace: list[tuple[float, str]] = []
        self.observer.trace = trace
        out = await self.conversation()
        await self.observer.quiesce()
        self.observer.trace = None
        sql = await self.service.sql_trace()
        events = sorted(trace + [(at, f"  sql: {what}") for at, what in sql or []])
        start = next((at for at, label in events if label == "» DM sent"), 0.0)
        rows = [{"at_ms": round((at - start) * 1000, 2), "event": label} for at, label in events]
        return rows if out.ok else [{"at_ms": 0, "event": f"failed at {out.failed_at}"}]

    async def saturation(self, workers: int, total: int, limit: float) -> JSON:
        left = total
        deadline = min(time.perf_counter() + limit, self.deadline)

        async def worker() -> list[Outcome]:
            nonlocal left
            done: list[Outcome] = []
            while left > 0 and time.perf_counter() < deadline:
                left -= 1
                done.append(await self.conversation())
            return done

        async def body() -> list[Outcome]:
            per_worker = await asyncio.gather(*(worker() for _ in range(workers)))
            return [o for outs in per_worker for o in outs]

        outcomes, usage = await self.measured(body)
        result = summarize(outcomes, usage)
        done = result["completed"]
        result["workers"] = workers
        result["conversations_per_s"] = round(done / usage.wall, 2) if usage.wall else None
        result["agent_turns_per_s"] = round(2 * done / usage.wall, 2) if usage.wall else None
        result["service_cpu_utilisation"] = round(usage.service_cpu / usage.wall, 2)
        result["service_rss_mb"] = self.service.rss_mb()
        return result

    async def burst(self, events: int, rate: float, drain_limit: float) -> JSON:
        convs = [self.new_conv() for _ in range(events)]
        bodies = [(p.body, p.content_type) for p in map(self.dm_payload, convs)]
        loop = asyncio.get_running_loop()
        send_limit = events / rate + 30.0

        async def body() -> tuple[list[_load.Result], float]:
            sent = await loop.run_in_executor(
                self.pool, _load.post_all, self.url, SECRET, bodies, rate, send_limit
            )
            for conv, (at, _, _) in zip(convs, sent, strict=True):
                conv.sent = at
            await asyncio.wait([c.card for c in convs], timeout=drain_limit)
            return sent, time.perf_counter()

        (sent, finished), usage = await self.measured(body)
        acks = [lat for _, status, lat in sent if status == 200]
        carded = [c for c in convs if c.card.done() and c.sent > 0]  # sent: not cancelled
        to_card = [c.card.result().at - c.sent for c in carded]
        first_sent = min((at for at, _, _ in sent if at), default=finished)
        last_card = max((c.card.result().at for c in carded), default=finished)
        for conv in convs:
            self.observer.forget(conv)
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

    async def contention(self, clicks: int, ledger: Path | None, db_url: str | None) -> JSON:
        conv = self.new_conv()
        try:
            async with asyncio.timeout(CONV_TIMEOUT):
                await self._post(self.dm_payload(conv))
                card = await conv.card
        except TimeoutError:
            self.observer.forget(conv)
            return {"error": "no card within the time limit"}
        bodies = [
            (p.body, p.content_type)
            for p in (self.click_payload(card, f"UCLICK{i:04d}") for i in range(clicks))
        ]
        loop = asyncio.get_running_loop()

        def refusals() -> int:
            return sum(c.method == "chat.postEphemeral" for c in self.slack.calls)

        async def body() -> tuple[list[_load.Result], float | None]:
            sent = await loop.run_in_executor(
                self.pool, _load.post_all, self.url, SECRET, bodies, None, 30.0
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
        (sent, reply_ms), usage = await self.measured(body)
        self.observer.forget(conv)
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
        return result


def summarize(outcomes: Sequence[Outcome], usage: Usage) -> JSON:
    ok = [o for o in outcomes if o.ok]

    def vals(name: str) -> list[float]:
        return [v for o in ok if (v := getattr(o, name)) is not None]

    failures = Counter(o.failed_at or "?" for o in outcomes if not o.ok)
    return {
        "conversations": len(outcomes),
        "completed": len(ok),
        "failures": dict(failures),
        "ack_ms": dist_ms(vals("ack")),
        "message_to_placeholder_ms": dist_ms(vals("to_placeholder")),
        "message_to_card_ms": dist_ms(vals("to_card")),
        "click_ack_ms": dist_ms(vals("click")),
        "click_to_reply_ms": dist_ms(vals("to_reply")),
        "wall_s": round(usage.wall, 2),
        "per_conversation": usage.per(len(ok)),
    }


def _timeline(traces: list[list[tuple[str, float]]]) -> list[JSON]:
    """Median offset of each request a conversation causes (nth call of a method), in order."""
    by_step: dict[str, list[float]] = {}
    for trace in traces:
        seen: Counter[str] = Counter()
        for label, offset in trace:
            seen[label] += 1
            by_step.setdefault(f"{label} #{seen[label]}", []).append(offset)
    steps = [
        {"step": step, "at_ms": round(statistics.median(v) * 1000, 1), "n": len(v)}
        for step, v in by_step.items()
    ]
    return sorted(steps, key=lambda s: s["at_ms"])


def _ledger_runs(ledger: Path, approval_id: str) -> int:
    if not ledger.exists():
        return 0
    runs = 0
    for line in ledger.read_text().splitlines():
        if line and json.loads(line).get("key") == approval_id:
            runs += 1
    return runs


async def _audited(db_url: str, approval_id: str) -> int:
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


# -- running it all --------------------------------------------------------------------------


SERVICE_ENV: dict[str, str] = {}  # --service-env KEY=VALUE: experiments (e.g. BENCH_UVLOOP=1)


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


async def bench_target(
    name: str,
    module: str,
    plan: Plan,
    *,
    database_url: str | None,
    pool: ProcessPoolExecutor,
    profile: str | None,
    log: Callable[[str], None],
) -> JSON:
    """Every phase against one bot (`bench.serve` or `bench.baseline`).

    `profile`: "py-spy" samples the service during saturation (and traces one conversation's
    SQL); "cprofile" runs the service under cProfile and only warms up, traces one
    conversation and saturates, since the profiler slows everything else down.
    """
    run_id = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(dir=_scratch()) as tmp:
        ledger = Path(tmp) / "ledger.jsonl"
        stats_file = Path(tmp) / "sql-stats.json" if database_url else None
        extra = {"GREENLIGHT_TEST_LEDGER": str(ledger)}
        if database_url is not None:
            extra |= {
                "DATABASE_URL": database_url,
                "MIGRATE_ON_START": "false",
                "RECOVERY_INTERVAL_SECONDS": "3600",
                "BENCH_STATS_FILE": str(stats_file),
            }
        if profile == "cprofile":
            CPROFILE_OUT.unlink(missing_ok=True)
            extra["BENCH_CPROFILE"] = str(CPROFILE_OUT)
        slack = FakeSlack()
        await slack.start()
        observer = Observer(slack)
        gemini = LoopbackGemini(observer.note)
        await gemini.__aenter__()
        service = ServiceProcess(name, module, _env(slack, gemini, extra), stats_file)
        connector = aiohttp.TCPConnector(limit=0)
        result: JSON = {}
        driver: Driver | None = None
        try:
            await service.start()
            async with aiohttp.ClientSession(connector=connector) as http:
                driver = Driver(name, service, slack, observer, gemini, http, pool, run_id)
                driver.deadline = time.perf_counter() + plan.budget

                def over(phase: str) -> bool:
                    if time.perf_counter() < driver.deadline:
                        return False
                    result.setdefault("skipped_over_budget", []).append(phase)
                    log(f"[{name}] over the {plan.budget:g} s budget: skipping {phase}")
                    return True

                log(f"[{name}] warm-up")
                result["warmup"] = await driver.warmup(plan.warmup)
                if profile and database_url is not None:
                    result["trace"] = await driver.detailed_trace()
                result["levels"] = {}
                for concurrency, rounds in plan.levels:
                    if profile == "cprofile" or over(f"level {concurrency}"):
                        continue
                    log(f"[{name}] {concurrency} concurrent x {rounds} rounds")
                    result["levels"][str(concurrency)] = await driver.level(concurrency, rounds)
                if not over("saturation"):
                    log(f"[{name}] saturation: {plan.saturation_total} conversations")
                    spy = _start_py_spy(service.pid) if profile == "py-spy" else None
                    result["saturation"] = await driver.saturation(
                        plan.saturation_workers, plan.saturation_total, plan.saturation_limit
                    )
                    if spy is not None:
                        result["py_spy"] = _stop_py_spy(spy)
                if profile == "cprofile":
                    return result
                # The last two phases are bounded on their own (send and drain limits).
                driver.deadline = math.inf
                log(f"[{name}] burst: {plan.burst_events} events at {plan.burst_rate:g}/s")
                result["burst"] = await driver.burst(
                    plan.burst_events, plan.burst_rate, plan.burst_drain_limit
                )
                log(f"[{name}] contention: {plan.clicks} clicks on one card")
                result["contention"] = await driver.contention(plan.clicks, ledger, database_url)
                result["stray_slack_posts"] = observer.stray
        finally:
            await service.stop()
            await gemini.__aexit__(None, None, None)
            await slack.stop()
            result["service_log"] = {"levels": dict(service.levels), "problems": service.problems}
            if profile == "cprofile" and CPROFILE_OUT.exists():
                from bench.profile import summarize_pstats

                done = driver.completed if driver is not None else 0
                result["cprofile"] = summarize_pstats(CPROFILE_OUT, done) | {
                    "raw": str(CPROFILE_OUT)
                }
        return result


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


# -- reporting -------------------------------------------------------------------------------


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def targets(ours: JSON) -> dict[str, JSON]:
    """The issue's targets, each with the measured value and whether it is met."""

    def check(value: Any, limit: float, *, strict: bool = False) -> JSON:
        met = value is not None and (value < limit if strict else value <= limit)
        return {"value": value, "limit": limit, "met": met}

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
    }


def ratios(ours: JSON, base: JSON) -> JSON:
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


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"
    return str(v)


def table(result: JSON) -> str:
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
    row("SQL transactions / conversation", "saturation", "per_conversation", "sql", "transactions")
    row("SQL round trips / conv (est.)", "saturation", "per_conversation", "sql", "round_trips_est")
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
        lines.append(f"{label:<{width}}{_fmt(a):>12}{_fmt(b):>12}{r:>8}")
    lines.append("")
    for name, t in result["targets"].items():
        verdict = "met" if t["met"] else "MISSED"
        lines.append(f"target {name}: {verdict} ({_fmt(t['value'])} vs {t['limit']})")
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


async def run(
    database_url: str | None = None,
    *,
    quick: bool = False,
    target: str = "both",
    profile: str | None = None,
) -> JSON:
    """Run every phase against Greenlight and/or the baseline (`target`: both, ours,
    baseline); print the table and write bench/results-bot.json."""
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
        if target in ("both", "ours"):
            async with temporary_database(database_url) as url:
                result["greenlight"] = await bench_target(
                    "greenlight", "bench.serve", plan, database_url=url, pool=pool,
                    profile=profile, log=log,
                )  # fmt: skip
        if target in ("both", "baseline"):
            result["baseline"] = await bench_target(
                "baseline", "bench.baseline", plan, database_url=None, pool=pool,
                profile=None, log=log,
            )  # fmt: skip
    if "greenlight" in result and "baseline" in result:
        result["ratios_ours_over_baseline"] = ratios(result["greenlight"], result["baseline"])
    result["targets"] = targets(result.get("greenlight") or {})
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(table(result))
    ours = result.get("greenlight") or {}
    if "py_spy" in ours or "cprofile" in ours:
        from bench.profile import render, render_pstats

        if "py_spy" in ours:
            print("\npy-spy during saturation (wall-clock samples; see bench/profile.py):")
            print(render(ours["py_spy"]))
        if "cprofile" in ours:
            print("\n" + render_pstats(ours["cprofile"]))
    out = RESULTS if profile != "cprofile" else PROFILE_DIR / "greenlight-bench-profile.json"
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
        choices=("py-spy", "cprofile"),
        help="py-spy: sample the service during saturation; cprofile: a profiling run only "
        "(warm-up, saturation). Both print one conversation's SQL trace.",
    )
    parser.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the bot under test (an experiment, e.g. BENCH_UVLOOP=1)",
    )
    args = parser.parse_args()
    SERVICE_ENV.update(item.split("=", 1) for item in args.service_env)
    asyncio.run(run(args.database_url, quick=args.quick, target=args.target, profile=args.profile))


if __name__ == "__main__":
    main()
