"""The approval workflow: from a message to a reply, through interrupts, decisions and resume.

Transport-agnostic: callers pass Slack-free facts in and render the outcomes they get back.
When each transition of storage/lifecycle.py happens is decided here; that it happens at
most once is storage's conditional write (storage/approval_store.py). A tool runs only
behind the execution gate in agent/approval.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from types import EllipsisType
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, assert_never

from genkit import Part
from genkit.exp import (
    AgentChat,
    AgentChunk,
    AgentFinishReason,
    AgentInput,
    AgentInterrupt,
    AgentResponse,
)

from agent.approval import (
    DEFAULT_TOOL_TIMEOUTS,
    ToolTimeouts,
    TurnScope,
    current_scope,
    input_errors,
    interrupt_note,
    recorded,
    run_edited,
)
from agent.context import Line, as_provenance, conversation_lines, human_message
from agent.observer import DecisionOutcome, Observer, TurnOutcomeName
from agent.policy import ApproverFacts, Policy, PolicyService, Refusal, refusal
from agent.questions import answer_form, answered, form_errors
from agent.runtime import AgentRuntime
from storage.approval_store import ApprovalStore

# The approval values the transport renders: the lifecycle's own, re-exported so that the
# transport depends on agent/ only.
from storage.lifecycle import (
    ESCALATE,
    REMIND,
    Answered as Answered,
    Approval as Approval,
    Approved as Approved,
    AuditEntry as AuditEntry,
    Card as Card,
    CardState as CardState,
    Claim,
    Context as Context,
    Denied as Denied,
    Edit as Edit,
    EscalationState,
    Expired as Expired,
    Finished as Finished,
    FollowUp,
    History as History,
    IllegalTransition,
    NotStarted as NotStarted,
    PausedTurn,
    ReminderState,
    Request as Request,
    Requirement,
    Said as Said,
    Source as Source,
    Started as Started,
    Thread as Thread,
    Transition,
    Vote as Vote,
)
from storage.policies import StoredPolicy
from storage.retention import Purged, Retention
from storage.session_store import current_team

log = logging.getLogger(__name__)

MAX_RESUME_ATTEMPTS = 3
# A resume's lease (and a running turn's hold on its thread), renewed every third of it: a
# process that dies holds its turn this long at most. A failed renewal (a dropped connection)
# is tried again every RENEW_RETRY, with two thirds of the lease still to run.
LEASE = timedelta(seconds=15)
RENEW_RETRY = timedelta(seconds=1)
RETRY_DELAY = timedelta(seconds=30)
CARD_GRACE = timedelta(minutes=1)
RELEASE_BACKOFF = (0.0, 0.5, 2.0)  # seconds before each attempt to free a thread
HISTORY_DAYS = 30  # how far back a card counts the requester's earlier requests


@dataclass(frozen=True)
class Progress:
    """A turn running in `thread`: first with no text when it starts (the transport shows
    that it is working), then with the model's text so far each time it grows."""

    thread: Thread
    requester: str
    text: str = ""


TextSink = Callable[[Progress], Awaitable[None]]
Facts = ApproverFacts | Callable[[Approval, Policy], Awaitable[ApproverFacts]]


@dataclass(frozen=True)
class Reply:
    thread: Thread
    text: str


@dataclass(frozen=True)
class AwaitingApproval:
    thread: Thread
    approvals: tuple[Approval, ...]


@dataclass(frozen=True)
class Busy:
    """The thread already has a turn running or waiting for approval."""

    thread: Thread
    waiting_on: tuple[Approval, ...] = ()


@dataclass(frozen=True)
class Failed:
    thread: Thread
    retrying: bool = False
    model_unavailable: bool = False  # the model failed or never answered, not a tool or us


@dataclass(frozen=True)
class Decided:
    approval: Approval
    turn_ready: bool  # every request of the paused turn is now settled

    @property
    def turn_id(self) -> str:
        return self.approval.turn_id


@dataclass(frozen=True)
class AnsweredInThread:
    """The requester's message answered the question their thread waited on."""

    thread: Thread
    decided: Decided


TurnOutcome = Reply | AwaitingApproval | Busy | Failed | AnsweredInThread


@dataclass(frozen=True)
class Resumed:
    """A resumed turn: its outcome, and the approvals it settled (to refresh their cards)."""

    outcome: TurnOutcome
    settled: tuple[Approval, ...]


RefusalReason = (
    Refusal
    | Literal["not_found", "already_decided", "already_voted"]
    # Changed since the approver saw it; changes that would need more approvers.
    | Literal["changed", "needs_more_approvers"]
    # A question answers no Approve or Deny; only the requester answers what asks them.
    | Literal["a_question", "not_a_question", "not_the_requester"]
)


