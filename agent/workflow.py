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
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
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
    coerced,
    current_scope,
    interrupt_note,
    preview_of,
    recorded,
    run_edited,
    same_value,
)
from agent.context import Line, as_provenance, conversation_lines, human_message
from agent.observer import DecisionOutcome, Observer, TurnOutcomeName
from agent.policy import ApproverFacts, Policy, PolicyService, Refusal, refusal
from agent.prompt_edits import is_prompt, prompt_edited, prompt_form
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
    # The approver saw another version than the current one.
    | Literal["changed"]
    # A question answers no Approve or Deny; only the requester answers what asks them.
    | Literal["a_question", "not_a_question", "not_the_requester"]
)


class InvalidAnswer(ValueError):
    """An answer that does not fit its question's form: what is wrong, by field."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


class EditRefused(InvalidAnswer):
    """An edit whose new version would move the decision (elsewhere, to other people, or to
    more of them): by field, why; nothing changed."""


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

    @property
    def tool_timeouts(self) -> ToolTimeouts:
        return self._tool_timeouts

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
        heartbeat = asyncio.create_task(self._keep_thread(held.conversation_id, now + self._lease))
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
        resume = asyncio.current_task()
        lost = asyncio.Event()

        def stop() -> None:  # the lease is lost: whatever this resume still does is no one's
            lost.set()
            if resume is not None:
                resume.cancel()

        heartbeat = asyncio.create_task(self._keep_lease(claim, now + self._lease, stop))
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
        its tool's policy for the current version (or `policy`, given)."""
        r = approval.request
        policy = policy or self._for_version(self._policies.of(r.tool, stored), approval)
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
        seen: int | None = None,
    ) -> Decided:
        """Record one decision on version `seen` of the request (the one the approver was
        shown; None: the current one), atomically; raises DecisionRefused and changes nothing
        else. A decision on a version that is no longer current is refused ("changed")."""
        approval = await self.check_decider(
            team_id, approval_id, approver, facts or ApproverFacts()
        )
        now = self._clock()  # after the look-ups: the deadline holds at the write
        decision = Approved(approver, now, reason) if approve else Denied(approver, now, reason)
        return await self._record(approval, decision, seen=seen)

    async def _record(
        self,
        approval: Approval,
        decision: Approved | Denied,
        *,
        seen: int | None,
        edit: Edit | None = None,
    ) -> Decided:
        """One decision on version `seen`, as storage's conditional write takes it (`edit`:
        with the new version it makes, of a request one approver decides)."""
        if seen is not None and seen != approval.version:
            raise DecisionRefused("changed", approval)
        try:
            decided, others_pending = await self._store.decide(
                approval, decision, edited=edit, seen=seen
            )
        except IllegalTransition as refused:
            raise await self._refused(refused, approval) from None
        self._settled(decided)
        # A vote towards a quorum leaves the approval pending: nothing to resume yet.
        ready = decided.decision is not None and others_pending == 0
        return Decided(decided, turn_ready=ready)

    def edit_form(self, tool: str, given: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The JSON schema of `tool`'s input, for an approver's changes; None: no schema. A
        permission prompt's (`prompt.<tool>`) is made from its input, `given`."""
        if is_prompt(tool):
            return prompt_form(given)
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
        seen: int | None = None,
    ) -> Decided:
        """Edit & approve of version `seen`: `changed`, as the tool's schema validates it
        (InvalidAnswer by field), compared with the current version. Equal, it is a plain
        Approve of that version; different, it makes the next version, approved by this
        approver alone (with several approvers needed, the others approve again). The new
        version's policy is evaluated afresh: one that would route the decision elsewhere,
        to other approvers or escalation, or need more approvals, is refused by field
        (EditRefused); the approver must be one under it too."""
        facts = facts or ApproverFacts()
        approval = await self.check_decider(team_id, approval_id, approver, facts)
        if seen is not None and seen != approval.version:
            raise DecisionRefused("changed", approval)
        r, current = approval.request, approval.current
        tool = self._runtime.tools.get(r.tool)
        if is_prompt(r.tool):
            new, errors = prompt_edited(current.input, changed)
        elif tool is None:
            raise InvalidAnswer({"input": "no such tool"})
        else:
            new, errors = coerced(tool.action(), changed)
        if errors or not isinstance(new, dict):
            raise InvalidAnswer(errors or {"input": "an object is needed"})
        if same_value(new, current.input):  # nothing changed: a vote for what it is
            decision = Approved(approver, self._clock())
            return await self._record(approval, decision, seen=approval.version)
        base = await self._policies.get(team_id, r.tool)
        now_policy = self._for_version(base, approval)
        candidate = replace(
            approval, edit=Edit(new, approver, self._clock()), version=approval.version + 1
        )
        new_policy = self._for_version(base, candidate)
        if moved := _moves(now_policy, new_policy, r.approvals_needed):
            raise EditRefused(self._moved_fields(base, approval, new, moved))
        await self._check_eligible(candidate, None, approver, facts, policy=new_policy)
        preview = await preview_of(self._runtime.previews, r.tool, new)
        # The decision's time, after the look-ups and the preview, as an Approve takes it.
        edit = Edit(new, approver, self._clock(), preview)
        if r.approvals_needed > 1:
            try:
                done = await self._store.edit(approval, edit, seen=approval.version)
            except IllegalTransition as refused:
                raise await self._refused(refused, approval) from None
            return Decided(done, turn_ready=False)
        decision = Approved(approver, edit.at)
        return await self._record(approval, decision, seen=approval.version, edit=edit)

    def _for_version(self, base: Policy, approval: Approval) -> Policy:
        """The tool's policy for the request's current version: rules, quorum, route,
        approvers and escalation read that version's validated input (and where each value
        came from: what an approver typed, from a human)."""
        v = approval.current
        return base.for_call(v.input, approval.request.requester, as_provenance(v.input, v.sources))

    def _moved_fields(
        self, base: Policy, approval: Approval, new: dict[str, Any], why: str
    ) -> dict[str, str]:
        """Which changed fields move the decision, each by itself (all changed fields when
        only together they do), with why."""
        current = approval.current.input
        changed = [k for k in dict.fromkeys([*current, *new]) if not _same_field(current, new, k)]
        blamed = []
        for key in changed:
            alone = {k: v for k, v in current.items() if k != key}
            if key in new:
                alone[key] = new[key]
            one = replace(approval, edit=Edit(alone, "", self._clock()), version=0)
            if _moves(
                self._for_version(base, approval),
                self._for_version(base, one),
                approval.request.approvals_needed,
            ):
                blamed.append(key)
        return dict.fromkeys(blamed or changed, why)

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
                base = await self._policies.get(taken.thread.team_id, r.tool)
                owed.append(Due(taken, self._for_version(base, taken)))
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
                    approval, None, person, facts, policy=self._for_version(policy, approval)
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
            asked = intr.input if isinstance(intr.input, dict) else {"value": intr.input}
            given = asked  # version 1: the call as the tool's schema took it
            if called is not None:
                policy, context = called.policy, called.context
                if isinstance(called.input, dict):
                    given = called.input
            else:  # interrupted by the tool itself, or by a restart the gate refused
                stored = await self._policies.get(scope.team_id, intr.name)
                policy, context = stored.for_call(intr.input, scope.requester), Context()
            note = notes.get(intr.ref, {})
            preview = note.get("preview")
            asks = note.get("asks") if note.get("asks") in ("requester", "approvers") else None
            request = Request(
                tool=intr.name,
                ref=intr.ref or "",
                input=given,
                asked=None if _exactly(given, asked) else asked,
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

    async def _keep_lease(self, claim: Claim, until: datetime, stop: Callable[[], None]) -> None:
        """Renew the lease while the resume runs (a tool that runs for long included); once
        it is lost (another process has the turn, or it ran out unrenewed), `stop` the
        resume: another process may already run it."""

        async def renew(until: datetime) -> bool:
            try:
                await self._store.renew(claim, until=until)
            except IllegalTransition:
                log.error("turn %s lost its lease: another process resumes it", claim.turn_id)
                return False
            return True

        await self._heartbeat(renew, f"the lease of turn {claim.turn_id}", until)
        stop()

    async def _keep_thread(self, conversation_id: str, until: datetime) -> None:
        """Hold the thread while a new message's turn runs; a process that dies leaves it
        held one lease at most."""

        async def keep(until: datetime) -> bool:
            return await self._store.keep_thread(conversation_id, until=until)

        await self._heartbeat(keep, f"the thread of conversation {conversation_id}", until)

    async def _heartbeat(
        self, renew: Callable[[datetime], Awaitable[bool]], what: str, until: datetime
    ) -> None:
        """Renew every third of the lease until it is lost: `renew` says so (False), or it
        ran out (`until`) before a renewal went through. A renewal that fails (the database
        dropped the connection) or hangs (a lock, a stalled connection) past a third of the
        lease is retried soon: the last one renewed still has time to run."""
        every = self._lease.total_seconds() / 3
        wait = every
        while True:
            await asyncio.sleep(wait)
            left = (until - self._clock()).total_seconds()
            if left <= 0:
                log.error("%s ran out before it could be renewed", what)
                return
            renewed = self._clock() + self._lease
            try:
                async with asyncio.timeout(min(every, left)):
                    if not await renew(renewed):
                        return
            except Exception:  # a database hiccup: the lease may still be renewed soon
                log.warning("could not renew %s", what, exc_info=True)
                wait = min(RENEW_RETRY.total_seconds(), every)
            else:
                until, wait = renewed, every

    async def _let_go(self, claim: Claim) -> None:
        """A clean shutdown cut this resume off: hand the turn back (LET_GO), so the next
        sweep (here or in another replica) resumes it at once, not when the lease runs out."""
        try:
            await self._store.let_go(claim, now=self._clock())
        except IllegalTransition:
            log.debug("turn %s was taken over before it was let go", claim.turn_id)
        except Exception:  # its lease runs out instead
            log.warning("could not let go of turn %s", claim.turn_id, exc_info=True)


def _moves(now: Policy, new: Policy, approvals: int) -> str | None:
    """Why a new version's policy would move the decision from the people who may make it
    now; None when it does not (a version that needs no approval moves nothing)."""
    if new.allowed:
        return None
    end = "; deny it instead and let the agent ask again"
    if new.approvals > approvals:
        return f"with this value the call needs {new.approvals} approvals, not {approvals}{end}"
    if new.channel != now.channel:
        return f"with this value the request goes to another approver channel{end}"
    if set(new.approver_users) != set(now.approver_users) or set(new.approver_groups) != set(
        now.approver_groups
    ):
        return f"with this value other people decide the request{end}"
    if (new.escalate_to, set(new.escalate_users), set(new.escalate_groups)) != (
        now.escalate_to,
        set(now.escalate_users),
        set(now.escalate_groups),
    ) or (new.escalate_after != now.escalate_after):
        return f"with this value the request escalates elsewhere{end}"
    return None


def _same_field(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    return (key in a) == (key in b) and same_value(a.get(key), b.get(key))


def _exactly(a: Any, b: Any) -> bool:
    """Equal as Genkit compares a restart's input with the request (sorted-key JSON)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


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
        # The model's own arguments: Genkit matches a restart's input to them exactly.
        asked = r.asked if r.asked is not None else r.input
        intr: AgentInterrupt[Any, Any] = AgentInterrupt(r.tool, r.ref or None, asked)
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
