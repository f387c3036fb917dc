"""What every phase of the bot benchmark (bench/bot.py) shares.

The plan (how many rounds of what), percentiles, the fakes the service talks to (a FakeSlack
whose handlers an Observer wraps to time each conversation's placeholder, card and reply; a
FakeGemini that answers at once and never runs out of script), the service as a subprocess
with its CPU read from /proc, and the Driver: one conversation end to end, and what a phase
cost (CPU, SQL, Slack and Gemini calls) read before and after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import gemini as fg, slack_payloads as sp
from tests.fakes.gemini import FakeGemini, RecordedRequest
from tests.fakes.slack_api import FakeSlack

ROOT = Path(__file__).resolve().parent.parent

SECRET = "bench-signing-secret"
APPROVERS = "C0BENCHAPPR"
THINKING = "_Thinking…_"
KEY = re.compile(r"acct\d{7}")
UP = re.compile(r"is up \(HTTP\b[^)]*?:(\d+)\)")
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
    """FakeGemini with a reply function that never runs out, at zero latency unless told
    (`delay`: seconds before each answer starts, a real model's thinking)."""

    def __init__(self, on_request: Callable[[str], None], *, delay: float = 0.0) -> None:
        super().__init__()
        self._script = _Forever([model_reply])
        self._on_request = on_request
        self._delay = delay
        self.generated = 0

    async def _generate(
        self, request: web.Request, rec: RecordedRequest, *, stream: bool
    ) -> web.StreamResponse:
        self.generated += 1
        self._on_request("gemini.generate")
        self.requests.clear()  # nothing reads them; keep memory flat
        if self._delay:
            await asyncio.sleep(self._delay)
        return await super()._generate(request, rec, stream=stream)


@dataclass(frozen=True)
class Card:
    at: float
    ts: str
    value: str  # its Approve button's: `<approval id>~<version>` (Greenlight), an id (baseline)
    text: str
    blocks: list[JSON]

    @property
    def approval_id(self) -> str:
        """The approval the card is about: what the tool gets as its key (the ledger's
        `key`) and what the audit trail names; not the button's value, which names the
        version too."""
        return self.value.split("~")[0]


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
        self.streams: dict[str, Conv] = {}  # a streaming reply's ts: its conversation
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
            elif method == "chat.startStream" and result.get("ok"):  # a reply streams
                conv = self.by_thread.get((str(args.get("channel")), str(args.get("thread_ts"))))
                if conv is not None:
                    self.streams[str(result["ts"])] = conv
            elif method == "chat.stopStream" and result.get("ok"):  # ... and is whole now
                conv = self.streams.pop(str(args.get("ts")), None)
                if conv is None:
                    self.stray += 1
                else:
                    self._replied(conv, at)
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
            self._replied(conv, at)

    @staticmethod
    def _replied(conv: Conv, at: float) -> None:
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
                # The service's timers' (bench/serve.py TIMERS): by the clock, not per
                # conversation; shown per conversation only to compare with the above.
                "timer_statements": round(sql.get("timer_statements", 0) / n, 2),
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
    for key in ("kinds", "kind_seconds", "slack", "slack_seconds"):
        diff: Counter[str] = Counter(after.get(key) or {})
        diff.subtract(before.get(key) or {})
        out[key] = {k: v for k, v in diff.items() if v}
    return out


WORKSPACE = 6_000  # requesters (and as many approvers) users.list lists: a bot's runs use fewer


def team_of(run_id: str) -> str:
    """The workspace a bot's conversations are in."""
    return f"TB{run_id.upper()}"


def workspace(people: int = WORKSPACE) -> list[str]:
    """Everyone the Driver's conversations name (requesters and approvers), as users.list
    lists them: so Greenlight's people directory knows them, as it knows a real
    workspace's people (synced at start-up), and asks users.info of none."""
    return [f"UB{n:07d}" for n in range(1, people + 1)] + [
        f"UAPPR{n:07d}" for n in range(people + 1)
    ]


class Driver:
    """Conversations against one bot, and what a phase of them cost; the phases take it."""

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
        self.team = team_of(run_id)
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

    def approver(self, conv: Conv) -> str:
        n = int(conv.key[4:])
        return f"UAPPR{n:07d}"  # someone new every conversation

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
            card.value,
            f"trigger-{n}",
            self.slack.response_url(f"click-{n}"),
            block_id="approval",
            message_text=card.text,
            message_blocks=card.blocks,
        )

    async def post(self, payload: sp.Payload) -> tuple[int, float]:
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
                dm_status, out.ack = await self.post(payload)
                self.observer.note("« DM acknowledged")
                stage = "card"
                card = await conv.card
                out.to_card = card.at - conv.sent
                if conv.placeholder.done():
                    out.to_placeholder = conv.placeholder.result() - conv.sent
                stage = "click"
                clicked = time.perf_counter()
                self.observer.note("» Approve clicked")
                click_status, out.click = await self.post(
                    self.click_payload(card, self.approver(conv))
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

    async def warmup(self, n: int) -> JSON:
        """The first conversation (the cold one) on its own, then the service's pools filled."""
        first = await self.conversation()
        rest = [await self.conversation() for _ in range(n - 1)]
        await asyncio.gather(*(self.conversation() for _ in range(10)))  # fill the pools
        return {
            "first_conversation_ok": first.ok,
            "first_message_to_card_ms": None if first.to_card is None else first.to_card * 1000,
            "first_click_to_reply_ms": None if first.to_reply is None else first.to_reply * 1000,
            "ok": sum(o.ok for o in [first, *rest]),
        }


def summarize(outcomes: Sequence[Outcome], usage: Usage) -> JSON:
    """A phase's conversations: how many completed, their latencies, and the cost per one."""
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
