"""Recovery time: a bot killed while the model answers after an approved tool ran, and a
replacement process that finishes the turn.

    python -m bench.recovery [--runs 3] [--stop-runs 1] [--database-url URL]

Each run starts `python -m bot` on default settings (against the fake Slack and Gemini of
tests/fakes and PostgreSQL on 127.0.0.1), asks for a transfer, approves it, and stops the bot
while the model is still answering: SIGKILL (`--runs`), or SIGTERM with the model slower than
the shutdown grace (`--stop-runs`). It then starts a replacement and times from its /healthz
first answering 200 to the turn's reply in the thread. The README's promise: 30 s after a
SIGKILL, 10 s after a SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

from bench.database import temporary_database
from bot.settings import SHUTDOWN_GRACE
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, function_call, text
from tests.fakes.slack_api import Call, FakeSlack

RESULTS = Path(__file__).parent / "results-recovery.json"
REPO = Path(__file__).resolve().parents[1]
SECRET = "bench-signing-secret"
APPROVERS = "C0APPROVE"
DM = "D0BENCH"
TEAM = "T0BENCH"
TARGETS = {"SIGKILL": 30.0, "SIGTERM": 10.0}
TRANSFER = {"amount": 500, "toAccount": "12345"}
DEADLINE = 90.0  # seconds any one step may take before the run is reported as failed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _in(channel: str, ts: str | None = None) -> Any:
    return lambda c: c.args.get("channel") == channel and ts in (None, c.args.get("thread_ts"))


class Bot:
    """One `python -m bot` process on default lease and sweep settings."""

    def __init__(self, slack: FakeSlack, gemini: FakeGemini, database: str, log: Path) -> None:
        self.port = _free_port()
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("GENKIT_ENV", "RESUME_LEASE_SECONDS", "RECOVERY_INTERVAL_SECONDS")
        }
        self.env.update(
            SLACK_BOT_TOKEN="xoxb-bench",
            SLACK_SIGNING_SECRET=SECRET,
            SLACK_API_URL=slack.base_url,
            GEMINI_API_KEY="k",
            GEMINI_API_URL=gemini.base_url,
            DATABASE_URL=database,
            PORT=str(self.port),
            AGENT_TOOLS="tests.ledger_tools",
            APPROVER_CHANNEL=APPROVERS,
            GREENLIGHT_TEST_LEDGER=str(log.with_suffix(".ledger")),
            PYTHONPATH=str(REPO),
        )
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slack/events"

    async def start(self, http: aiohttp.ClientSession) -> float:
        """Start it; the monotonic time its /healthz first answered 200."""
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bot",
                env=self.env,
                cwd=str(REPO),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        health = f"http://127.0.0.1:{self.port}/healthz"
        async with asyncio.timeout(DEADLINE):
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"the bot exited on start; see {self.log}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(health, timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return time.monotonic()
                await asyncio.sleep(0.05)  # poll until it answers

    async def stop(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)
            async with asyncio.timeout(SHUTDOWN_GRACE + 30):
                await self.proc.wait()


@contextlib.asynccontextmanager
async def bot(slack: FakeSlack, gemini: FakeGemini, database: str, log: Path) -> AsyncIterator[Bot]:
    process = Bot(slack, gemini, database, log)
    try:
        yield process
    finally:
        await process.stop(signal.SIGKILL)


async def one_run(
    sig: signal.Signals, run: int, database: str, tmp: Path, http: aiohttp.ClientSession
) -> dict[str, float]:
    """Stop a bot with `sig` while the model answers; time its replacement's recovery."""
    ts = f"{int(time.time())}.{run:06d}"
    slow = SHUTDOWN_GRACE + 60 if sig == signal.SIGTERM else 60  # still answering when stopped
    async with FakeSlack(ts_start=int(time.time())) as slack, FakeGemini() as gemini:
        slack.channels[APPROVERS] = {"is_private": True}
        gemini.script(
            function_call("transferMoney", TRANSFER, id="call-1"),
            text("Sent (first process).", delay=slow),
            text("Sent 500 to 12345."),
        )
        log = tmp / f"{sig.name}-{run}.log"
        async with bot(slack, gemini, database, log) as first:
            await first.start(http)
            dm = sp.message_im_event(TEAM, "UEMP", DM, "send 500 to 12345", ts)
            assert (await sp.post_signed(http, first.url, SECRET, *dm))[0] == 200
            (card,) = await slack.wait_for(
                "chat.postMessage", predicate=_in(APPROVERS), timeout=DEADLINE
            )
            approval_id = _approve_value(card)
            click = sp.block_actions(
                TEAM,
                "UBOSS",
                APPROVERS,
                "1700000000.000100",
                "approve",
                approval_id,
                "trigger-1",
                slack.response_url("click"),
                block_id="approval",
                message_blocks=card.args.get("blocks"),
            )
            assert (await sp.post_signed(http, first.url, SECRET, *click))[0] == 200
            await _until(lambda: len(gemini.generate_requests()) == 2)  # the model answers
            stopped = time.monotonic()
            await first.stop(sig)
            stop_took = time.monotonic() - stopped
        async with bot(slack, gemini, database, log) as second:
            up = await second.start(http)
            await slack.wait_for(
                "chat.postMessage", count=2, predicate=_in(DM, ts), timeout=DEADLINE
            )
            done = time.monotonic()
            await second.stop(signal.SIGTERM)
    ran = [json.loads(line) for line in log.with_suffix(".ledger").read_text().splitlines()]
    if len(ran) != 1:
        raise RuntimeError(f"the tool ran {len(ran)} times; see {log}")
    return {
        "replacement_up_to_reply_s": round(done - up, 2),
        "stop_to_reply_s": round(done - stopped, 2),
        "stop_took_s": round(stop_took, 2),
    }


