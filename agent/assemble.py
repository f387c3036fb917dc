"""Wires store, policy, middleware, agent and workflow together: one place, used by all."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from genkit.exp import Genkit

from agent.approval import Outside, approval_middleware
from agent.files import FileTools
from agent.policy import PolicyDefaults, PolicyService
from agent.runtime import AgentConfig, Preview, build_runtime
from agent.workflow import Workflow
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
    lease: timedelta = timedelta(minutes=2),
    turn_timeout: timedelta = timedelta(minutes=5),
    setup: Callable[[Genkit], None] | None = None,
    outside: Outside = contextlib.nullcontext,
    files: FileTools | None = None,
    keep_data: timedelta = timedelta(days=90),
    keep_audit: timedelta = timedelta(days=400),
) -> Workflow:
    """`outside`: the hook a turn waits on the model or a tool in (see agent/approval.py);
    `files`: the file tools to mount (agent/files.py), their reads allowed by default;
    `keep_data`, `keep_audit`: what the sweep's retention keeps (storage/retention.py)."""
    files = files or FileTools()
    defaults = defaults or PolicyDefaults()
    tool_names: list[str] = []
    policies = PolicyService(
        PolicyStore(sessions),
        tools=lambda: tool_names,
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
        outside=outside,
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
    tool_names.extend([*runtime.tools, *runtime.mounted])
    return Workflow(
        runtime=runtime,
        store=store,
        policies=policies,
        retention=Retention(sessions, keep=keep_data, keep_audit=keep_audit),
        clock=clock,
        new_id=new_id,
        lease=lease,
        turn_timeout=turn_timeout,
    )
