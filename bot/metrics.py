"""Prometheus metrics, served at GET /metrics (bot/routes.py).

Counters and histograms are this process's (Prometheus sums replicas); the pending gauge is
read from the database at each scrape, so every replica reports the same truth. One
`CollectorRegistry` per service, never the global one: two services in one process (the
tests) count apart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent.observer import DecisionOutcome, ExecutionOutcome, Observer, TurnOutcomeName

log = logging.getLogger(__name__)

PENDING_TIMEOUT = 2.0  # seconds the pending count may take before a scrape goes without it
# A decision takes seconds (a click) to a day (APPROVAL_TIMEOUT_SECONDS' default).
DECISION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 8 * 3600, 86400)
TURN_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)


class Metrics(Observer):
    """Greenlight's metrics: the workflow's observer (agent/observer.py), Slack's error
    counter (bot/app.py), and the gauges read at scrape time."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry = registry or CollectorRegistry()
        self._pending = Gauge(
            "greenlight_approvals_pending",
            "Requests waiting for a decision now, by tool (all workspaces; from the database)",
            ["tool"],
            registry=registry,
        )
        self._decisions = Counter(
            "greenlight_decisions_total",
            "Requests settled, by tool and outcome (approved, denied, expired, answered, "
            "withdrawn, standing: approved by a standing approval as it was made)",
            ["tool", "outcome"],
            registry=registry,
        )
        self._decision_seconds = Histogram(
            "greenlight_decision_seconds",
            "Seconds from a request to its decision, by outcome",
            ["outcome"],
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        self._executions = Counter(
            "greenlight_tool_executions_total",
            "Approved calls that ended, by tool and outcome (ok, error, unknown)",
            ["tool", "outcome"],
            registry=registry,
        )
        self._turns = Counter(
            "greenlight_turns_total",
            "Turns ended, by outcome (reply, awaiting_approval, busy, failed, answered)",
            ["outcome"],
            registry=registry,
        )
        self._turn_seconds = Histogram(
            "greenlight_turn_seconds",
            "Seconds a turn ran the agent for (a message's or a resume's)",
            buckets=TURN_BUCKETS,
            registry=registry,
        )
        self._queue, self._db_in_use = _process_gauges(registry)
        self._slack_errors = Counter(
            "greenlight_slack_api_errors_total",
            "Error answers of Slack's Web API (each attempt), by method and error",
            ["method", "error"],
            registry=registry,
        )
        self._gateway = Counter(
            "greenlight_gateway_calls_total",
            "Calls through the gateway, by door (mcp, api) and outcome",
            ["door", "outcome"],
            registry=registry,
        )
        self._tools: set[str] = set()

    # -- the workflow's observer ---------------------------------------------------------

    def decided(self, tool: str, outcome: DecisionOutcome, seconds: float) -> None:
        self._decisions.labels(tool, outcome).inc()
        self._decision_seconds.labels(outcome).observe(max(seconds, 0.0))

    def executed(self, tool: str, outcome: ExecutionOutcome) -> None:
        self._executions.labels(tool, outcome).inc()

    def gateway_call(self, door: str, outcome: str) -> None:
        self._gateway.labels(door, outcome).inc()

    def turn_ended(self, outcome: TurnOutcomeName, seconds: float | None) -> None:
        self._turns.labels(outcome).inc()
        if seconds is not None:
            self._turn_seconds.observe(max(seconds, 0.0))

    # -- Slack -----------------------------------------------------------------------------

    def slack_api_error(self, method: str, error: str) -> None:
        self._slack_errors.labels(method, error).inc()

    # -- at scrape time --------------------------------------------------------------------

    def queue_depth_from(self, depth: Callable[[], int]) -> None:
        self._queue.set_function(depth)

    def db_connections_from(self, in_use: Callable[[], int]) -> None:
        self._db_in_use.set_function(in_use)

    def known_tools(self, tools: Iterable[str]) -> None:
        """Tools reported as 0 pending when none of their requests waits."""
        self._tools.update(tools)

    async def render(self, pending: Callable[[], Awaitable[dict[str, int]]]) -> bytes:
        """The text exposition, the pending gauge read from the database first; left out
        when the database does not answer within PENDING_TIMEOUT (a scrape never hangs)."""
        try:
            async with asyncio.timeout(PENDING_TIMEOUT):
                counts = await pending()
        except Exception:
            log.warning("metrics: could not count pending approvals", exc_info=True)
            self._pending.clear()
        else:
            self._tools.update(counts)
            for tool in self._tools:
                self._pending.labels(tool).set(counts.get(tool, 0))
        return generate_latest(self.registry)


def _process_gauges(registry: CollectorRegistry) -> tuple[Gauge, Gauge]:
    """The gauges of this process's own limits, read at scrape time: the work queue and
    the database pool (each full means work waits)."""
    queue = Gauge(
        "greenlight_queue_depth",
        "Pieces of work waiting for a slot (MAX_CONCURRENT_TURNS) in this process",
        registry=registry,
    )
    db_in_use = Gauge(
        "greenlight_db_connections_in_use",
        "Database connections of this process's pool in use now (DATABASE_POOL_SIZE at most: "
        "a statement past them waits for one)",
        registry=registry,
    )
    return queue, db_in_use
