"""Crash safety with real processes: a worker is SIGKILLed at each point of an approved call.

The worker (tests/agent/crash_worker.py) runs the workflow on the test database and prints a
marker when it reaches the point to crash at; the test then kills it and recovers in-process
with `sweep(team)`, checking the tools' own ledger (a file both processes append to).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from genkit.model import ModelRequest, ModelResponse

from agent.assemble import build_workflow
from agent.clock import new_uuid, utc_now
from agent.gate import UNKNOWN_OUTCOME
from agent.observer import Observer
from agent.outcomes import AwaitingApproval, Busy, Reply, Resumed, SweepReport
from agent.policy import PolicyDefaults
from agent.runtime import AgentConfig
from agent.workflow import Workflow
from storage.db import SessionFactory
from storage.domain import Approved, Finished, Started, Thread
from tests import ledger_tools
from tests.agent import crash_worker
from tests.agent.conftest import IN_CHANNEL, Clock, Recorder, gemini_workflow
from tests.conftest import pg_test_url
from tests.fakes.gemini import FakeGemini, function_call, text as gemini_text
from tests.fakes.scripted_model import ScriptedModel, text, tool_responses

REPO = Path(__file__).resolve().parents[2]
MARKER_TIMEOUT = 60.0  # generous for a loaded machine; a healthy run needs about 1 s
RECOVERY_TIMEOUT = 30.0  # a recovery that re-runs the "hang" tool must fail, not hang


async def sweep(workflow: Workflow, team: str) -> SweepReport:
    return await asyncio.wait_for(workflow.follow_ups.sweep(team), RECOVERY_TIMEOUT)


def echo_tool_results(request: ModelRequest[Any]) -> ModelResponse:
    return text("results: " + repr(tool_responses(request)))


@dataclass
class Worker:
    proc: asyncio.subprocess.Process
    stderr: Path

    async def expect(self, marker: str) -> list[str]:
        """Read stdout lines until one starts with `marker`; its words after the marker."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + MARKER_TIMEOUT
        seen: list[str] = []
        while True:
            remaining = deadline - time.monotonic()
            try:
                raw = await asyncio.wait_for(self.proc.stdout.readline(), max(remaining, 0.0))
            except TimeoutError:
                pytest.fail(f"no {marker} within {MARKER_TIMEOUT}s; stdout {seen}\n{self.errors()}")
            if not raw:
                code = await self.proc.wait()
                pytest.fail(f"worker exited ({code}) before {marker}; {seen}\n{self.errors()}")
            line = raw.decode().rstrip("\n")
            if line.startswith("UNEXPECTED"):
                pytest.fail(f"worker: {line}\n{self.errors()}")
            if line.split(" ", 1)[0] == marker:
                return line.split()[1:]
            seen.append(line)

    async def kill(self) -> None:
        """SIGKILL: no finally blocks, no atexit, no connection goodbyes."""
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.stdout is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.stdout.read(), 5)

    def errors(self) -> str:
        return "worker stderr:\n" + self.stderr.read_text(errors="replace")[-4000:]


@contextlib.asynccontextmanager
async def worker(
    phase: str, team: str, thread_ts: str, tmp: Path, lease: float | None = None
) -> AsyncIterator[Worker]:
    """`lease`: the worker's RESUME_LEASE_SECONDS (else the workflow's default)."""
    env = dict(os.environ)
    env.pop("RESUME_LEASE_SECONDS", None)
    if lease is not None:
        env["RESUME_LEASE_SECONDS"] = str(lease)
    env["DATABASE_URL"] = pg_test_url()
    env["GREENLIGHT_TEST_LEDGER"] = str(ledger_tools.ledger_path())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("GENKIT_ENV", None)  # no reflection server in the worker
    stderr = tmp / f"worker-{phase}-{uuid.uuid4().hex[:6]}.err"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.agent.crash_worker",
            phase,
            team,
            thread_ts,
            stdin=asyncio.subprocess.PIPE,  # held open: the worker exits at EOF (no orphans)
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env=env,
            cwd=str(REPO),
        )
    w = Worker(proc, stderr)
    try:
        yield w
    finally:
        await w.kill()