class InvalidAnswer(ValueError):
    """An answer that does not fit its question's form: what is wrong, by field."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


class DecisionRefused(Exception):
    """A decision that changes nothing; `approval` shows its true state when known."""

    def __init__(self, reason: RefusalReason, approval: Approval | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.approval = approval


@dataclass(frozen=True)
class Due:
    """A follow-up this process now owes: the approval as it is, and its call's policy now
    (whom a reminder names; who may decide once it is escalated)."""

    approval: Approval
    policy: Policy


@dataclass(frozen=True)
class FollowUps:
    reminders: tuple[Due, ...] = ()
    escalations: tuple[Due, ...] = ()


@dataclass(frozen=True)
class SweepReport:
    expired: tuple[Approval, ...] = ()
    resumed: tuple[Resumed, ...] = ()
    # Cards whose post was cut off, now this sweep's to finish (RETRY_CARD): each may be in
    # the channel already, so the transport looks there before it posts.
    uncarded: tuple[Approval, ...] = ()
    purged: Purged = field(default_factory=Purged)  # what retention deleted (every workspace)


P = ParamSpec("P")
T = TypeVar("T", bound=TurnOutcome | Resumed | None)


def _observed(
    run: Callable[Concatenate[Workflow, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Workflow, P], Coroutine[Any, Any, T]]:
    """Tell the observer how a turn ended and how long it took (agent/observer.py)."""

    @functools.wraps(run)
    async def observed(self: Workflow, /, *args: P.args, **kwargs: P.kwargs) -> T:
        started = self._clock()
        try:
            result = await run(self, *args, **kwargs)
        except Exception:
            self._observer.turn_ended("failed", (self._clock() - started).total_seconds())
            raise
        self._turn_ended(result, (self._clock() - started).total_seconds())
        return result

    return observed


class Workflow:
    def __init__(
        self,
        *,
        runtime: AgentRuntime,
        store: ApprovalStore,
        policies: PolicyService,
        retention: Retention,
        clock: Callable[[], datetime],
        new_id: Callable[[], str],
        lease: timedelta = LEASE,
        turn_timeout: timedelta = timedelta(minutes=5),
        observer: Observer | None = None,
        tool_timeouts: ToolTimeouts = DEFAULT_TOOL_TIMEOUTS,
    ) -> None:
        self._runtime = runtime
        self._observer = observer or Observer()
        self._retention = retention
        self._turn_timeout = turn_timeout
        self._tool_timeouts = tool_timeouts
        self._store = store
        self._policies = policies
        self._clock = clock
        self._new_id = new_id
        self._lease = lease
        # The question tools whose answers are objects of a form (agent/questions.py).
        self._forms = frozenset(
            name for name, tool in runtime.tools.items() if answer_form(tool) is not None
        )

    @property
    def policies(self) -> PolicyService:
        return self._policies

    @property
    def runtime(self) -> AgentRuntime:
        return self._runtime

    def describe(self, tool: str) -> str:
        """The tool's description, for the people deciding on its calls."""
        return self._runtime.describe(tool)

    def note(self, tool: str) -> str:
        """Where the tool comes from and what its server says it does (MCP tools), or ""."""
        return self._runtime.notes.get(tool, "")

    # -- turns -------------------------------------------------------------------------

    async def accept_event(self, event_id: str) -> bool:
        """Whether this is the first delivery of a Slack event (retries run nothing twice)."""
        return await self._store.accept_event(event_id, now=self._clock())

    @_observed
    async def start_turn(
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
        now = self._clock()
        try:
            held = await self._store.hold_thread(
                thread,
                author=requester,
                new_id=self._new_id(),
                now=now,
                # Held while the turn runs (renewed by a heartbeat), so a second message
                # never forks it; a process that dies holds it one lease at most.
                until=now + self._lease,
            )
            if held is None:
                return await self._taken(thread, requester, text)
        except Exception:  # the database: no thread was held; the requester is told
            log.exception("could not take thread %s for a turn", thread.thread_ts)
            return Failed(thread)
        scope = TurnScope(thread.team_id, requester, participants=held.participants)
        message = human_message(text, by=requester, at=now, viewing=viewing)
        heartbeat = asyncio.create_task(self._keep_thread(held.conversation_id))
        try:
            out = await self._run(
                scope,
                held.snapshot_id,
                _told(on_text, thread, requester),
                lambda c: c.send_stream(AgentInput(message=message)),
            )
            if out.finish_reason == AgentFinishReason.INTERRUPTED:
                turn, approvals = await self._paused(held.conversation_id, thread, scope, out)
                await self._store.pause(turn, approvals)
                return AwaitingApproval(thread, approvals)
        except asyncio.CancelledError:  # a clean shutdown cut it off: free the thread now
            heartbeat.cancel()
            await self._store.release_thread(held.conversation_id, snapshot_id=None)
            raise
        except Exception:
            # The model, a tool, or the database while pausing: the thread continues from
            # before this turn, at once rather than when its hold runs out.
            log.exception(
                "turn failed in conversation %s",
                held.conversation_id,
                extra={"conversation_id": held.conversation_id},
            )
            await self._release(held.conversation_id, snapshot_id=None)
            return Failed(thread, model_unavailable=scope.model.unanswered)
        finally:
            heartbeat.cancel()
        await self._release(held.conversation_id, snapshot_id=out.snapshot_id)
        return Reply(thread, out.text)

    @_observed
    async def continue_turn(self, turn_id: str, on_text: TextSink | None = None) -> Resumed | None:
        """Resume a fully decided turn, once. None when it is not ready or someone else has it."""
        now = self._clock()
        try:
            claim = await self._store.claim(turn_id, now=now, lease_until=now + self._lease)
        except IllegalTransition as refused:
            log.debug("turn %s not resumed here: %s", turn_id, refused, extra={"turn_id": turn_id})
            return None
        thread = claim.thread
        asked = claim.approvals[0].request
        scope = TurnScope(
            team_id=thread.team_id,
            requester=asked.requester,
            participants=shaped_by(asked.participants, claim.approvals),
            approvals={a.id: a for a in claim.approvals},
        )
        heartbeat = asyncio.create_task(self._keep_lease(claim))
        try:
            approvals = await self._run_edited(claim)
            respond, restart = resume_parts(approvals, self._forms)
            out = await self._run(
                scope,
                claim.snapshot_id,
                _told(on_text, thread, asked.requester),
                lambda c: c.resume_stream(respond=respond, restart=restart),
            )
        except asyncio.CancelledError:
            heartbeat.cancel()
            await self._let_go(claim)
            raise
        except Exception:
            log.exception(
                "resume of turn %s failed (attempt %d)",
                turn_id,
                claim.attempt,
                extra={"turn_id": turn_id},
            )
            return await self._resume_failed(claim, model_unavailable=scope.model.unanswered)
        finally:
            heartbeat.cancel()
        try:
            if out.finish_reason != AgentFinishReason.INTERRUPTED:
                settled = await self._store.complete(
                    claim, now=self._clock(), snapshot_id=out.snapshot_id
                )
                return Resumed(Reply(thread, out.text), settled)
            # Chained interrupts: this turn is done and the next waits, in one transaction.
            turn, approvals = await self._paused(claim.conversation_id, thread, scope, out)
            settled = await self._store.complete_and_pause(
                claim, now=self._clock(), turn=turn, approvals=approvals
            )
            return Resumed(AwaitingApproval(thread, approvals), settled)
        except IllegalTransition:
            log.error(
                "turn %s lost its lease while resuming; dropping this result",
                turn_id,
                extra={"turn_id": turn_id},
            )
            return None

    # -- decisions ---------------------------------------------------------------------

    async def check_decider(
        self, team_id: str, approval_id: str, approver: str, facts: Facts
    ) -> Approval:
        """The approval, if `approver` may decide it now; else DecisionRefused saying why.

        `facts` may be a callback: the transport then looks people up only for a request
        that exists and is pending, knowing its tool's policy.
        """
        found = await self._store.decidable(team_id, approval_id)
        if found is None:
            raise DecisionRefused("not_found")
        approval = await self._expire_if_overdue(found[0])
        if approval.request.question:
            raise DecisionRefused("a_question", approval)
        if approval.decision is not None:
            raise DecisionRefused("already_decided", approval)
        await self._check_eligible(approval, found[1], approver, facts)
        return approval

    async def check_answerer(
        self, team_id: str, approval_id: str, person: str, facts: Facts
    ) -> Approval:
        """The question, if `person` may answer it now; else DecisionRefused saying why. A
        question to the requester is theirs alone; one to the approvers, any approver's."""
        found = await self._store.decidable(team_id, approval_id)
        if found is None:
            raise DecisionRefused("not_found")
        approval = await self._expire_if_overdue(found[0])
        r = approval.request
        if not r.question:
            raise DecisionRefused("not_a_question", approval)
        if approval.decision is not None:
            raise DecisionRefused("already_decided", approval)
        if r.asks == "requester":
            if person != r.requester:
                raise DecisionRefused("not_the_requester", approval)
        else:
            await self._check_eligible(approval, found[1], person, facts)
        return approval

    def asks(self, tool: str) -> bool:
        """Whether `tool` only asks a person (agent/questions.py)."""
        return tool in self._runtime.questions

    def question_form(self, tool: str) -> dict[str, Any] | None:
        """The JSON schema an answer to `tool`'s question must fit; None: free text."""
        return answer_form(self._runtime.tools.get(tool))

    async def answer(
        self,
        team_id: str,
        approval_id: str,
        person: str,
        answer: Any,
        *,
        facts: Facts | None = None,
    ) -> Decided:
        """Record the answer to a question, once. DecisionRefused (nothing changes) when the
        person may not answer it or it is settled; InvalidAnswer when it does not fit the
        question's form."""
        approval = await self.check_answerer(team_id, approval_id, person, facts or ApproverFacts())
        if (form := self.question_form(approval.request.tool)) is not None:
            if errors := form_errors(form, answer):
                raise InvalidAnswer(errors)
        elif not isinstance(answer, str) or not answer.strip():
            raise InvalidAnswer({"answer": "an answer is needed"})
        try:
            done, others_pending = await self._store.answer(
                approval, Answered(person, self._clock(), answer)
            )
        except IllegalTransition as refused:  # answered first by someone, or time ran out
            current = await self._expire_if_overdue(refused.current or approval)
            raise DecisionRefused("already_decided", current) from None
        self._settled(done)
        return Decided(done, turn_ready=others_pending == 0)

    async def conversation(
        self, team_id: str, approval_id: str, viewer: str, facts: Facts
    ) -> tuple[Approval, list[Line]]:
        """The conversation that led to a request, as the agent had it when the turn paused,
        for someone who may decide it (before or after it was decided); audited."""
        found = await self._store.decidable(team_id, approval_id)
        if found is None:
            raise DecisionRefused("not_found")
        approval = found[0]
        await self._check_eligible(approval, found[1], viewer, facts)
        messages = []
        if snapshot_id := await self._store.paused_snapshot(approval):
            snapshot = await self._runtime.sessions.get_snapshot(
                snapshot_id=snapshot_id, context={"team_id": team_id}
            )
            if snapshot is not None and snapshot.state is not None:
                messages = snapshot.state.messages or []
        await self._store.note_viewed(approval, by=viewer, now=self._clock())
        return approval, conversation_lines(messages)

    async def _check_eligible(
        self,
        approval: Approval,
        stored: StoredPolicy | None,
        person: str,
        facts: Facts,
        *,
        policy: Policy | None = None,
    ) -> None:
        """DecisionRefused unless `person` may decide this request (agent/policy.py), under
        its tool's policy for the call as asked (or `policy`, given)."""
        r = approval.request
        policy = policy or self._policies.of(r.tool, stored).for_request(r)
        if callable(facts):
            facts = await facts(approval, policy)
        why = refusal(
            policy,
            requester=r.requester,
            participants=r.participants,
            approver=person,
            facts=facts,
            escalated=approval.escalated,
        )
        if why is not None:
            raise DecisionRefused(why, approval)

    async def decide(
        self,
        team_id: str,
        approval_id: str,
        approver: str,
        *,
        approve: bool,
        reason: str | None = None,
        facts: Facts | None = None,
        seen: datetime | EllipsisType | None = ...,
    ) -> Decided:
        """Record one decision, atomically; raises DecisionRefused and changes nothing else.
        `seen`: the edit the approver saw (None: the request as it was asked); an Approve
        of a request changed since is refused."""
        approval = await self.check_decider(
            team_id, approval_id, approver, facts or ApproverFacts()
        )
        now = self._clock()
        decision = Approved(approver, now, reason) if approve else Denied(approver, now, reason)
        try:
            decided, others_pending = await self._store.decide(approval, decision, seen=seen)
        except IllegalTransition as refused:
            raise await self._refused(refused, approval) from None
        self._settled(decided)
        # A vote towards a quorum leaves the approval pending: nothing to resume yet.
        ready = decided.decision is not None and others_pending == 0
        return Decided(decided, turn_ready=ready)

    def edit_form(self, tool: str) -> dict[str, Any] | None:
        """The JSON schema of `tool`'s input, for an approver's changes; None: no schema."""
        found = self._runtime.tools.get(tool)
        schema = found.input_schema if found is not None else None
        return schema if isinstance(schema, dict) and schema.get("properties") else None

    async def approve_with_changes(
        self,
        team_id: str,
        approval_id: str,
        approver: str,
        changed: dict[str, Any],
        *,
        facts: Facts | None = None,
        seen: datetime | EllipsisType | None = ...,
    ) -> Decided:
        """Approve, running the call with `changed` as its input instead. The changes must
        fit the tool's schema (InvalidAnswer by field) and may not make the call need more
        approvers than it asked for; the approver must be one both for the call as asked and
        as changed. With several approvers needed, the edit stands with this approver's vote
        alone: the others approved something else."""
        facts = facts or ApproverFacts()
        approval = await self.check_decider(team_id, approval_id, approver, facts)
        r = approval.request
        if changed == r.input:
            return await self.decide(team_id, approval_id, approver, approve=True, facts=facts)
        tool = self._runtime.tools.get(r.tool)
        if tool is None or (errors := input_errors(tool.action(), changed)):
            raise InvalidAnswer(errors if tool is not None else {"input": "no such tool"})
        edit = Edit(changed, approver, self._clock())
        # What the approver typed is theirs: for a rule, a changed value came from a human.
        sources = {**r.context.sources, **dict.fromkeys(edit.changes(r.input), Source("human"))}
        stored = await self._policies.get(team_id, r.tool)
        policy = stored.for_call(changed, r.requester, as_provenance(changed, sources))
        if not policy.allowed and policy.approvals > r.approvals_needed:
            raise DecisionRefused("needs_more_approvers", approval)
        await self._check_eligible(approval, None, approver, facts, policy=policy)
        try:
            if r.approvals_needed > 1:
                done = await self._store.edit(approval, edit, seen=seen)
                return Decided(done, turn_ready=False)
            decided, others_pending = await self._store.decide(
                approval, Approved(approver, edit.at), edited=edit, seen=seen
            )
        except IllegalTransition as refused:
            raise await self._refused(refused, approval) from None
        self._settled(decided)
        return Decided(decided, turn_ready=others_pending == 0)

    async def _refused(self, refused: IllegalTransition, approval: Approval) -> DecisionRefused:
        """Why an Approve, a Deny or an edit changed nothing, for the person who tried."""
        current = await self._expire_if_overdue(refused.current or approval)
        if current.decision is None and Requirement.AS_SEEN in refused.unmet:
            return DecisionRefused("changed", current)
        if current.decision is None and Requirement.NEW_VOTER in refused.unmet:
            return DecisionRefused("already_voted", current)
        return DecisionRefused("already_decided", current)

    async def _expire_if_overdue(self, approval: Approval) -> Approval:
        """A pending approval past its deadline is expired, whoever touches it first (a click,
        the sweep); returns it as it is now."""
        if approval.decision is not None or approval.request.expires_at > self._clock():
            return approval
        try:
            expired = await self._store.expire(approval, now=self._clock())
        except IllegalTransition as refused:
            return refused.current or approval
        self._settled(expired)
        return expired

    # -- maintenance -------------------------------------------------------------------

    async def sweep(
        self, team_id: str | None = None, on_text: TextSink | None = None
    ) -> SweepReport:
        """Expire overdue approvals, resume turns nobody is resuming (after a crash), report
        cards never posted, and delete what is past retention (storage/retention.py).

        Runs over every workspace unless `team_id` narrows it to one (then nothing is
        deleted: retention is the database's, not a workspace's).
        """
        now = self._clock()
        expired = []
        for approval in await self._store.overdue(now=now, team_id=team_id):
            with contextlib.suppress(IllegalTransition):  # decided meanwhile, or by a replica
                expired.append(await self._store.expire(approval, now=now))
                self._settled(expired[-1])
        # Cards a process died posting (a live one posts within moments).
        uncarded = []
        for approval in await self._store.stale_cards(stale=now - CARD_GRACE, team_id=team_id):
            with contextlib.suppress(IllegalTransition):  # another sweep took it
                uncarded.append(
                    await self._store.retry_card(approval, now=now, stale=now - CARD_GRACE)
                )
        turn_ids = await self._store.recoverable(now=now, team_id=team_id)
        resumed = [r for t in turn_ids if (r := await self.continue_turn(t, on_text)) is not None]
        purged = Purged()
        if team_id is None:
            purged = await self._retention.purge(now=now)
        return SweepReport(tuple(expired), tuple(resumed), tuple(uncarded), purged)

    async def follow_ups(self, team_id: str | None = None) -> FollowUps:
        """Reminders and escalations due now, each recorded as done (REMIND, ESCALATE)
        before the transport does it: whichever replica gets there first does it, once."""
        now = self._clock()
        done: dict[Transition, list[Due]] = {REMIND: [], ESCALATE: []}
        for transition, owed in done.items():
            for approval in await self._store.due(transition, now=now, team_id=team_id):
                try:
                    taken = await self._store.follow_up(transition, approval, now=now)
                except IllegalTransition:  # another replica did it, or it was decided
                    continue
                r = taken.request
                policy = (await self._policies.get(taken.thread.team_id, r.tool)).for_request(r)
                owed.append(Due(taken, policy))
        return FollowUps(tuple(done[REMIND]), tuple(done[ESCALATE]))

    async def escalation_posted(self, approval: Approval, *, ts: str) -> None:
        await self._store.escalation_posted(approval, ts=ts)

    async def knows(self, thread: Thread) -> bool:
        """Whether this thread already is a conversation (so replies in it continue it)."""
        return await self._store.knows(thread)

    async def approval(self, team_id: str, approval_id: str) -> Approval | None:
        return await self._store.get(team_id, approval_id)

    async def pending(
        self, team_id: str, *, limit: int = 20, offset: int = 0
    ) -> tuple[Approval, ...]:
        return await self._store.pending(team_id, limit=limit, offset=offset)

    async def inbox(
        self, team_id: str, person: str, facts: Facts, *, scan: int
    ) -> tuple[Approval, ...]:
        """The open requests `person` may decide (or answer) now, oldest first, among the
        `scan` oldest pending ones of others: not past their deadline, not voted on by them,
        and allowed by the trust rules with `facts` (the click checks again)."""
        policies = {p.tool: p for p in await self._policies.all(team_id)}
        now, mine = self._clock(), []
        for approval in await self._store.inbox(team_id, person, limit=scan):
            r = approval.request
            if r.asks == "requester" or r.expires_at <= now:
                continue
            if any(v.by == person for v in approval.votes):
                continue
            policy = policies.get(r.tool) or self._policies.of(r.tool, None)
            try:
                await self._check_eligible(
                    approval, None, person, facts, policy=policy.for_request(r)
                )
            except DecisionRefused:
                continue
            mine.append(approval)
        return tuple(mine)

    async def requested_by(self, team_id: str, person: str, *, limit: int) -> tuple[Approval, ...]:
        """`person`'s requests still waiting, or decided with their turn still going."""
        return await self._store.requested_by(team_id, person, limit=limit)

    async def pending_by_tool(self) -> dict[str, int]:
        """Requests waiting for a decision, by tool, in every workspace (for metrics)."""
        return await self._store.pending_by_tool()

    async def card_posted(self, approval: Approval, *, ts: str) -> Approval | None:
        """The card is out, at `ts`; None when its outbox had already moved on."""
        try:
            return await self._store.card_posted(approval, ts=ts)
        except IllegalTransition as refused:
            log.warning(
                "card of approval %s posted, but: %s",
                approval.id,
                refused,
                extra={"approval_id": approval.id},
            )
            return None

    async def card_failed(self, approval: Approval) -> Approval | None:
        """Slack refused the card for good (the transport tells the requester)."""
        try:
            return await self._store.card_failed(approval, now=self._clock())
        except IllegalTransition as refused:
            log.warning(
                "card of approval %s failed, but: %s",
                approval.id,
                refused,
                extra={"approval_id": approval.id},
            )
            return None

    async def audit_trail(
        self, team_id: str, tool: str | None = None, *, limit: int = 20, offset: int = 0
    ) -> list[AuditEntry]:
        return await self._store.audit_trail(team_id, tool=tool, limit=limit, offset=offset)

    # -- internals ---------------------------------------------------------------------

    def _settled(self, approval: Approval) -> None:
        """Tell the observer a request was settled (a vote towards a quorum settles none)."""
        if (decision := approval.decision) is None:
            return
        outcome: DecisionOutcome
        match decision:
            case Approved():
                outcome = "approved"
            case Denied():
                outcome = "denied"
            case Expired():
                outcome = "expired"
            case Answered():
                outcome = "answered"
            case unreachable:
                assert_never(unreachable)
        r = approval.request
        self._observer.decided(r.tool, outcome, (decision.at - r.requested_at).total_seconds())

    def _turn_ended(self, result: TurnOutcome | Resumed | None, seconds: float) -> None:
        """Tell the observer how a turn ended, and how each approved call of a resume that
        ended for good had ended: one still only started never will (outcome unknown)."""
        if result is None:  # not resumed here: nothing ran
            return
        if isinstance(result, Resumed):
            if not (isinstance(result.outcome, Failed) and result.outcome.retrying):
                for a in result.settled:
                    if isinstance(a.decision, Approved) and isinstance(a.execution, Started):
                        self._observer.executed(a.request.tool, "unknown")
            result = result.outcome
        name: TurnOutcomeName
        ran: float | None = seconds
        match result:
            case Reply():
                name = "reply"
            case AwaitingApproval():
                name = "awaiting_approval"
            case Failed():
                name = "failed"
            case Busy():
                name, ran = "busy", None
            case AnsweredInThread():
                name, ran = "answered", None
            case unreachable:
                assert_never(unreachable)
        self._observer.turn_ended(name, ran)

    async def _run(
        self,
        scope: TurnScope,
        snapshot_id: str | None,
        told: Callable[[str], Awaitable[None]],
        start: Callable[[AgentChat[Any]], Any],
    ) -> AgentResponse[Any]:
        """Run one Genkit turn in this workspace's scope, telling its text as it grows."""
        await told("")
        agent = self._runtime.agent
        chat = agent.chat(snapshot_id=snapshot_id) if snapshot_id else agent.chat()
        # A model that never answers must not hold the thread (or a resume lease) forever.
        # Approved calls run under their own timeout meanwhile (agent/approval.py ModelTime).
        async with scope.model_time.limit(self._turn_timeout.total_seconds()):
            with _scoped(scope):
                turn = start(chat)
                try:
                    said = ""
                    async for chunk in turn.stream:
                        if chunk.text and _from_model(chunk):
                            said += chunk.text
                            await told(said)
                finally:
                    response: AgentResponse[Any] = await turn.response
        return response

    async def _paused(
        self, conversation_id: str, thread: Thread, scope: TurnScope, out: AgentResponse[Any]
    ) -> tuple[PausedTurn, tuple[Approval, ...]]:
        """A turn that stopped on interrupts, as the paused turn and one approval per
        interrupt, each under the policy the middleware read for its call."""
        now = self._clock()
        turn = PausedTurn(
            id=self._new_id(),
            conversation_id=conversation_id,
            thread=thread,
            session_id=out.session_id or "",
            snapshot_id=out.snapshot_id or "",
            at=now,
        )
        notes = {
            p.tool_request.ref: interrupt_note(p)
            for p in (out.message.content if out.message else [])
            if p.tool_request is not None
        }
        tools = list(dict.fromkeys(intr.name for intr in out.interrupts))
        history = await self._store.history(
            scope.team_id,
            scope.requester,
            tools,
            since=now - timedelta(days=HISTORY_DAYS),
            days=HISTORY_DAYS,
        )
        approvals = []
        for intr in out.interrupts:
            called = scope.calls.get(intr.ref or "")
            if called is not None:
                policy, context = called.policy, called.context
            else:  # interrupted by the tool itself, or by a restart the gate refused
                stored = await self._policies.get(scope.team_id, intr.name)
                policy, context = stored.for_call(intr.input, scope.requester), Context()
            note = notes.get(intr.ref, {})
            preview = note.get("preview")
            asks = note.get("asks") if note.get("asks") in ("requester", "approvers") else None
            request = Request(
                tool=intr.name,
                ref=intr.ref or "",
                input=intr.input if isinstance(intr.input, dict) else {"value": intr.input},
                requester=scope.requester,
                why=str(note.get("why") or policy.why),
                requested_at=now,
                expires_at=now + policy.timeout,
                participants=scope.participants,
                preview=preview if isinstance(preview, str) else None,
                approvals_needed=1 if asks else policy.approvals,
                context=replace(context, history=history[intr.name]),
                asks=asks,
            )
            # A question to the requester goes into their thread; anything else to a channel.
            channel = thread.channel_id if asks == "requester" else policy.channel
            card = Card(channel) if channel else None
            reminder = escalation = None
            # The requester is in their thread: no reminder, nobody to escalate to.
            to_approvers = asks != "requester"
            if to_approvers and policy.remind_after is not None:
                reminder = FollowUp(now + policy.remind_after, ReminderState.SCHEDULED)
            if to_approvers and policy.escalate_after and policy.escalate_to is not None:
                escalation = FollowUp(
                    now + policy.escalate_after, EscalationState.SCHEDULED, policy.escalate_to
                )
            approvals.append(
                Approval(
                    self._new_id(),
                    turn.id,
                    thread,
                    request,
                    card=card,
                    reminder=reminder,
                    escalation=escalation,
                )
            )
        return turn, tuple(approvals)

    async def _run_edited(self, claim: Claim) -> tuple[Approval, ...]:
        """Run the calls approved with changes that have not run (at most once each: see
        agent/approval.py `run_edited`); the turn's approvals as they are then."""
        edited = [
            a
            for a in claim.approvals
            if a.edit and isinstance(a.decision, Approved) and isinstance(a.execution, NotStarted)
        ]
        for approval in edited:
            tool = self._runtime.tools.get(approval.request.tool)
            await run_edited(
                self._store,
                tool.action() if tool else None,
                approval,
                clock=self._clock,
                observer=self._observer,
                seconds=self._tool_timeouts.of(approval.request.tool),
            )
        return await self._store.turn_approvals(claim.turn_id) if edited else claim.approvals

    async def _resume_failed(self, claim: Claim, *, model_unavailable: bool) -> Resumed | None:
        """Leave the turn for the sweep to retry, or give up after a few attempts."""
        now = self._clock()
        retrying = claim.attempt < MAX_RESUME_ATTEMPTS
        try:
            if retrying:
                await self._store.renew(claim, until=now + RETRY_DELAY)
                settled = await self._store.turn_approvals(claim.turn_id)
            else:
                # The thread continues from before the failed turn, not its dangling calls.
                settled = await self._store.give_up(claim, now=now)
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
        waiting = await self._store.waiting_on(thread)
        asked = [a for a in waiting if a.request.asks == "requester" and a.decision is None]
        if text.strip() and asked and asked[0].request.requester == requester:
            try:  # the requester's reply is the answer their question waits for
                answer = await self.answer(thread.team_id, asked[0].id, requester, text)
                return AnsweredInThread(thread, answer)
            except (DecisionRefused, InvalidAnswer):
                pass  # answered meanwhile (the button), or its form wants a modal
        return Busy(thread, waiting)

    async def _release(self, conversation_id: str, *, snapshot_id: str | None) -> None:
        """Free the thread, trying again through a short database outage; after that its
        hold runs out by itself (turn timeout plus lease)."""
        for delay in RELEASE_BACKOFF:
            await asyncio.sleep(delay)
            try:
                await self._store.release_thread(conversation_id, snapshot_id=snapshot_id)
                return
            except Exception:
                log.warning("could not free conversation %s", conversation_id, exc_info=True)
        log.error("conversation %s stays held until its hold runs out", conversation_id)

    async def _keep_lease(self, claim: Claim) -> None:
        """Renew the lease while the resume runs (a tool that runs for long included); stop
        only once another process has the turn."""

        async def renew(until: datetime) -> bool:
            try:
                await self._store.renew(claim, until=until)
            except IllegalTransition:
                log.error("turn %s lost its lease: another process resumes it", claim.turn_id)
                return False
            return True

        await self._heartbeat(renew, f"the lease of turn {claim.turn_id}")

    async def _keep_thread(self, conversation_id: str) -> None:
        """Hold the thread while a new message's turn runs; a process that dies leaves it
        held one lease at most."""

        async def keep(until: datetime) -> bool:
            return await self._store.keep_thread(conversation_id, until=until)

        await self._heartbeat(keep, f"the thread of conversation {conversation_id}")

    async def _heartbeat(self, renew: Callable[[datetime], Awaitable[bool]], what: str) -> None:
        """Renew every third of the lease until `renew` says it is lost (False). A failed
        renewal (the database dropped the connection, or refused it for a moment) is retried
        soon: the last one renewed still has two thirds of its time to run."""
        every = self._lease.total_seconds() / 3
        wait = every
        while True:
            await asyncio.sleep(wait)
            try:
                if not await renew(self._clock() + self._lease):
                    return
            except Exception:  # a database hiccup: the lease may still be renewed soon
                log.warning("could not renew %s", what, exc_info=True)
                wait = min(RENEW_RETRY.total_seconds(), every)
            else:
                wait = every

    async def _let_go(self, claim: Claim) -> None:
        """A clean shutdown cut this resume off: hand the turn back (LET_GO), so the next
        sweep (here or in another replica) resumes it at once, not when the lease runs out."""
        try:
            await self._store.let_go(claim, now=self._clock())
        except IllegalTransition:
            log.debug("turn %s was taken over before it was let go", claim.turn_id)
        except Exception:  # its lease runs out instead
            log.warning("could not let go of turn %s", claim.turn_id, exc_info=True)


def _from_model(chunk: AgentChunk[Any]) -> bool:
    """Whether the chunk is the model's words: the stream also carries what middleware adds
    to the conversation (a file the Filesystem tools read, for one), which is not a reply."""
    raw = chunk.raw.model_chunk if chunk.raw is not None else None
    return raw is None or raw.role in (None, "model")


def _told(
    sink: TextSink | None, thread: Thread, requester: str
) -> Callable[[str], Awaitable[None]]:
    """The sink, bound to one turn's thread and requester."""

    async def told(text: str) -> None:
        if sink is not None:
            await sink(Progress(thread, requester, text))

    return told


def resume_parts(
    approvals: Sequence[Approval], forms: Collection[str] = ()
) -> tuple[list[Part], list[Part]]:
    """One resume answering every interrupt of the turn, built from the stored requests only:
    (respond parts, restart parts). A question is only ever answered (`forms`: the question
    tools whose answer is an object of their own form)."""
    respond: list[Part] = []
    restart: list[Part] = []
    for approval in approvals:
        r = approval.request
        intr: AgentInterrupt[Any, Any] = AgentInterrupt(r.tool, r.ref or None, r.input)
        if r.question:
            respond.append(intr.respond(answered(approval, r.tool in forms)))
            continue
        match approval.decision:
            case Approved() if approval.edit is not None:  # run by the workflow, answered here
                if isinstance(approval.execution, NotStarted):
                    raise ValueError(f"approval {approval.id} was edited and has not run")
                changes = approval.edit.changes(r.input)
                output = recorded(approval.execution)
                respond.append(intr.respond({"output": output, "approved_with_changes": changes}))
            case Approved(by=by):
                if isinstance(approval.execution, NotStarted):
                    meta = {"tool_approved": True, "approval_id": approval.id, "approved_by": by}
                    restart.append(intr.restart(resumed_metadata=meta))
                else:
                    respond.append(intr.respond(recorded(approval.execution)))
            case Denied(by=by, reason=reason):
                error = f"denied by {by}" + (f": {reason}" if reason else "")
                respond.append(intr.respond({"ok": False, "error": error}))
            case Expired():
                respond.append(intr.respond({"ok": False, "error": "approval expired"}))
            case Answered():
                raise ValueError(f"approval {approval.id} asked no question, yet was answered")
            case None:
                raise ValueError(f"approval {approval.id} is still pending; the turn is not ready")
            case unreachable:
                assert_never(unreachable)
    return respond, restart


def shaped_by(participants: tuple[str, ...], approvals: Sequence[Approval]) -> tuple[str, ...]:
    """The turn's participants once it resumes: whoever answered one of its questions, or
    denied with a reason the model is sent, put words before the model too, so they may
    not approve what it asks next."""
    more = [
        a.decision.by
        for a in approvals
        if isinstance(a.decision, Answered)
        or (isinstance(a.decision, Denied) and a.decision.reason)
    ]
    return tuple(dict.fromkeys([*participants, *more]))


@contextlib.contextmanager
def _scoped(scope: TurnScope) -> Iterator[None]:
    token = current_scope.set(scope)
    team_token = current_team.set(scope.team_id)
    try:
        yield
    finally:
        current_team.reset(team_token)
        current_scope.reset(token)