async def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {DEADLINE}s")
        await asyncio.sleep(0.05)


def _approve_value(card: Call) -> str:
    for block in card.args.get("blocks") or []:
        for element in block.get("elements") or []:
            if element.get("action_id") == "approve":
                return str(element["value"])
    raise RuntimeError("no Approve button on the card")


async def run(database_url: str | None, runs: int = 3, stop_runs: int = 1) -> dict[str, Any]:
    result: dict[str, Any] = {}
    # The first process's model call is cut off mid-answer, by design: not worth a traceback.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="greenlight-recovery-") as tmp:
        async with temporary_database(database_url) as database, aiohttp.ClientSession() as http:
            for sig, count in ((signal.SIGKILL, runs), (signal.SIGTERM, stop_runs)):
                if count == 0:
                    continue
                rows = [await one_run(sig, i, database, Path(tmp), http) for i in range(count)]
                times = [r["replacement_up_to_reply_s"] for r in rows]
                target = TARGETS[sig.name]
                result[sig.name] = {
                    "runs": rows,
                    "replacement_up_to_reply_s": {
                        "median": round(statistics.median(times), 2),
                        "max": max(times),
                    },
                    "target_s": target,
                    "met": max(times) <= target,
                }
                print(
                    f"after {sig.name}: replacement up -> turn completed "
                    f"{', '.join(f'{t:.1f}' for t in times)} s (max {max(times):.1f}, "
                    f"target <= {target:.0f}: {'met' if max(times) <= target else 'MISSED'}); "
                    f"stop -> completed {', '.join(str(r['stop_to_reply_s']) for r in rows)} s",
                    flush=True,
                )
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="SIGKILL runs")
    parser.add_argument("--stop-runs", type=int, default=1, help="SIGTERM runs (each 25 s+)")
    parser.add_argument("--database-url", help="an existing PostgreSQL database to use")
    args = parser.parse_args()
    asyncio.run(run(args.database_url, args.runs, args.stop_runs))


if __name__ == "__main__":
    main()
