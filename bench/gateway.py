"""The gateway: what an allowed MCP call costs over calling the tool directly, and what 200
calls waiting for approval cost the one process that holds them.

    python -m bench.gateway [--calls 300] [--pending 200] [--database-url URL]

The bot runs as `python -m bot` (a subprocess, on the fakes and a temporary database); the
MCP client is the mcp SDK's own streamable HTTP client, in this process, over one session.
"Directly" is the same tool run in this process through Genkit's `run_tool_request`, as the
gateway runs it: the overhead is HTTP, MCP, the key, the message limit and policy. The
target is under 5 ms at p50. Then `--pending` calls of a tool that needs approval are made
at once and held; the bot's resident memory and open file descriptors are read before and
while they wait, and its CPU over a few seconds of waiting (the decision poll, the leases).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
from genkit import Genkit, Part, ToolRequest
from genkit._ai._tools import run_tool_request
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation

from agent.clock import new_uuid, utc_now
from agent.keys import ApiKeys
from bench.bot import _env, _scratch
from bench.database import temporary_database
from bench.harness import APPROVERS, JSON, LoopbackGemini, ServiceProcess, pct
from storage.db import make_engine, make_session_factory
from tests import ledger_tools
from tests.fakes.slack_api import FakeSlack

RESULTS = Path(__file__).parent / "results-gateway.json"
TARGET_MS = 5.0
HOLD_SECONDS = 5.0  # how long the pending calls' CPU is read for
OWNER = "UBENCHOWNER"


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _ms(values: list[float]) -> JSON:
    def at(q: float) -> float | None:
        v = pct(values, q)
        return None if v is None else round(v * 1000, 3)

    return {"p50": at(0.5), "p95": at(0.95), "p99": at(0.99), "n": len(values)}


async def direct(calls: int) -> list[float]:
    """The tool called in this process, as the gateway calls it."""
    ai = Genkit()
    tool = next(t for t in ledger_tools.register(ai) if t.name == "getBalance")
    action = tool.action()
    times = []
    for i in range(calls):
        part = Part(tool_request=ToolRequest(name="getBalance", input={"account": f"A{i}"}))
        started = time.perf_counter()
        await run_tool_request(tool=action, tool_request_part=part)
        times.append(time.perf_counter() - started)
    return times


@contextlib.asynccontextmanager
async def session(port: int, token: str, connections: int = 10) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30.0, read=600.0),
        limits=httpx2.Limits(max_connections=connections, max_keepalive_connections=connections),
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        info = Implementation(name="bench", version="1")
        async with Client(streamable_http_client(url, http_client=http), client_info=info) as c:
            yield c
    finally:
        await http.aclose()


async def through(port: int, token: str, calls: int) -> list[float]:
    """Allowed calls, one after another, over one session (the first 20 warm up)."""
    times = []
    async with session(port, token) as mcp:
        for i in range(calls + 20):
            started = time.perf_counter()
            result = await mcp.call_tool("getBalance", {"account": f"G{i}"})
            took = time.perf_counter() - started
            assert not result.is_error, result
            if i >= 20:
                times.append(took)
    return times


async def pending(service: ServiceProcess, slack: FakeSlack, port: int, token: str, n: int) -> JSON:
    """`n` calls waiting for approval at once: the bot's memory, descriptors and CPU."""
    rss_before, fds_before = service.rss_mb(), _fds(service.pid)
    async with session(port, token, connections=n + 10) as mcp:
        calls = [
            asyncio.create_task(mcp.call_tool("transferMoney", {"amount": 1, "toAccount": f"P{i}"}))
            for i in range(n)
        ]
        deadline = time.perf_counter() + 120
        while len(slack.calls_to("chat.postMessage")) < n:
            if time.perf_counter() > deadline:
                raise RuntimeError("the pending calls' cards did not all come within 120 s")
            await asyncio.sleep(0.1)
        cpu = service.cpu()
        await asyncio.sleep(HOLD_SECONDS)  # what holding them costs, measured over a while
        cpu_per_s = (service.cpu() - cpu) / HOLD_SECONDS
        rss_held, fds_held = service.rss_mb(), _fds(service.pid)
        assert not any(c.done() for c in calls), "a pending call ended early"
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
    per = None
    if rss_before is not None and rss_held is not None:
        per = round((rss_held - rss_before) * 1024 / n, 1)
    return {
        "pending": n,
        "before": {"rss_mb": rss_before, "fds": fds_before},
        "held": {"rss_mb": rss_held, "fds": fds_held},
        "rss_kb_per_pending_call": per,
        "fds_per_pending_call": round((fds_held - fds_before) / n, 2),
        "service_cpu_share_while_held": round(cpu_per_s, 4),
    }