@dataclass
class Recovery:
    """An in-process replica that recovers what the killed worker left."""

    workflow: Workflow
    model: ScriptedModel


def replica(
    sessions: SessionFactory, clock: Callable[[], datetime], observer: Observer | None = None
) -> Recovery:
    model = ScriptedModel()
    model.script(echo_tool_results)
    workflow = build_workflow(
        sessions,
        AgentConfig(model="scripted", tool_modules=("tests.ledger_tools",)),
        defaults=PolicyDefaults(channel=crash_worker.APPROVER_CHANNEL),
        clock=clock,
        new_id=new_uuid,
        setup=model.register,
        observer=observer,
    )
    return Recovery(workflow, model)


def the_resumed(report_resumed: tuple[Resumed, ...]) -> Resumed:
    assert len(report_resumed) == 1, report_resumed
    [resumed] = report_resumed
    assert isinstance(resumed.outcome, Reply), resumed.outcome
    return resumed


def transfers() -> list[dict[str, object]]:
    return [e for e in ledger_tools.entries() if e["tool"] == "transferMoney"]


async def kill_after(phase: str, marker: str, team: str, ts: str, tmp: Path) -> tuple[str, str]:
    """Run the worker to `marker`, SIGKILL it there; (approval id, turn id)."""
    async with worker(phase, team, ts, tmp) as w:
        approval_id, turn_id = await w.expect("DECIDED")
        if marker != "DECIDED":
            await w.expect(marker)
        await w.kill()
        assert w.proc.returncode == -9
    return approval_id, turn_id


async def test_crash_after_the_decision_resumes_once(
    pg_sessions: SessionFactory, team: str, ledger: Path, tmp_path: Path
) -> None:
    approval_id, turn_id = await kill_after("decided", "DECIDED", team, "1.1", tmp_path)
    assert transfers() == []  # decided, never resumed

    r = replica(pg_sessions, Clock())
    report = await sweep(r.workflow, team)
    resumed = the_resumed(report.resumed)
    [entry] = transfers()
    assert (entry["to"], entry["key"]) == ("12345", approval_id)
    [response] = tool_responses(r.model.requests[-1])
    assert response["output"] == {"success": True, "transactionId": f"txn-{approval_id}"}
    [settled] = resumed.settled
    assert settled.id == approval_id and isinstance(settled.execution, Finished)
    assert (await sweep(r.workflow, team)).resumed == ()
    assert await r.workflow.turns.resume(turn_id) is None
    assert len(transfers()) == 1


async def test_crash_while_the_tool_runs_reports_an_unknown_outcome(
    pg_sessions: SessionFactory, team: str, ledger: Path, tmp_path: Path
) -> None:
    approval_id, _ = await kill_after("started", "TOOL_STARTED", team, "2.1", tmp_path)
    [entry] = transfers()  # it did start, and nobody knows how it ended
    assert (entry["to"], entry["key"]) == ("hang", approval_id)

    clock = Clock()
    seen = Recorder()
    r = replica(pg_sessions, clock, seen)
    # The worker's lease is still live: nobody may take the turn from it yet.
    assert (await sweep(r.workflow, team)).resumed == ()
    clock.advance(hours=1)  # past the dead worker's lease, without waiting for it
    report = await sweep(r.workflow, team)
    resumed = the_resumed(report.resumed)
    [response] = tool_responses(r.model.requests[-1])
    assert response["output"] == UNKNOWN_OUTCOME
    assert len(transfers()) == 1  # never run again
    [settled] = resumed.settled
    assert settled.id == approval_id and isinstance(settled.execution, Started)
    assert isinstance(settled.decision, Approved)
    actions = [e.action for e in await r.workflow.reads.audit_trail(team)]
    assert "execution_started" in actions and "executed" not in actions
    assert seen.executions == [("transferMoney", "unknown")]


