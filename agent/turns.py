"""Turns: a message's turn from start to reply or pause, and a fully decided turn's resume, once.

Transport-agnostic: callers pass Slack-free facts in and render the outcomes they get back
(agent/outcomes.py). A thread is held by one turn at a time, and a paused turn is resumed
only by whoever CLAIMs it (storage/turns.py), each under a lease kept by a heartbeat
(agent/leases.py). A tool runs only behind the execution gate (agent/gate.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from genkit.exp import AgentChat, AgentChunk, AgentFinishReason, AgentInput, AgentResponse

from agent.context import human_message
from agent.decisions import Decisions
from agent.gate import Gate
from agent.interrupts import Interrupts, resume_parts, shaped_by
from agent.leases import Leases, Renew
from agent.observer import Watch
from agent.outcomes import (
    AnsweredInThread,
    AwaitingApproval,
    Busy,
    DecisionRefused,
    Failed,
    InvalidAnswer,
    Progress,
    Reply,
    Resumed,
    TextSink,
    TurnOutcome,
)
from agent.runtime import AgentRuntime
from agent.scope import TurnScope, scoped
from storage.approval_store import ApprovalStore
from storage.domain import Approval, Approved, Claim, NotStarted, Thread
from storage.held_saves import Held, holding
from storage.lifecycle import IllegalTransition
from storage.turn_snapshots import resuming, starting

log = logging.getLogger(__name__)

MAX_RESUME_ATTEMPTS = 3
RETRY_DELAY = timedelta(seconds=30)
RELEASE_BACKOFF = (0.0, 0.5, 2.0)  # seconds before each attempt to free a thread
Told = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class Turns:
    """Runs turns: a new message's, and a paused turn's resume once every request is settled."""

    runtime: AgentRuntime
    store: ApprovalStore
    interrupts: Interrupts
    decisions: Decisions  # a message that answers the question its thread waits on
    gate: Gate
    leases: Leases
    watch: Watch
    clock: Callable[[], datetime]
    new_id: Callable[[], str]
    turn_timeout: timedelta = timedelta(minutes=5)
    # The question tools whose answers are objects of a form (agent/questions.py).
    forms: frozenset[str] = frozenset()

    async def knows(self, thread: Thread) -> bool:
        """Whether this thread already is a conversation (so replies in it continue it)."""
        return await self.store.turns.knows(thread)

    async def start(
        self,
        thread: Thread,
        requester: str,
        text: str,
        on_text: TextSink | None = None,
        *,
        viewing: str | None = None,
    ) -> TurnOutcome:
        """Run one employee message; returns the reply, or the approvals it now waits on.
        `viewing`: the channel the employee has open beside the thread, if Slack said."""
        return await self.watch.turn(self._start(thread, requester, text, on_text, viewing))

    async def resume(
        self,
        turn_id: str,
        on_text: TextSink | None = None,
        *,
        on_ran: Callable[[Approval], None] | None = None,
        claim: Claim | None = None,
    ) -> Resumed | None:
        """Resume a fully decided turn, once. None when it is not ready or someone else has it.
        `on_ran`: told of each approved call as soon as its output is recorded; `claim`: the
        turn as the decision that readied it claimed it (`Decided.claim`)."""
        return await self.watch.turn(self._resume(turn_id, on_text, on_ran, claim))

    async def _start(
        self,
        thread: Thread,
        requester: str,
        text: str,
        on_text: TextSink | None,
        viewing: str | None,
    ) -> TurnOutcome:
        now = self.clock()
        until = now + self.leases.lease
        try:
            # Held while the turn runs (renewed by a heartbeat), so a second message never
            # forks it; a process that dies holds it one lease at most.
            held = await self.store.turns.hold_thread(
                thread, author=requester, new_id=self.new_id(), now=now, until=until
            )
            if held is None:
                return await self._taken(thread, requester, text)
        except Exception:  # the database: no thread was held; the requester is told
            log.exception("could not take thread %s for a turn", thread.thread_ts)
            return Failed(thread)
        conversation = held.conversation_id
        answered = _told(on_text, thread, requester, final=True)
        scope = _scope(thread, requester, held.participants, conversation, answered)
        message = human_message(text, by=requester, at=now, viewing=viewing)

        async def keep(until: datetime) -> bool:
            return await self.store.turns.keep_thread(conversation, until=until)

        try:
            async with self.leases.kept(keep, f"the thread of conversation {conversation}", until):
                out, saved = await self._run(
                    scope,
                    held.snapshot_id,
                    _told(on_text, thread, requester),
                    lambda c: c.send_stream(AgentInput(message=message)),
                )
                if out.finish_reason == AgentFinishReason.INTERRUPTED:
                    turn, approvals = await self.interrupts.paused(conversation, thread, scope, out)
                    await self.store.turns.pause(turn, approvals, saved)
                    return AwaitingApproval(thread, approvals, _covered(scope))
        except asyncio.CancelledError:  # a clean shutdown cut it off: free the thread now
            await self.store.turns.release_thread(conversation, snapshot_id=None)
            raise
        except Exception:
            # The model, a tool, or the database while pausing: the thread continues from
            # before this turn, at once rather than when its hold runs out.
            log.exception(
                "turn failed in conversation %s",
                conversation,
                extra={"conversation_id": conversation},
            )
            await self._release(conversation, snapshot_id=None)
            return Failed(thread, model_unavailable=scope.model.unanswered)
        released = await self._release(conversation, snapshot_id=out.snapshot_id, held=saved)
        if not released and saved is not None:  # the reply shows, unsaved: an apology follows
            return Failed(thread)
        return Reply(thread, out.text, _covered(scope))

    async def _resume(
        self,
        turn_id: str,
        on_text: TextSink | None,
        on_ran: Callable[[Approval], None] | None,
        claimed: Claim | None,
    ) -> Resumed | None:
        now = self.clock()
        until = now + self.leases.lease
        try:
            claim = claimed or await self.store.turns.claim(turn_id, now=now, lease_until=until)
            if claimed is not None:  # leased since the decision: fresh again, if it waited
                until = await self._fresh(claimed, now)
        except IllegalTransition as refused:
            log.debug("turn %s not resumed here: %s", turn_id, refused, extra={"turn_id": turn_id})
            return None
        asked = claim.approvals[0].request
        scope = TurnScope(
            team_id=claim.thread.team_id,
            requester=asked.requester,
            participants=shaped_by(asked.participants, claim.approvals),
            approvals={a.id: a for a in claim.approvals},
            conversation_id=claim.conversation_id,
            thread=claim.thread,
            ran=on_ran,
            answered=_told(on_text, claim.thread, asked.requester, final=True),
        )
        resume = asyncio.current_task()
        lost = asyncio.Event()

        def stop() -> None:  # the lease is lost: whatever this resume still does is no one's
            lost.set()
            if resume is not None:
                resume.cancel()

        try:
            lease = f"the lease of turn {turn_id}"
            async with self.leases.kept(self._renewal(claim), lease, until, on_lost=stop):
                out, held = await self._resume_run(claim, scope, on_text)
        except asyncio.CancelledError:
            await self._let_go(claim)
            if lost.is_set() and resume is not None and resume.uncancel() == 0:
                log.error("turn %s lost its lease; its resume stopped", turn_id)
                return None
            raise
        except Exception:
            log.exception(
                "resume of turn %s failed (attempt %d)",
                turn_id,
                claim.attempt,
                extra={"turn_id": turn_id},
            )
            return await self._resume_failed(claim, model_unavailable=scope.model.unanswered)
        return await self._resumed(claim, scope, out, held)

    async def _resume_run(
        self, claim: Claim, scope: TurnScope, on_text: TextSink | None
    ) -> tuple[AgentResponse[Any], Held | None]:
        """The calls approved with changes run first (agent/gate.py `run_edited`); then one
        resume answers every interrupt of the turn. Whoever's words it sends the model (an
        answer, a denial's reason, a note) joins the conversation's participants first: none
        of them may approve what it asks next, in this turn or a later one."""
        if scope.participants != claim.approvals[0].request.participants:
            await self.store.turns.join(claim.conversation_id, scope.participants)
        approvals = await self._run_edited(claim)
        respond, restart = resume_parts(approvals, self.forms)
        return await self._run(
            scope,
            claim.snapshot_id,
            _told(on_text, claim.thread, scope.requester),
            lambda c: c.resume_stream(respond=respond, restart=restart),
            version=claim.snapshot_version,
        )

    async def _resumed(
        self, claim: Claim, scope: TurnScope, out: AgentResponse[Any], held: Held | None
    ) -> Resumed | None:
        """End the resumed turn (COMPLETE, with its snapshot), or, when it stopped on new
        interrupts, end it and pause the next in one write; None when the lease was lost
        meanwhile. A write that fails (the database) fails the resume, for a retry."""
        thread = claim.thread
        try:
            if out.finish_reason != AgentFinishReason.INTERRUPTED:
                settled = await self.store.turns.complete(
                    claim, now=self.clock(), snapshot_id=out.snapshot_id, held=held
                )
                return Resumed(Reply(thread, out.text, _covered(scope)), settled)
            if held is not None:  # chained interrupts, rare: the snapshot goes in first
                await held.flush()
            turn, approvals = await self.interrupts.paused(
                claim.conversation_id, thread, scope, out
            )
            settled = await self.store.turns.complete_and_pause(
                claim, now=self.clock(), turn=turn, approvals=approvals
            )
            return Resumed(AwaitingApproval(thread, approvals, _covered(scope)), settled)
        except IllegalTransition:
            log.error(
                "turn %s lost its lease while resuming; dropping this result",
                claim.turn_id,
                extra={"turn_id": claim.turn_id},
            )
            return None
        except Exception:
            log.exception(
                "resumed turn %s not saved", claim.turn_id, extra={"turn_id": claim.turn_id}
            )
            return await self._resume_failed(claim, model_unavailable=False)

    async def _fresh(self, claim: Claim, now: datetime) -> datetime:
        """When the lease of a claim made earlier (a decision's) runs out: renewed first if
        the resume waited for a slot past a third of it (IllegalTransition: taken over)."""
        until = claim.lease_until or now
        if until - now < self.leases.lease * 2 / 3:
            until = now + self.leases.lease
            await self.store.turns.renew(claim, until=until)
        return until

    def _renewal(self, claim: Claim) -> Renew:
        """RENEW the claim's lease; False once another process took the turn over."""

        async def renew(until: datetime) -> bool:
            try:
                await self.store.turns.renew(claim, until=until)
            except IllegalTransition:
                log.error("turn %s lost its lease: another process resumes it", claim.turn_id)
                return False
            return True

        return renew

    async def _run_edited(self, claim: Claim) -> tuple[Approval, ...]:
        """Run the calls approved with changes that have not run (at most once each); the
        turn's approvals as they are then."""
        edited = [
            a
            for a in claim.approvals
            if a.edit and isinstance(a.decision, Approved) and isinstance(a.execution, NotStarted)
        ]
        for approval in edited:
            tool = self.runtime.tools.get(approval.request.tool)
            await self.gate.run_edited(tool.action() if tool else None, approval)
        if not edited:
            return claim.approvals
        return await self.store.turns.turn_approvals(claim.turn_id)

    async def _resume_failed(self, claim: Claim, *, model_unavailable: bool) -> Resumed | None:
        """Leave the turn for the sweep to retry, or give up after a few attempts."""
        now = self.clock()
        retrying = claim.attempt < MAX_RESUME_ATTEMPTS
        try:
            if retrying:
                await self.store.turns.renew(claim, until=now + RETRY_DELAY)
                settled = await self.store.turns.turn_approvals(claim.turn_id)
            else:
                # The thread continues from before the failed turn, not its dangling calls.
                settled = await self.store.turns.give_up(claim, now=now)
        except IllegalTransition:
            log.error(
                "turn %s lost its lease while failing; another resume has it",
                claim.turn_id,
                extra={"turn_id": claim.turn_id},
            )
            return None
        return Resumed(Failed(claim.thread, retrying, model_unavailable), settled)

    async def _taken(self, thread: Thread, requester: str, text: str) -> TurnOutcome:
        """A message to a thread another turn holds: the answer to the question it waits
        on, if it is one, else Busy."""
        waiting = await self.store.turns.waiting_on(thread)
        asked = [a for a in waiting if a.request.asks == "requester" and a.decision is None]
        if text.strip() and asked and asked[0].request.requester == requester:
            try:  # the requester's reply is the answer their question waits for
                answer = await self.decisions.answer(thread.team_id, asked[0].id, requester, text)
                return AnsweredInThread(thread, answer)
            except (DecisionRefused, InvalidAnswer):
                pass  # answered meanwhile (the button), or its form wants a modal
        return Busy(thread, waiting)

    async def _release(
        self, conversation_id: str, *, snapshot_id: str | None, held: Held | None = None
    ) -> bool:
        """Free the thread (continuing from `snapshot_id`, written with it when `held`),
        trying again through a short database outage; after that (False) its hold runs out
        by itself (turn timeout plus lease)."""
        for delay in RELEASE_BACKOFF:
            await asyncio.sleep(delay)
            try:
                await self.store.turns.release_thread(
                    conversation_id, snapshot_id=snapshot_id, held=held
                )
                return True
            except Exception:
                log.warning("could not free conversation %s", conversation_id, exc_info=True)
        log.error("conversation %s stays held until its hold runs out", conversation_id)
        return False

    async def _let_go(self, claim: Claim) -> None:
        """A clean shutdown cut this resume off: hand the turn back (LET_GO), so the next
        sweep (here or in another replica) resumes it at once, not when the lease runs out."""
        try:
            await self.store.turns.let_go(claim, now=self.clock())
        except IllegalTransition:
            log.debug("turn %s was taken over before it was let go", claim.turn_id)
        except Exception:  # its lease runs out instead
            log.warning("could not let go of turn %s", claim.turn_id, exc_info=True)

    async def _run(
        self,
        scope: TurnScope,
        snapshot_id: str | None,
        told: Told,
        start: Callable[[AgentChat[Any]], Any],
        *,
        version: int | None = None,
    ) -> tuple[AgentResponse[Any], Held | None]:
        """Run one Genkit turn in this workspace's scope, telling its text as it grows; with
        the snapshot it saved held back, for the statement that ends the turn to write
        (storage/held_saves.py; dropped if the turn fails: nothing will point at it).
        `version`: of `snapshot_id`'s row, as the resume's claim read it, if it did."""
        await told("")
        agent = self.runtime.agent
        new = None if snapshot_id else self.new_id()  # a new chat's session, made here
        # A model that never answers must not hold the thread (or a resume lease) forever.
        # Approved calls run under their own timeout meanwhile (agent/scope.py ModelTime).
        async with scope.model_time.limit(self.turn_timeout.total_seconds()):
            with scoped(scope), starting(new), resuming(snapshot_id, version), holding() as hold:
                chat = (
                    agent.chat(snapshot_id=snapshot_id)
                    if new is None
                    else agent.chat(session_id=new)
                )
                turn = start(chat)
                try:
                    said = ""
                    async for chunk in turn.stream:
                        if chunk.text and _from_model(chunk):
                            said += chunk.text
                            await told(said)
                finally:
                    response: AgentResponse[Any] = await turn.response
        held = hold.take(response.snapshot_id)
        await hold.flush()  # another it held (none that Genkit 0.12 makes)
        return response, held


def _scope(
    thread: Thread, requester: str, people: tuple[str, ...], conversation: str, answered: Told
) -> TurnScope:
    """A new message's turn: in its thread's conversation, with everyone who took part."""
    return TurnScope(
        thread.team_id,
        requester,
        people,
        conversation_id=conversation,
        thread=thread,
        answered=answered,
    )


def _covered(scope: TurnScope) -> tuple[Approval, ...]:
    return tuple(scope.covered_by.values())


def _from_model(chunk: AgentChunk[Any]) -> bool:
    """Whether the chunk is the model's words: the stream also carries what middleware adds
    to the conversation (a file the Filesystem tools read, for one), which is not a reply."""
    raw = chunk.raw.model_chunk if chunk.raw is not None else None
    return raw is None or raw.role in (None, "model")


def _told(sink: TextSink | None, thread: Thread, requester: str, *, final: bool = False) -> Told:
    """The sink, bound to one turn's thread and requester (`final`: for the last answer)."""

    async def told(text: str) -> None:
        if sink is not None:
            await sink(Progress(thread, requester, text, final))

    return told
