"""Wires store, policy, middleware, agent and workflow together: one place, used by all."""

from __future__ import annotations

import asyncio
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
    model_calls: int | None = None,
) -> Workflow:
    """`outside`: the hook a turn waits on the model or a tool in (see agent/approval.py);
    `files`: the file tools to mount (agent/files.py), their reads allowed by default;
    `model_calls`: how many model calls may be in flight at once (None: no cap)."""
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
    tool_names.extend([*runtime.tools, *runtime.mounted])
    return Workflow(
        runtime=runtime,
        store=store,
        policies=policies,
        clock=clock,
        new_id=new_id,
        lease=lease,
        turn_timeout=turn_timeout,
    )