async def test_crash_after_the_tool_finished_replays_the_recorded_output(
    pg_sessions: SessionFactory, team: str, ledger: Path, tmp_path: Path
) -> None:
    approval_id, _ = await kill_after("finished", "MODEL_AFTER_TOOL", team, "3.1", tmp_path)
    [entry] = transfers()
    assert entry["key"] == approval_id

    clock = Clock()
    clock.advance(hours=1)
    r = replica(pg_sessions, clock)
    report = await sweep(r.workflow, team)
    resumed = the_resumed(report.resumed)
    [response] = tool_responses(r.model.requests[-1])
    assert response["output"] == {"success": True, "transactionId": f"txn-{entry['key']}"}
    assert len(transfers()) == 1
    [settled] = resumed.settled
    assert isinstance(settled.execution, Finished)


async def test_two_sweeps_racing_after_a_crash_resume_once(
    pg_sessions: SessionFactory, team: str, ledger: Path, tmp_path: Path
) -> None:
    approval_id, _ = await kill_after("decided", "DECIDED", team, "4.1", tmp_path)

    clock = Clock()
    a, b = replica(pg_sessions, clock), replica(pg_sessions, clock)
    reports = await asyncio.gather(sweep(a.workflow, team), sweep(b.workflow, team))
    assert sorted(len(rep.resumed) for rep in reports) == [0, 1]
    the_resumed(next(rep.resumed for rep in reports if rep.resumed))
    assert len(a.model.requests) + len(b.model.requests) == 1
    [entry] = transfers()
    assert entry["key"] == approval_id


async def test_a_thread_whose_turn_died_with_its_process_is_free_within_a_lease(
    pg_sessions: SessionFactory, team: str, ledger: Path, tmp_path: Path
) -> None:
    """A new message's turn holds its thread one lease (renewed while it runs), not the
    model-turn timeout: after a crash the next message is answered within seconds. The
    worker's lease is set short (the default is 15 s) so that it runs out in real time
    without being sat out; the replica is ready before the kill, so the lease is still
    held when it first tries."""
    lease = 3.0
    r = replica(pg_sessions, utc_now)  # the real clock: the dead hold runs out in real time
    thread = Thread(team, crash_worker.CHANNEL, "6.1")
    async with worker("turn", team, "6.1", tmp_path, lease=lease) as w:
        await w.expect("MODEL_CALLED")
        killed = time.monotonic()
        await w.kill()
    assert isinstance(await r.workflow.turns.start(thread, "U_EMP", "hello?"), Busy)
    deadline = killed + lease + 10  # the dead hold's time left, and slack
    while isinstance(out := await r.workflow.turns.start(thread, "U_EMP", "hello?"), Busy):
        assert time.monotonic() < deadline, "the dead turn held its thread past its lease"
        await asyncio.sleep(0.5)  # poll: each try changes nothing while the thread is held
    assert isinstance(out, Reply) and len(r.model.requests) == 1


async def test_real_gemini_plugin_interrupt_approve_and_resume(
    pg_sessions: SessionFactory, team: str, ledger: Path
) -> None:
    transfer = {"amount": 500, "toAccount": "12345"}
    async with FakeGemini() as gemini:
        gemini.script(function_call("transferMoney", transfer, id="call-1"), gemini_text("Sent."))
        workflow = gemini_workflow(pg_sessions, gemini)
        out = await workflow.turns.start(Thread(team, "D0GEM", "5.1"), "U_EMP", "send 500")
        assert isinstance(out, AwaitingApproval)
        [approval] = out.approvals
        assert (approval.request.tool, approval.request.input) == ("transferMoney", transfer)
        assert gemini.function_responses() == [] and transfers() == []

        decided = await workflow.decisions.decide(
            team, approval.id, "U_BOSS", approve=True, facts=IN_CHANNEL
        )
        resumed = await workflow.turns.resume(decided.turn_id)
        assert resumed is not None and isinstance(resumed.outcome, Reply)
        assert resumed.outcome.text == "Sent."
        [entry] = transfers()
        assert entry["key"] == approval.id
        [sent] = gemini.function_responses()
        output = {"success": True, "transactionId": f"txn-{approval.id}"}
        assert sent == {
            "id": approval.request.ref,  # Greenlight's own, not the model's "call-1"
            "name": "transferMoney",
            "response": {"name": "transferMoney", "content": output},
        }
        assert gemini.pending == 0
        assert all(r.api_key == "k" for r in gemini.requests)