async def run(database_url: str | None = None, calls: int = 300, n_pending: int = 200) -> JSON:
    with tempfile.TemporaryDirectory(dir=_scratch()) as tmp:
        os.environ["GREENLIGHT_TEST_LEDGER"] = str(Path(tmp) / "ledger.jsonl")
        policy = Path(tmp) / "policy.yml"
        policy.write_text("allow: [getBalance]\n")
        async with temporary_database(database_url) as url, FakeSlack() as slack:
            slack.channels[APPROVERS] = {"is_private": True}
            gemini = LoopbackGemini(lambda _: None)
            await gemini.__aenter__()
            env = _env(slack, gemini, {}) | {
                "DATABASE_URL": url,
                "MIGRATE_ON_START": "false",
                "POLICY_FILE": str(policy),
                "GREENLIGHT_TEST_LEDGER": os.environ["GREENLIGHT_TEST_LEDGER"],
                "USER_MESSAGES_PER_MINUTE": "100000",
                "LOG_LEVEL": "WARNING",
            }
            service = ServiceProcess("gateway", "bot", env | {"LOG_LEVEL": "INFO"}, None)
            engine = make_engine(url)
            try:
                keys = ApiKeys(make_session_factory(engine), clock=utc_now, new_id=new_uuid)
                token = (await keys.create(slack.team_id, OWNER, "bench")).token
                await service.start()
                ours = await through(service.port, token, calls)
                theirs = await direct(calls)
                held = await pending(service, slack, service.port, token, n_pending)
            finally:
                await service.stop()
                await engine.dispose()
                await gemini.__aexit__(None, None, None)
    return report(ours, theirs, held)


def report(ours: list[float], theirs: list[float], held: JSON) -> JSON:
    overhead = (statistics.median(ours) - statistics.median(theirs)) * 1000
    result: JSON = {
        "allowed_call": {
            "through_gateway_ms": _ms(ours),
            "direct_ms": _ms(theirs),
            "overhead_ms_p50": round(overhead, 3),
            "target_ms": TARGET_MS,
            "met": overhead < TARGET_MS,
        },
        "pending": held,
        "load_average_1m": round(os.getloadavg()[0], 2),  # the machine's, as measured
    }
    verdict = "met" if result["allowed_call"]["met"] else "MISSED"
    print(
        f"allowed MCP call: p50 {_ms(ours)['p50']} ms through the gateway, "
        f"{_ms(theirs)['p50']} ms direct: overhead {overhead:.2f} ms "
        f"(target < {TARGET_MS:g} ms: {verdict}; load average {os.getloadavg()[0]:.1f})"
    )
    print(
        f"{held['pending']} pending calls held: RSS {held['before']['rss_mb']} -> "
        f"{held['held']['rss_mb']} MB ({held['rss_kb_per_pending_call']} KB each), "
        f"fds {held['before']['fds']} -> {held['held']['fds']}, "
        f"CPU {held['service_cpu_share_while_held'] * 100:.1f}% of a core while they wait"
    )
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--pending", type=int, default=200)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    asyncio.run(run(args.database_url, args.calls, args.pending))


if __name__ == "__main__":
    main()
