"""Wires store, policy, middleware, agent and the workflow's jobs together: one place for all."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from genkit.exp import Genkit

from agent.approval import Calls, approval_middleware
from agent.clock import new_uuid, utc_now
from agent.decisions import Decisions
from agent.files import FileTools
from agent.follow_ups import FollowUps
from agent.gate import DEFAULT_TOOL_TIMEOUTS, Gate, ToolTimeouts
from agent.interrupts import Interrupts
from agent.leases import LEASE, Leases
from agent.observer import Observer, Watch
from agent.policy import PolicyDefaults, PolicyService
from agent.questions import answer_form
from agent.reads import Reads
from agent.runtime import AgentConfig, AgentRuntime, Preview, build_runtime
from agent.scope import Outside
from agent.standing import StandingApprovals
from agent.turns import Turns
from agent.workflow import Workflow
from storage.approval_store import ApprovalStore
from storage.db import SessionFactory
from storage.policies import PolicyStore
from storage.retention import Retention
from storage.session_store import SqlSessionStore


@dataclass(frozen=True)
class Timing:
    """How long things may take: a lease, a model turn, an approved call."""

    lease: timedelta = LEASE
    turn_timeout: timedelta = timedelta(minutes=5)
    tool_timeouts: ToolTimeouts = DEFAULT_TOOL_TIMEOUTS


def build_workflow(
    sessions: SessionFactory,
    config: AgentConfig,
    *,
    defaults: PolicyDefaults | None = None,
    clock: Callable[[], datetime] = utc_now,
    new_id: Callable[[], str] = new_uuid,
    lease: timedelta = LEASE,
    turn_timeout: timedelta = timedelta(minutes=5),
    tool_timeouts: ToolTimeouts = DEFAULT_TOOL_TIMEOUTS,
    setup: Callable[[Genkit], None] | None = None,
    outside: Outside = contextlib.nullcontext,
    files: FileTools | None = None,
    observer: Observer | None = None,
    keep_data: timedelta = timedelta(days=90),
    keep_audit: timedelta = timedelta(days=400),
    model_calls: int | None = None,
) -> Workflow:
    """`outside`: the hook a turn waits on the model or a tool in (see agent/scope.py);
    `files`: the file tools to mount (agent/files.py), their reads allowed by default;
    `observer`: told of decisions, tool executions and turns (agent/observer.py);
    `keep_data`, `keep_audit`: what the sweep's retention keeps (storage/retention.py);
    `model_calls`: how many model calls may be in flight at once (None: no cap)."""
    files = files or FileTools()
    defaults = defaults or PolicyDefaults()
    runtime: AgentRuntime

    def known() -> list[str]:
        """Read at each use: MCP servers' tools join the runtime after start."""
        return runtime.known()

    policies = PolicyService(
        PolicyStore(sessions),
        tools=known,
        defaults=replace(defaults, allowed=defaults.allowed | files.reads()),
        clock=clock,
    )
    store = ApprovalStore(sessions)
    watch = Watch(observer or Observer(), clock)
    gate = Gate(store.executions, clock, tool_timeouts, outside, watch)
    previews: dict[str, Preview] = dict(files.previews())
    questions: set[str] = set()  # filled as the tools load
    standing = StandingApprovals(store, policies, clock, new_id)
    calls = Calls(policies, previews, questions, files.checks(), gate, outside, standing)
    cap = asyncio.Semaphore(model_calls) if model_calls else None
    runtime = build_runtime(
        config,
        store=SqlSessionStore(sessions),
        middleware=approval_middleware(calls, new_id=new_id, model_calls=cap),
        previews=previews,
        questions=questions,
        setup=setup,
        mounted=files.middleware(),
        mounted_tools=files.tools(),
    )
    retention = Retention(sessions, keep=keep_data, keep_audit=keep_audit)
    timing = Timing(lease, turn_timeout, tool_timeouts)
    return _workflow(runtime, store, policies, gate, retention, watch, timing, standing)


def _workflow(
    runtime: AgentRuntime,
    store: ApprovalStore,
    policies: PolicyService,
    gate: Gate,
    retention: Retention,
    watch: Watch,
    timing: Timing,
    standing: StandingApprovals,
) -> Workflow:
    """The workflow's jobs, each given what it needs."""
    clock, new_id = watch.clock, standing.new_id
    decisions = Decisions(runtime, store, policies, watch, clock, timing.lease)
    turns = Turns(
        runtime,
        store,
        Interrupts(store.reads, policies, clock, new_id),
        decisions,
        gate,
        Leases(timing.lease, clock),
        watch,
        clock,
        new_id,
        timing.turn_timeout,
        # The question tools whose answers are objects of a form (agent/questions.py).
        frozenset(n for n, t in runtime.tools.items() if answer_form(t) is not None),
    )
    return Workflow(
        runtime=runtime,
        policies=policies,
        turns=turns,
        decisions=decisions,
        follow_ups=FollowUps(store, policies, turns, retention, watch, clock),
        reads=Reads(runtime, store, policies, clock),
        standing=standing,
        tool_timeouts=timing.tool_timeouts,
    )
