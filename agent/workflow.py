"""The approval workflow: from a message to a reply, through interrupts, decisions and resume.

Transport-agnostic: callers pass Slack-free facts in and render the outcomes they get back.
Every step that must happen once is a conditional write in storage (see storage/approvals.py);
a tool runs only behind the execution gate in agent/approval.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import astuple, dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from genkit import Part
from genkit.exp import AgentChat, AgentFinishReason, AgentInterrupt, AgentResponse

from agent.approval import UNKNOWN_OUTCOME, TurnScope, current_scope, interrupt_why
from agent.policy import ApproverFacts, Policy, PolicyService, refusal
from agent.runtime import AgentRuntime
from storage import approvals, audit
from storage.db import SessionFactory, autocommit
from storage.models import (
    Approval,
    ApprovalStatus,
    AuditEvent,
    Execution,
    Turn,
    TurnState,
)
from storage.session_store import current_team

log = logging.getLogger(__name__)

MAX_RESUME_ATTEMPTS = 3
RETRY_DELAY = timedelta(seconds=30)
CARD_GRACE = timedelta(minutes=1)
TextSink = Callable[[str], Awaitable[None]]
Facts = ApproverFacts | Callable[["ApprovalInfo", Policy], Awaitable[ApproverFacts]]


@dataclass(frozen=True)
class Thread:
    """Where a conversation lives; the transport maps it to a Slack thread."""

    team_id: str
    channel_id: str
    thread_ts: str


@dataclass(frozen=True)
class ApprovalInfo:
    """Everything a card needs about one approval, as recorded."""

    id: str
    turn_id: str
    thread: Thread
    tool: str
    description: str
    input: dict[str, Any]
    requester: str
    requested_at: datetime
    expires_at: datetime
    why: str
    status: ApprovalStatus
    decided_by: str | None
    decided_at: datetime | None
    reason: str | None
    execution: Execution
    card_channel: str | None
    card_ts: str | None

    @property
    def outcome_unknown(self) -> bool:
        return self.execution == Execution.STARTED


@dataclass(frozen=True)
class Reply:
    thread: Thread
    text: str


@dataclass(frozen=True)
class AwaitingApproval:
    thread: Thread
    approvals: tuple[ApprovalInfo, ...]


@dataclass(frozen=True)
class Busy:
    """The thread already has a turn running or waiting for approval."""

    thread: Thread
    waiting_on: tuple[ApprovalInfo, ...] = ()


@dataclass(frozen=True)
class Failed:
    thread: Thread
    retrying: bool = False


TurnOutcome = Reply | AwaitingApproval | Busy | Failed


@dataclass(frozen=True)
class Resumed:
    """A resumed turn: its outcome, and the approvals it settled (to refresh their cards)."""

    outcome: TurnOutcome
    settled: tuple[ApprovalInfo, ...]


@dataclass(frozen=True)
class Decided:
    approval: ApprovalInfo
    turn_id: str
    turn_ready: bool  # every approval of the paused turn is now decided


RefusalReason = Literal["not_found", "self_approval", "not_an_approver", "already_decided"]


class DecisionRefused(Exception):
    """A decision that changes nothing; `approval` shows its true state when known."""

    def __init__(self, reason: RefusalReason, approval: ApprovalInfo | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.approval = approval


@dataclass(frozen=True)
class SweepReport:
    expired: tuple[ApprovalInfo, ...] = ()
    resumed: tuple[Resumed, ...] = ()
    uncarded: tuple[ApprovalInfo, ...] = ()  # pending approvals whose card was never posted


class Workflow:
    def __init__(
        self,
        *,
        runtime: AgentRuntime,
        sessions: SessionFactory,
        policies: PolicyService,
        clock: Callable[[], datetime],
        new_id: Callable[[], str],
        lease: timedelta = timedelta(minutes=2),
        turn_timeout: timedelta = timedelta(minutes=5),
    ) -> None:
        self._runtime = runtime
        self._turn_timeout = turn_timeout
        self._sessions = sessions
        self._policies = policies
        self._clock = clock
        self._new_id = new_id
        self._lease = lease

    @property
    def policies(self) -> PolicyService:
        return self._policies

    # -- turns -------------------------------------------------------------------------

    async def start_turn(
        self, thread: Thread, requester: str, text: str, on_text: TextSink | None = None
    ) -> TurnOutcome:
        """Run one employee message; returns the reply, or the approvals it now waits on."""
        now = self._clock()
        async with autocommit(self._sessions) as db:  # the claim is one statement
            conv = await approvals.claim_thread(
                db,
                new_id=self._new_id(),
                team_id=thread.team_id,
                channel_id=thread.channel_id,
                thread_ts=thread.thread_ts,
                now=now,
                # Held for as long as the turn may run, so a second message never forks it.
                until=now + self._turn_timeout + self._lease,
            )
            if conv is None:
                return await self._busy(db, thread)
        scope = TurnScope(team_id=thread.team_id, requester=requester)
        try:
            out = await self._run(scope, conv.snapshot_id, on_text, lambda c: c.send_stream(text))
        except Exception:
            log.exception("turn failed in conversation %s", conv.id)
            async with autocommit(self._sessions) as db:
                await approvals.release_conversation(db, conv.id, snapshot_id=None)
            return Failed(thread)
        if out.finish_reason == AgentFinishReason.INTERRUPTED:
            policies = await self._interrupt_policies(scope, out)
            async with autocommit(self._sessions) as db:  # pausing is one statement
                # The thread stays taken: its open turn keeps later messages out until the
                # resume finishes it and releases the thread.
                infos = await self._pause(db, conv.id, thread, requester, out, policies)
            return AwaitingApproval(thread, infos)
        async with autocommit(self._sessions) as db:
            await approvals.release_conversation(db, conv.id, snapshot_id=out.snapshot_id)
        return Reply(thread, out.text)

    async def continue_turn(self, turn_id: str, on_text: TextSink | None = None) -> Resumed | None:
        """Resume a fully decided turn, once. None when it is not ready or someone else has it."""
        now = self._clock()
        async with autocommit(self._sessions) as db:
            claimed = await approvals.claim_turn(
                db, turn_id, now=now, lease_until=now + self._lease
            )
        if claimed is None:
            return None
        turn, located = claimed
        conv_id, rows = turn.conversation_id, [found.approval for found in located]
        first = located[0]  # a paused turn has one approval per interrupt, so at least one
        thread = Thread(turn.team_id, first.channel_id, first.thread_ts)
        requester = rows[0].requester
        scope = TurnScope(team_id=turn.team_id, requester=requester)
        respond, restart = resume_parts(rows)
        heartbeat = asyncio.create_task(self._keep_lease(turn))
        try:
            out = await self._run(
                scope,
                turn.snapshot_id,
                on_text,
                lambda c: c.resume_stream(respond=respond, restart=restart),
            )
        except Exception:
            log.exception("resume of turn %s failed (attempt %d)", turn.id, turn.attempts)
            return await self._resume_failed(turn, conv_id, thread)
        finally:
            heartbeat.cancel()
        if out.finish_reason != AgentFinishReason.INTERRUPTED:
            async with autocommit(self._sessions) as db:  # one statement on PostgreSQL
                finished = await approvals.finish_and_release(
                    db,
                    turn.id,
                    attempt=turn.attempts,
                    now=self._clock(),
                    conversation_id=conv_id,
                    snapshot_id=out.snapshot_id,
                )
            if finished is None:
                log.error("turn %s lost its lease while resuming; dropping this result", turn.id)
                return None
            settled = tuple([self._info(r, thread) for r in finished])
            return Resumed(Reply(thread, out.text), settled)
        # Chained interrupts: the turn is done and a new one waits, in one transaction.
        policies = await self._interrupt_policies(scope, out)
        async with self._sessions.begin() as db:
            if not await approvals.finish_turn(
                db, turn.id, attempt=turn.attempts, state=TurnState.DONE, now=self._clock()
            ):
                log.error("turn %s lost its lease while resuming; dropping this result", turn.id)
                return None
            settled = await self._infos(db, turn.id, thread)
            infos = await self._pause(db, conv_id, thread, requester, out, policies)
        return Resumed(AwaitingApproval(thread, infos), settled)

    # -- decisions ---------------------------------------------------------------------

    async def check_decider(
        self, team_id: str, approval_id: str, approver: str, facts: Facts
    ) -> ApprovalInfo:
        """The approval, if `approver` may decide it now; else DecisionRefused saying why.

        `facts` may be a callback: the transport then looks people up only for a request
        that exists and is pending, knowing its tool's policy.
        """
        async with autocommit(self._sessions) as db:
            with_policy = await approvals.locate_with_policy(db, team_id, approval_id)
        if with_policy is None:
            raise DecisionRefused("not_found")
        found, stored = with_policy
        info = self._located(found)
        policy = self._policies.of(info.tool, stored)
        if info.status == ApprovalStatus.PENDING and info.expires_at <= self._clock():
            # Past its deadline but not yet swept: it is expired, whoever clicks.
            async with self._sessions.begin() as db:
                expired = await self._expire(db, [found.approval], self._clock())
            info = expired[0] if expired else info
        if info.status != ApprovalStatus.PENDING:
            raise DecisionRefused("already_decided", info)
        if callable(facts):
            facts = await facts(info, policy)
        why = refusal(policy, requester=info.requester, approver=approver, facts=facts)
        if why is not None:
            raise DecisionRefused(why, info)
        return info

    async def decide(
        self,
        team_id: str,
        approval_id: str,
        approver: str,
        *,
        approve: bool,
        reason: str | None = None,
        facts: Facts | None = None,
    ) -> Decided:
        """Record one decision, atomically; raises DecisionRefused and changes nothing else."""
        info = await self.check_decider(team_id, approval_id, approver, facts or ApproverFacts())
        now = self._clock()
        status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
        event = audit.entry(
            team_id=team_id,
            at=now,
            actor=approver,
            action=status.value,
            tool=info.tool,
            approval_id=approval_id,
            input=info.input,
            reason=reason,
        )
        async with autocommit(self._sessions) as db:  # with its audit row: one statement
            won = await approvals.record_decision(
                db,
                approval_id,
                status=status,
                decided_by=approver,
                reason=reason,
                now=now,
                event=event,
            )
            if won is None:
                found = await approvals.locate(db, team_id, approval_id)
                raise DecisionRefused("already_decided", self._located(found) if found else info)
        return Decided(self._info(won.approval, info.thread), info.turn_id, won.others_pending == 0)

    # -- maintenance -------------------------------------------------------------------

    async def sweep(self, team_id: str | None = None) -> SweepReport:
        """Expire overdue approvals and resume turns nobody is resuming (after a crash).

        Runs over every workspace unless `team_id` narrows it to one.
        """
        now = self._clock()
        async with self._sessions.begin() as db:
            overdue = await approvals.expired_approvals(db, now=now, team_id=team_id)
            expired = await self._expire(db, overdue, now)
            # Cards a process died before posting (a live one posts within moments).
            stranded = await approvals.uncarded_approvals(
                db, requested_before=now - CARD_GRACE, team_id=team_id
            )
            uncarded = [await self._info_of(db, row) for row in stranded]
            turn_ids = await approvals.recoverable_turns(db, now=now, team_id=team_id)
        resumed = [r for t in turn_ids if (r := await self.continue_turn(t)) is not None]
        return SweepReport(tuple(expired), tuple(resumed), tuple(uncarded))

    async def _expire(self, db: Any, rows: Sequence[Approval], now: datetime) -> list[ApprovalInfo]:
        """pending -> expired for overdue approvals, audited; returns those this call expired."""
        expired = []
        for row in rows:
            event = audit.entry(
                team_id=row.team_id,
                at=now,
                actor="greenlight",
                action="expired",
                tool=row.tool,
                approval_id=row.id,
                input=row.input,
            )
            done = await approvals.record_decision(
                db,
                row.id,
                status=ApprovalStatus.EXPIRED,
                decided_by=None,
                reason=None,
                now=now,
                event=event,
            )
            if done is not None:
                expired.append(await self._info_of(db, done.approval))
        return expired

    async def knows(self, thread: Thread) -> bool:
        """Whether this thread already is a conversation (so replies in it continue it)."""
        async with autocommit(self._sessions) as db:
            return await approvals.find_conversation(db, *astuple(thread)) is not None

    async def approval(self, team_id: str, approval_id: str) -> ApprovalInfo | None:
        async with autocommit(self._sessions) as db:
            found = await approvals.locate(db, team_id, approval_id)
        return None if found is None else self._located(found)

    async def pending(self, team_id: str) -> list[ApprovalInfo]:
        async with autocommit(self._sessions) as db:
            rows = await approvals.pending_approvals(db, team_id)
            return [await self._info_of(db, r) for r in rows]

    async def attach_card(self, approval_id: str, *, channel: str, ts: str) -> None:
        async with autocommit(self._sessions) as db:
            await approvals.set_card(db, approval_id, channel=channel, ts=ts)

    async def audit_trail(self, team_id: str, tool: str | None = None) -> list[AuditEvent]:
        async with autocommit(self._sessions) as db:
            return list(await audit.recent(db, team_id, tool=tool))

    # -- internals ---------------------------------------------------------------------

    async def _run(
        self,
        scope: TurnScope,
        snapshot_id: str | None,
        on_text: TextSink | None,
        start: Callable[[AgentChat[Any]], Any],
    ) -> AgentResponse[Any]:
        """Run one Genkit turn in this workspace's scope, streaming text to `on_text`."""
        agent = self._runtime.agent
        chat = agent.chat(snapshot_id=snapshot_id) if snapshot_id else agent.chat()
        # A model that never answers must not hold the thread (or a resume lease) forever.
        async with asyncio.timeout(self._turn_timeout.total_seconds()):
            with _scoped(scope):
                turn = start(chat)
                try:
                    async for chunk in turn.stream:
                        if on_text is not None and chunk.text:
                            await on_text(chunk.accumulated_text)
                finally:
                    response: AgentResponse[Any] = await turn.response
        return response

    async def _pause(
        self,
        db: Any,
        conversation_id: str,
        thread: Thread,
        requester: str,
        out: AgentResponse[Any],
        policies: dict[str, Policy],
    ) -> tuple[ApprovalInfo, ...]:
        """Persist a turn that stopped on interrupts: one approval per interrupt."""
        now = self._clock()
        turn = Turn(
            id=self._new_id(),
            team_id=thread.team_id,
            conversation_id=conversation_id,
            session_id=out.session_id or "",
            snapshot_id=out.snapshot_id or "",
            state=TurnState.WAITING,
            attempts=0,
            created_at=now,
            updated_at=now,
        )
        whys = {
            p.tool_request.ref: interrupt_why(p)
            for p in (out.message.content if out.message else [])
            if p.tool_request is not None
        }
        rows = []
        for intr in out.interrupts:
            policy = policies[intr.name]
            row = Approval(
                id=self._new_id(),
                team_id=thread.team_id,
                turn_id=turn.id,
                tool=intr.name,
                ref=intr.ref or "",
                input=intr.input if isinstance(intr.input, dict) else {"value": intr.input},
                requester=requester,
                requested_at=now,
                expires_at=now + policy.timeout,
                why=whys.get(intr.ref) or policy.why,
                status=ApprovalStatus.PENDING,
                execution=Execution.NOT_STARTED,
                card_channel=policy.channel,
            )
            rows.append(row)
        requested = [
            audit.entry(
                team_id=thread.team_id,
                at=now,
                actor=requester,
                action="requested",
                tool=row.tool,
                approval_id=row.id,
                input=row.input,
                why=row.why,
            )
            for row in rows
        ]
        await approvals.add_paused_turn(db, turn, rows, requested)
        return tuple([self._info(r, thread) for r in rows])

    async def _interrupt_policies(
        self, scope: TurnScope, out: AgentResponse[Any]
    ) -> dict[str, Policy]:
        """The policies the middleware just read for these calls (else read them now).

        Read before a write transaction opens: SQLite allows one writer, even to us.
        """
        return {
            i.name: scope.policies.get(i.name) or await self._policies.get(scope.team_id, i.name)
            for i in out.interrupts
        }

    async def _resume_failed(self, turn: Turn, conversation_id: str, thread: Thread) -> Resumed:
        """Leave the turn for the sweep to retry, or give up after a few attempts."""
        now = self._clock()
        retrying = turn.attempts < MAX_RESUME_ATTEMPTS
        async with self._sessions.begin() as db:
            if retrying:
                await approvals.extend_lease(
                    db, turn.id, attempt=turn.attempts, until=now + RETRY_DELAY
                )
            else:
                await approvals.finish_turn(
                    db, turn.id, attempt=turn.attempts, state=TurnState.FAILED, now=now
                )
                # The thread continues from before the failed turn, not from its dangling calls.
                await approvals.release_conversation(db, conversation_id, snapshot_id=None)
            settled = await self._infos(db, turn.id, thread)
        return Resumed(Failed(thread, retrying=retrying), settled)

    async def _keep_lease(self, turn: Turn) -> None:
        while True:
            await asyncio.sleep(self._lease.total_seconds() / 3)
            async with self._sessions.begin() as db:
                until = self._clock() + self._lease
                if not await approvals.extend_lease(
                    db, turn.id, attempt=turn.attempts, until=until
                ):
                    return

    async def _infos(self, db: Any, turn_id: str, thread: Thread) -> tuple[ApprovalInfo, ...]:
        return tuple([self._info(r, thread) for r in await approvals.turn_approvals(db, turn_id)])

    async def _busy(self, db: Any, thread: Thread) -> Busy:
        """Why the thread could not be claimed: the approvals it waits on, if any."""
        conv = await approvals.find_conversation(db, *astuple(thread))
        waiting = None if conv is None else await approvals.open_turn(db, conv.id)
        return Busy(thread, () if waiting is None else await self._infos(db, waiting.id, thread))

    async def _info_of(self, db: Any, row: Approval) -> ApprovalInfo:
        """For rows read without their thread (sweeps, listings): one more query."""
        conv = await approvals.conversation_of_turn(db, row.turn_id)
        return self._info(row, Thread(conv.team_id, conv.channel_id, conv.thread_ts))

    def _located(self, found: approvals.Located) -> ApprovalInfo:
        row = found.approval
        return self._info(row, Thread(row.team_id, found.channel_id, found.thread_ts))

    def _info(self, row: Approval, thread: Thread) -> ApprovalInfo:
        return ApprovalInfo(
            id=row.id,
            turn_id=row.turn_id,
            thread=thread,
            tool=row.tool,
            description=self._runtime.tools.get(row.tool, ""),
            input=dict(row.input),
            requester=row.requester,
            requested_at=row.requested_at,
            expires_at=row.expires_at,
            why=row.why,
            status=row.status,
            decided_by=row.decided_by,
            decided_at=row.decided_at,
            reason=row.reason,
            execution=row.execution,
            card_channel=row.card_channel,
            card_ts=row.card_ts,
        )


