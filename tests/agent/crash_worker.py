"""A Greenlight process for crash tests to SIGKILL at a chosen point of an approved call.

    python -m tests.agent.crash_worker <phase> <team> <thread_ts>

Needs DATABASE_URL (the test database) and GREENLIGHT_TEST_LEDGER (the tools' ledger);
RESUME_LEASE_SECONDS, as the bot reads it, sets its lease (else the workflow's default).
Every phase starts a turn that asks for one transfer, approves it as another user and prints
`DECIDED <approval_id> <turn_id>`; then it stops at the phase's point and blocks forever:

- `decided`: never resumes the turn (a crash between the decision and the resume);
- `started`: resumes a transfer to "hang"; the tool writes its ledger entry, prints
  TOOL_STARTED and blocks (a crash after "started" was committed, before "finished");
- `finished`: resumes; the tool runs and "finished" is committed, then the model call that
  sees the tool's output prints MODEL_AFTER_TOOL and blocks (a crash before the snapshot).

- `turn`: a new message's turn (no approval) whose model call prints MODEL_CALLED and blocks
  (a crash while the thread is held for a running turn); it prints no DECIDED.

Anything unexpected is printed as `UNEXPECTED ...` and the process exits non-zero. The worker
also exits when its stdin reaches EOF, so it never outlives a test run that died without
killing it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from datetime import timedelta
from typing import Any, NoReturn

from genkit.model import ModelRequest, ModelResponse

from agent.assemble import build_workflow
from agent.leases import LEASE
from agent.outcomes import AwaitingApproval
from agent.policy import ApproverFacts, PolicyDefaults
from agent.runtime import AgentConfig
from storage.db import make_engine, make_session_factory
from storage.domain import Thread
from tests.fakes.scripted_model import ScriptedModel, calls, text, tool_responses

PHASES = ("decided", "started", "finished", "turn")
CHANNEL = "D0CRASH"
REQUESTER = "U_EMP"
APPROVER = "U_BOSS"
APPROVER_CHANNEL = "C0APPROVE"
TRANSFER: dict[str, Any] = {"amount": 500, "toAccount": "12345"}
HANGING_TRANSFER: dict[str, Any] = {"amount": 500, "toAccount": "hang"}


def say(line: str) -> None:
    print(line, flush=True)


async def block_forever() -> NoReturn:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def echo_tool_results(request: ModelRequest[Any]) -> ModelResponse:
    return text("results: " + repr(tool_responses(request)))


async def never_answer(request: ModelRequest[Any]) -> ModelResponse:
    say("MODEL_CALLED")
    await block_forever()


async def stop_after_tool(request: ModelRequest[Any]) -> ModelResponse:
    """The model call after the tool ran: 'finished' is already committed by now."""
    say("MODEL_AFTER_TOOL " + repr(tool_responses(request)))
    await block_forever()


def exit_with_parent() -> None:
    """The test holds our stdin open; EOF means it is gone, so go too (no orphans)."""

    def watch() -> None:
        sys.stdin.buffer.read()
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


async def main(phase: str, team: str, thread_ts: str) -> int:
    exit_with_parent()
    model = ScriptedModel()
    transfer = HANGING_TRANSFER if phase == "started" else TRANSFER
    after_tool = stop_after_tool if phase == "finished" else echo_tool_results
    if phase == "turn":
        model.script(never_answer)
    else:
        model.script(calls(("transferMoney", transfer)), after_tool)
    engine = make_engine(os.environ["DATABASE_URL"])
    lease = os.environ.get("RESUME_LEASE_SECONDS")
    workflow = build_workflow(
        make_session_factory(engine),
        AgentConfig(model="scripted", tool_modules=("tests.ledger_tools",)),
        defaults=PolicyDefaults(channel=APPROVER_CHANNEL),
        setup=model.register,
        lease=timedelta(seconds=float(lease)) if lease else LEASE,
    )
    out = await workflow.turns.start(Thread(team, CHANNEL, thread_ts), REQUESTER, "send 500")
    if phase == "turn":
        say(f"UNEXPECTED start_turn returned {out!r}")
        return 1
    if not isinstance(out, AwaitingApproval) or len(out.approvals) != 1:
        say(f"UNEXPECTED start_turn returned {out!r}")
        return 1
    [approval] = out.approvals
    decided = await workflow.decisions.decide(
        team, approval.id, APPROVER, approve=True, facts=ApproverFacts(in_channel=True)
    )
    say(f"DECIDED {approval.id} {decided.turn_id}")
    if phase == "decided":
        await block_forever()
    resumed = await workflow.turns.resume(decided.turn_id)
    say(f"UNEXPECTED continue_turn returned {resumed!r}")
    return 1


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in PHASES:
        sys.exit(f"usage: python -m tests.agent.crash_worker {{{'|'.join(PHASES)}}} TEAM THREAD_TS")
    sys.exit(asyncio.run(main(*sys.argv[1:])))
