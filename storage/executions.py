"""The execution gate in storage: an approved call started once, before it runs, then finished.

START_EXECUTION is committed before the call runs, and only the first caller's takes (of
this very call, of the version approved); every other gets IllegalTransition with the
approval as it is now, and answers from its record instead of running the call
(agent/gate.py). FINISH_EXECUTION records the output.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from storage.db import SessionFactory
from storage.domain import Approval, Finished
from storage.lifecycle import FINISH_EXECUTION, START_EXECUTION
from storage.rows import NOTE, change
from storage.transitions import Atomic, write

START = Atomic(write(START_EXECUTION), NOTE)
FINISH = Atomic(write(FINISH_EXECUTION, output=sa.bindparam("result")), NOTE)


class ExecutionStore:
    """An approved call's execution: started once, then finished with its output."""

    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    async def start_execution(self, approval: Approval, *, now: datetime) -> None:
        """START_EXECUTION of an approved call, audited, committed before the tool runs: the
        one gate every execution passes. IllegalTransition, with the approval as it is now,
        for every caller but the first."""
        r = approval.request
        call = {"call_tool": r.tool, "call_ref": r.ref, "call_version": approval.version}
        await change(self._sessions, START, START_EXECUTION, approval, now, call)

    async def finish_execution(self, approval: Approval, *, output: Any, now: datetime) -> Approval:
        """FINISH_EXECUTION with the tool's output, audited; the approval as it is now."""
        finished = replace(approval, execution=Finished(output))
        await change(self._sessions, FINISH, FINISH_EXECUTION, finished, now, {"result": output})
        return finished