def resume_parts(rows: Sequence[Approval]) -> tuple[list[Part], list[Part]]:
    """One resume answering every interrupt of the turn, built from the stored requests only.

    A call that already ran (or died running) is answered with its record, never restarted.
    """
    respond: list[Part] = []
    restart: list[Part] = []
    for row in rows:
        intr: AgentInterrupt[Any, Any] = AgentInterrupt(row.tool, row.ref or None, row.input)
        if row.status == ApprovalStatus.APPROVED:
            if row.execution == Execution.FINISHED:
                respond.append(intr.respond(row.output))
            elif row.execution == Execution.STARTED:
                respond.append(intr.respond(UNKNOWN_OUTCOME))
            else:
                meta = {"tool_approved": True, "approval_id": row.id, "approved_by": row.decided_by}
                restart.append(intr.restart(resumed_metadata=meta))
        elif row.status == ApprovalStatus.DENIED:
            error = f"denied by {row.decided_by}" + (f": {row.reason}" if row.reason else "")
            respond.append(intr.respond({"ok": False, "error": error}))
        elif row.status == ApprovalStatus.EXPIRED:
            respond.append(intr.respond({"ok": False, "error": "approval expired"}))
        else:
            raise ValueError(f"approval {row.id} is still pending; the turn is not ready")
    return respond, restart


@contextlib.contextmanager
def _scoped(scope: TurnScope) -> Iterator[None]:
    token = current_scope.set(scope)
    team_token = current_team.set(scope.team_id)
    try:
        yield
    finally:
        current_team.reset(team_token)
        current_scope.reset(token)
