"""Wires store, policy, middleware, agent and workflow together: one place, used by all."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from genkit.exp import Genkit

from agent.approval import DEFAULT_TOOL_TIMEOUTS, Outside, ToolTimeouts, approval_middleware
from agent.files import FileTools
from agent.observer import Observer
from agent.policy import PolicyDefaults, PolicyService
from agent.runtime import AgentConfig, AgentRuntime, Preview, build_runtime
from agent.workflow import LEASE, Workflow
from storage.approval_store import ApprovalStore
from storage.db import SessionFactory
from storage.policies import PolicyStore
from storage.retention import Retention
from storage.session_store import SqlSessionStore


def utc_now() -> datetime:
    return datetime.now(UTC)


def new_uuid() -> str:
    return str(uuid.uuid4())


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
    """`outside`: the hook a turn waits on the model or a tool in (see agent/approval.py);
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
    previews: dict[str, Preview] = dict(files.previews())
    questions: set[str] = set()
    middleware = approval_middleware(
        store=store,
        policies=policies,
        previews=previews,
        questions=questions,
        new_id=new_id,
        clock=clock,
        checks=files.checks(),
        outside=outside,
        observer=observer,
        timeouts=tool_timeouts,
        model_calls=asyncio.Semaphore(model_calls) if model_calls else None,
    )
    runtime = build_runtime(
        config,
        store=SqlSessionStore(sessions),
        middleware=middleware,
        previews=previews,
        questions=questions,
        setup=setup,
        mounted=files.middleware(),
        mounted_tools=files.tools(),
    )
    return Workflow(
        runtime=runtime,
        store=store,
        policies=policies,
        retention=Retention(sessions, keep=keep_data, keep_audit=keep_audit),
        clock=clock,
        new_id=new_id,
        lease=lease,
        turn_timeout=turn_timeout,
        observer=observer,
        tool_timeouts=tool_timeouts,
    )
