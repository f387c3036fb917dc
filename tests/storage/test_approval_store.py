"""ApprovalStore: each transition takes exactly when the lifecycle table allows it, and a
refused one writes nothing (no state, no audit row, no side write)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from storage import transitions
from storage.approval_store import ApprovalStore
from storage.db import SessionFactory, make_session_factory
from storage.domain import (
    Answered,
    Approval,
    ApprovalState,
    Approved,
    Card,
    CardState,
    Claim,
    Context,
    Denied,
    Edit,
    ExecutionState,
    History,
    PausedTurn,
    Request,
    Said,
    Source,
    Thread,
    TurnState,
)
from storage.lifecycle import (
    ANSWER,
    APPROVE,
    CARD_FAILED,
    CARD_POSTED,
    CLAIM,
    COMPLETE,
    DENY,
    ESCALATE,
    EXPIRE,
    FINISH_EXECUTION,
    GIVE_UP,
    LET_GO,
    REMIND,
    RENEW,
    RETRY_CARD,
    START_EXECUTION,
    STATES,
    IllegalTransition,
    Requirement,
    State,
    Subject,
    Transition,
)
from storage.models import ApprovalRow, AuditRow, ConversationRow, TurnRow
from storage.policies import PolicyStore

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@dataclass
class Db:
    store: ApprovalStore
    sessions: SessionFactory
    team: str

    def thread(self) -> Thread:
        return Thread(self.team, "D0STORE", f"{uuid.uuid4().int % 10**9}.000100")

    async def seed(
        self,
        *,
        status: ApprovalState = ApprovalState.PENDING,
        execution: ExecutionState = ExecutionState.NOT_STARTED,
        expires_at: datetime = NOW + HOUR,
        turn: TurnState = TurnState.WAITING,
        lease_until: datetime | None = None,
        attempts: int = 0,
        siblings: tuple[ApprovalState, ...] = (),
        asks: str | None = None,
    ) -> tuple[Approval, str]:
        """A conversation (held), a turn and its approval (and siblings) in the given states,
        written directly; the approval as the store reads it, and the conversation id."""
        thread = self.thread()
        conversation, turn_id = str(uuid.uuid4()), str(uuid.uuid4())
        rows: list[Any] = [
            ConversationRow(
                id=conversation,
                team_id=self.team,
                channel_id=thread.channel_id,
                thread_ts=thread.thread_ts,
                snapshot_id="before",
                busy_until=NOW + HOUR,
                created_at=NOW,
                last_active_at=NOW,
            ),
            TurnRow(
                id=turn_id,
                team_id=self.team,
                conversation_id=conversation,
                session_id="s",
                snapshot_id="paused",
                state=turn,
                lease_until=lease_until,
                attempts=attempts,
                created_at=NOW,
                updated_at=NOW,
            ),
        ]
        ids = [str(uuid.uuid4()) for _ in range(1 + len(siblings))]
        for i, (approval_id, state) in enumerate(zip(ids, (status, *siblings), strict=True)):
            sibling_decided = state != ApprovalState.PENDING
            rows.append(
                ApprovalRow(
                    id=approval_id,
                    team_id=self.team,
                    turn_id=turn_id,
                    tool="transferMoney",
                    ref=f"ref-{i}",
                    input={"amount": 5},
                    requester="UASK",
                    requested_at=NOW - HOUR + timedelta(seconds=i),
                    expires_at=expires_at,
                    why="needs approval",
                    status=state,
                    decided_by="UBOSS" if sibling_decided and state != "expired" else None,
                    decided_at=NOW - HOUR if sibling_decided else None,
                    reason=None,
                    execution=execution if i == 0 else ExecutionState.NOT_STARTED,
                    output={"ok": True} if execution == ExecutionState.FINISHED else None,
                    card_channel="C0APPROVE",
                    card_ts=None,
                    asks=asks if i == 0 else None,
                )
            )
        async with self.sessions.begin() as db:
            for row in rows:
                db.add(row)
                await db.flush()
        approval = await self.store.reads.get(self.team, ids[0])
        assert approval is not None
        assert (approval.state, approval.execution_state) == (status, execution)
        return approval, conversation

    async def audit_rows(self) -> int:
        async with self.sessions() as db:
            query = select(func.count()).where(AuditRow.team_id == self.team)
            return int(await db.scalar(query) or 0)

    async def row(self, model: Any, key: str) -> Any:
        async with self.sessions() as db:
            return await db.get_one(model, key)


@pytest.fixture
def db(pg_engine: AsyncEngine, team: str) -> Db:
    sessions = make_session_factory(pg_engine)
    return Db(ApprovalStore(sessions), sessions, team)


def test_every_requirement_and_subject_has_its_sql() -> None:
    assert set(transitions.REQUIREMENTS) == set(Requirement)
    assert set(transitions.STATE_COLUMN) == set(Subject)


def expected(transition: Transition, state: State, holds: dict[Requirement, bool]) -> State | None:
    """What the lifecycle says: the state entered, or None when it refuses."""
    try:
        return transition.check(state, holds)
    except IllegalTransition:
        return None


Act = Callable[[Db, Approval], Awaitable[object]]
APPROVAL_ACTS: dict[Transition, Act] = {
    APPROVE: lambda d, a: d.store.decisions.decide(a, Approved("UBOSS", NOW, "ok")),
    DENY: lambda d, a: d.store.decisions.decide(a, Denied("UBOSS", NOW, "no")),
    ANSWER: lambda d, a: d.store.decisions.answer(a, Answered("UBOSS", NOW, "yes")),
    EXPIRE: lambda d, a: d.store.decisions.expire(a, now=NOW),
    START_EXECUTION: lambda d, a: d.store.executions.start_execution(a, now=NOW),
    FINISH_EXECUTION: lambda d, a: d.store.executions.finish_execution(
        a, output={"ok": 1}, now=NOW
    ),
}


@pytest.mark.parametrize("transition", list(APPROVAL_ACTS), ids=lambda t: t.name)
async def test_approval_transitions_take_exactly_when_the_table_allows(
    db: Db, transition: Transition
) -> None:
    act = APPROVAL_ACTS[transition]
    deadlines, asking = (NOW - HOUR, NOW + HOUR), (None, "requester")
    combos = itertools.product(ApprovalState, ExecutionState, deadlines, asking)
    for status, execution, expires_at, asks in combos:
        approval, _ = await db.seed(
            status=status, execution=execution, expires_at=expires_at, asks=asks
        )
        holds = {
            Requirement.AS_SEEN: True,
            Requirement.ASKS_APPROVAL: asks is None,
            Requirement.ASKS_ANSWER: asks is not None,
            Requirement.BEFORE_DEADLINE: expires_at > NOW,
            Requirement.PAST_DEADLINE: expires_at <= NOW,
            Requirement.APPROVED: status == ApprovalState.APPROVED,
            Requirement.SAME_CALL: True,
            Requirement.SAME_VERSION: True,
            Requirement.NEW_VOTER: True,
            Requirement.QUORUM_MET: True,  # one approver needed, none so far
        }
        state = execution if transition.subject == Subject.EXECUTION else status
        enters = expected(transition, state, holds)
        case = f"{transition.name} from {status}/{execution}, expires {expires_at:%H:%M}, {asks}"
        audits = await db.audit_rows()
        if enters is None:
            with pytest.raises(IllegalTransition) as refused:
                await act(db, approval)
            assert refused.value.current is not None, case
            assert refused.value.current.state == status, case
            assert refused.value.current.execution_state == execution, case
            assert await db.audit_rows() == audits, case
            row = await db.row(ApprovalRow, approval.id)
            assert (row.status, row.execution) == (status, execution), case
        else:
            await act(db, approval)
            row = await db.row(ApprovalRow, approval.id)
            now_state = row.execution if transition.subject == Subject.EXECUTION else row.status
            assert now_state == enters, case
            assert await db.audit_rows() == audits + 1, case


async def test_a_refusal_says_which_requirement_failed(db: Db) -> None:
    approval, _ = await db.seed(expires_at=NOW - HOUR)
    with pytest.raises(IllegalTransition) as late:
        await db.store.decisions.decide(approval, Approved("UBOSS", NOW))
    assert late.value.unmet == (Requirement.BEFORE_DEADLINE,)
    assert late.value.current is not None and late.value.current.decision is None
    other = replace(approval, request=replace(approval.request, ref="not-this-call"))
    approved, _ = await db.seed(status=ApprovalState.APPROVED)
    with pytest.raises(IllegalTransition) as wrong_call:
        await db.store.executions.start_execution(replace(approved, request=other.request), now=NOW)
    assert wrong_call.value.unmet == (Requirement.SAME_CALL,)
    gone = replace(approval, id=str(uuid.uuid4()))
    with pytest.raises(IllegalTransition) as missing:
        await db.store.decisions.expire(gone, now=NOW)
    assert missing.value.state is None and missing.value.current is None


async def claim_of(db: Db, approval: Approval, conversation: str, attempt: int) -> Claim:
    return Claim(approval.turn_id, conversation, approval.thread, "paused", attempt, (approval,))


TURN_ACTS: dict[Transition, Callable[[Db, Claim], Awaitable[object]]] = {
    CLAIM: lambda d, c: d.store.turns.claim(c.turn_id, now=NOW, lease_until=NOW + HOUR),
    RENEW: lambda d, c: d.store.turns.renew(c, until=NOW + 2 * HOUR),
    COMPLETE: lambda d, c: d.store.turns.complete(c, now=NOW, snapshot_id="after"),
    GIVE_UP: lambda d, c: d.store.turns.give_up(c, now=NOW),
    LET_GO: lambda d, c: d.store.turns.let_go(c, now=NOW),
}


@pytest.mark.parametrize("transition", list(TURN_ACTS), ids=lambda t: t.name)
async def test_turn_transitions_take_exactly_when_the_table_allows(
    db: Db, transition: Transition
) -> None:
    act = TURN_ACTS[transition]
    leases = (None, NOW - HOUR, NOW + HOUR)
    pending = ((), (ApprovalState.PENDING,))
    for state, lease, siblings, own in itertools.product(TurnState, leases, pending, (1, 2)):
        approval, conversation = await db.seed(
            status=ApprovalState.APPROVED,
            turn=state,
            lease_until=lease,
            attempts=1,
            siblings=siblings,
        )
        holds = {
            Requirement.ALL_DECIDED: not siblings,
            Requirement.LEASE_RAN_OUT: lease is not None and lease < NOW,
            Requirement.OWN_CLAIM: own == 1,
        }
        enters = expected(transition, state, holds)
        case = f"{transition.name} from {state}, lease {lease}, {siblings}, attempt {own}"
        claim = await claim_of(db, approval, conversation, own)
        if enters is None:
            with pytest.raises(IllegalTransition):
                await act(db, claim)
            turn = await db.row(TurnRow, approval.turn_id)
            assert (turn.state, turn.attempts, turn.lease_until) == (state, 1, lease), case
            thread = await db.row(ConversationRow, conversation)
            assert (thread.busy_until, thread.snapshot_id) == (NOW + HOUR, "before"), case
            continue
        result = await act(db, claim)
        turn = await db.row(TurnRow, approval.turn_id)
        assert turn.state == enters, case
        thread = await db.row(ConversationRow, conversation)
        if transition in (COMPLETE, GIVE_UP):  # the thread is freed with the turn
            assert thread.busy_until is None, case
            assert thread.snapshot_id == ("after" if transition is COMPLETE else "before"), case
            assert isinstance(result, tuple) and [a.id for a in result][:1] == [approval.id]
        if transition is LET_GO:  # waiting again, the thread still held, recoverable at once
            assert turn.lease_until is None and thread.busy_until == NOW + HOUR, case
            recoverable = await db.store.turns.recoverable(now=NOW, team_id=db.team)
            assert (approval.turn_id in recoverable) == (not siblings), case
        if transition is CLAIM:
            assert isinstance(result, Claim) and result.attempt == 2 and turn.attempts == 2
            assert result.approvals[0].id == approval.id and result.thread == approval.thread
            assert (result.conversation_id, result.snapshot_id) == (conversation, "paused")


def new_approval(thread: Thread, turn_id: str, i: int) -> Approval:
    request = Request("transferMoney", f"ref-{i}", {"amount": i}, "UASK", "why", NOW, NOW + HOUR)
    return Approval(str(uuid.uuid4()), turn_id, thread, request, card=Card("C0APPROVE"))


async def test_pause_writes_the_turn_its_approvals_and_their_audit_rows(db: Db) -> None:
    thread = db.thread()
    held = await db.store.turns.hold_thread(
        thread, author="UASK", new_id=str(uuid.uuid4()), now=NOW, until=NOW + HOUR
    )
    assert held is not None and held.snapshot_id is None
    turn = PausedTurn(str(uuid.uuid4()), held.conversation_id, thread, "s", "snap", NOW)
    approvals = [new_approval(thread, turn.id, i) for i in range(3)]
    await db.store.turns.pause(turn, approvals)
    assert {a.id for a in await db.store.turns.waiting_on(thread)} == {a.id for a in approvals}
    assert await db.audit_rows() == 3
    trail = await db.store.reads.audit_trail(db.team)
    assert {(e.action, e.actor, e.approval_id) for e in trail} == {
        ("requested", "UASK", a.id) for a in approvals
    }
    # The waiting turn keeps the thread, even once its time as a running turn is over.
    later = NOW + 2 * HOUR
    assert (
        await db.store.turns.hold_thread(thread, author="UASK", new_id="x", now=later, until=later)
        is None
    )


async def test_a_chained_pause_is_written_only_with_its_completion(db: Db) -> None:
    approval, conversation = await db.seed(
        status=ApprovalState.APPROVED, turn=TurnState.RESUMING, lease_until=NOW + HOUR, attempts=1
    )
    turn = PausedTurn(str(uuid.uuid4()), conversation, approval.thread, "s", "snap2", NOW)
    chained = [new_approval(approval.thread, turn.id, 0)]
    lost = await claim_of(db, approval, conversation, attempt=7)  # someone else's claim now
    with pytest.raises(IllegalTransition):
        await db.store.turns.complete_and_pause(lost, now=NOW, turn=turn, approvals=chained)
    assert await db.store.reads.get(db.team, chained[0].id) is None and await db.audit_rows() == 0
    mine = await claim_of(db, approval, conversation, attempt=1)
    settled = await db.store.turns.complete_and_pause(mine, now=NOW, turn=turn, approvals=chained)
    assert [a.id for a in settled] == [approval.id]
    assert [a.id for a in await db.store.turns.waiting_on(approval.thread)] == [chained[0].id]
    assert (await db.row(ConversationRow, conversation)).busy_until is not None  # still held


async def test_threads_and_events(db: Db) -> None:
    thread = db.thread()
    assert not await db.store.turns.knows(thread)
    first = await db.store.turns.hold_thread(
        thread, author="UASK", new_id=str(uuid.uuid4()), now=NOW, until=NOW + HOUR
    )
    assert first is not None and await db.store.turns.knows(thread)
    assert (
        await db.store.turns.hold_thread(
            thread, author="UASK", new_id="y", now=NOW, until=NOW + HOUR
        )
        is None
    )
    await db.store.turns.release_thread(first.conversation_id, snapshot_id="s1")
    again = await db.store.turns.hold_thread(
        thread, author="UOTHER", new_id="z", now=NOW, until=NOW + HOUR
    )
    assert again == replace(first, snapshot_id="s1", participants=("UASK", "UOTHER"))
    await db.store.turns.release_thread(first.conversation_id, snapshot_id=None)
    third = await db.store.turns.hold_thread(
        thread, author="UASK", new_id="w", now=NOW, until=NOW + HOUR
    )
    assert third is not None and third.participants == ("UASK", "UOTHER")  # each one once


CARD_ACTS: dict[Transition, Callable[[Db, Approval], Awaitable[object]]] = {
    RETRY_CARD: lambda d, a: d.store.follow_ups.retry_card(a, now=NOW, stale=NOW - HOUR),
    CARD_POSTED: lambda d, a: d.store.follow_ups.card_posted(a, ts="1.5"),
    CARD_FAILED: lambda d, a: d.store.follow_ups.card_failed(a, now=NOW),
}


@pytest.mark.parametrize("transition", list(CARD_ACTS), ids=lambda t: t.name)
async def test_card_transitions_take_exactly_when_the_table_allows(
    db: Db, transition: Transition
) -> None:
    attempts = (NOW - 2 * HOUR, NOW)
    for card, status, attempted in itertools.product(CardState, ApprovalState, attempts):
        approval, _ = await db.seed(status=status)
        async with db.sessions.begin() as s:
            row = await s.get_one(ApprovalRow, approval.id)
            row.card_state, row.card_attempted_at = card, attempted
        holds = {
            Requirement.STILL_PENDING: status == ApprovalState.PENDING,
            Requirement.POST_RAN_OUT: attempted < NOW - HOUR,
        }
        enters = expected(transition, card, holds)
        case = f"{transition.name} from {card}, {status}, attempted {attempted:%H:%M}"
        audits = await db.audit_rows()
        if enters is None:
            with pytest.raises(IllegalTransition):
                await CARD_ACTS[transition](db, approval)
            assert (await db.row(ApprovalRow, approval.id)).card_state == card, case
            assert await db.audit_rows() == audits, case
            continue
        await CARD_ACTS[transition](db, approval)
        after = await db.row(ApprovalRow, approval.id)
        assert after.card_state == enters, case
        assert await db.audit_rows() == audits + (transition is CARD_FAILED), case
        if transition is RETRY_CARD:
            assert after.card_attempted_at == NOW, case
        if transition is CARD_POSTED:
            assert after.card_ts == "1.5", case


async def quorum(db: Db, needed: int) -> Approval:
    approval, _ = await db.seed()
    async with db.sessions.begin() as s:
        (await s.get_one(ApprovalRow, approval.id)).approvals_needed = needed
    found = await db.store.reads.get(db.team, approval.id)
    assert found is not None and found.request.approvals_needed == needed
    return found


async def test_a_quorum_needs_distinct_approvers_and_completes_once(db: Db) -> None:
    approval = await quorum(db, 2)
    first, _, _ = await db.store.decisions.decide(approval, Approved("UA", NOW))
    assert first.decision is None and [v.by for v in first.votes] == ["UA"]
    with pytest.raises(IllegalTransition) as again:
        await db.store.decisions.decide(approval, Approved("UA", NOW))
    assert Requirement.NEW_VOTER in again.value.unmet
    second, others, _ = await db.store.decisions.decide(approval, Approved("UB", NOW, "ok"))
    assert isinstance(second.decision, Approved) and second.decision.by == "UB"
    assert [v.by for v in second.votes] == ["UA", "UB"] and others == 0
    with pytest.raises(IllegalTransition) as late:
        await db.store.decisions.decide(approval, Approved("UC", NOW))
    assert late.value.state == ApprovalState.APPROVED
    assert [e.action for e in await db.store.reads.audit_trail(db.team)] == ["approved", "approved"]


async def test_a_deny_ends_a_quorum_after_votes(db: Db) -> None:
    approval = await quorum(db, 3)
    await db.store.decisions.decide(approval, Approved("UA", NOW))
    denied, _, _ = await db.store.decisions.decide(approval, Denied("UB", NOW, "no"))
    assert isinstance(denied.decision, Denied) and denied.decision.reason == "no"
    with pytest.raises(IllegalTransition):
        await db.store.decisions.decide(approval, Approved("UC", NOW))


async def test_twenty_people_approving_at_once_complete_a_quorum_of_two_once(db: Db) -> None:
    approval = await quorum(db, 2)

    async def click(i: int) -> str:
        try:
            now, _, _ = await db.store.decisions.decide(approval, Approved(f"U{i:02d}", NOW))
        except IllegalTransition:
            return "refused"
        return "approved" if now.decision is not None else "vote"

    results = await asyncio.gather(*(click(i) for i in range(20)))
    assert sorted(results) == sorted(["approved", "vote"] + ["refused"] * 18)
    final = await db.store.reads.get(db.team, approval.id)
    assert final is not None and len(final.votes) == 2 and isinstance(final.decision, Approved)


async def test_one_person_racing_themselves_votes_once(db: Db) -> None:
    approval = await quorum(db, 2)
    results = await asyncio.gather(
        *(db.store.decisions.decide(approval, Approved("UA", NOW)) for _ in range(5)),
        return_exceptions=True,
    )
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, IllegalTransition) for r in results if isinstance(r, BaseException))
    final = await db.store.reads.get(db.team, approval.id)
    assert final is not None and [v.by for v in final.votes] == ["UA"] and final.decision is None


async def test_an_edit_resets_a_quorums_votes_to_the_editors(db: Db) -> None:
    approval = await quorum(db, 2)
    await db.store.decisions.decide(approval, Approved("UA", NOW))
    edited = await db.store.decisions.edit(approval, Edit({"amount": 3}, "UB", NOW))
    assert edited.decision is None and [v.by for v in edited.votes] == ["UB"]
    assert edited.edit == Edit({"amount": 3}, "UB", NOW)
    # UA approved something else: a click on the card as it was is refused; UA votes again
    # on the edited request, and completes the quorum.
    with pytest.raises(IllegalTransition) as stale:
        await db.store.decisions.decide(approval, Approved("UC", NOW))
    assert stale.value.unmet == (Requirement.AS_SEEN,)
    done, _, _ = await db.store.decisions.decide(edited, Approved("UA", NOW))
    assert isinstance(done.decision, Approved) and done.edit == edited.edit
    trail = [
        (e.action, e.actor, e.detail.get("edited"))
        for e in await db.store.reads.audit_trail(db.team)
    ]
    assert ("edited", "UB", {"amount": 3}) in trail and ("approved", "UA", {"amount": 3}) in trail
    with pytest.raises(IllegalTransition) as decided:
        await db.store.decisions.edit(approval, Edit({"amount": 4}, "UC", NOW))
    assert decided.value.state == ApprovalState.APPROVED


async def test_an_edit_of_a_request_one_approver_decides_is_part_of_the_approval(db: Db) -> None:
    approval, _ = await db.seed()
    with pytest.raises(IllegalTransition) as one:
        await db.store.decisions.edit(approval, Edit({"amount": 3}, "UB", NOW))
    assert one.value.unmet == (Requirement.SEVERAL_NEEDED,) and await db.audit_rows() == 0
    edit = Edit({"amount": 3}, "UB", NOW)
    done, _, _ = await db.store.decisions.decide(approval, Approved("UB", NOW), edited=edit)
    assert isinstance(done.decision, Approved) and done.edit == edit
    plain, _ = await db.seed()
    approved, _, _ = await db.store.decisions.decide(plain, Approved("UB", NOW))
    assert approved.edit is None


async def test_a_decision_counts_only_for_the_version_it_names_and_the_gate_runs_that_one(
    db: Db,
) -> None:
    approval = await quorum(db, 2)
    v2 = await db.store.decisions.edit(approval, Edit({"amount": 3}, "UB", NOW))
    assert (v2.version, v2.current.input, v2.current.edit) == (2, {"amount": 3}, v2.edit)
    for stale in (Approved("UA", NOW), Denied("UA", NOW)):  # a view of version 1
        with pytest.raises(IllegalTransition) as refused:
            await db.store.decisions.decide(v2, stale, seen=1)
        assert refused.value.unmet == (Requirement.AS_SEEN,)
    v3 = await db.store.decisions.edit(v2, Edit({"amount": 5}, "UA", NOW))
    assert v3.version == 3 and [(v.by, v.at) for v in v3.votes] == [("UA", NOW)]
    done, _, _ = await db.store.decisions.decide(v3, Approved("UC", NOW), seen=3)
    assert isinstance(done.decision, Approved) and done.current.input == {"amount": 5}
    with pytest.raises(IllegalTransition) as other:  # a version that was never approved
        await db.store.executions.start_execution(replace(done, version=2), now=NOW)
    assert other.value.unmet == (Requirement.SAME_VERSION,)
    await db.store.executions.start_execution(done, now=NOW)


FOLLOW_UPS = {REMIND: ("reminder", "remind_at"), ESCALATE: ("escalation", "escalate_at")}


@pytest.mark.parametrize("transition", list(FOLLOW_UPS), ids=lambda t: t.name)
async def test_follow_ups_take_once_exactly_when_the_table_allows(
    db: Db, transition: Transition
) -> None:
    column, at_column = FOLLOW_UPS[transition]
    states: list[State] = list(STATES[transition.subject])
    for state, status, at in itertools.product(states, ApprovalState, (NOW - HOUR, NOW + HOUR)):
        approval, _ = await db.seed(status=status)
        async with db.sessions.begin() as s:
            row = await s.get_one(ApprovalRow, approval.id)
            setattr(row, column, state)
            setattr(row, at_column, at)
        holds = {
            Requirement.STILL_PENDING: status == ApprovalState.PENDING,
            Requirement.REMINDER_DUE: at <= NOW,
            Requirement.ESCALATION_DUE: at <= NOW,
        }
        enters = expected(transition, state, holds)
        due = {a.id for a in await db.store.follow_ups.due(transition, now=NOW, team_id=db.team)}
        case = f"{transition.name} from {state}, {status}, at {at:%H:%M}"
        assert (approval.id in due) == (enters is not None), case
        audits = await db.audit_rows()
        if enters is None:
            with pytest.raises(IllegalTransition):
                await db.store.follow_ups.follow_up(transition, approval, now=NOW)
            assert getattr(await db.row(ApprovalRow, approval.id), column) == state, case
            continue
        results = await asyncio.gather(
            *(db.store.follow_ups.follow_up(transition, approval, now=NOW) for _ in range(3)),
            return_exceptions=True,
        )
        assert sum(not isinstance(r, BaseException) for r in results) == 1, case  # once
        assert getattr(await db.row(ApprovalRow, approval.id), column) == enters, case
        assert await db.audit_rows() == audits + 1, case


async def test_a_requests_context_is_kept_and_the_requesters_history_counted(db: Db) -> None:
    thread = db.thread()
    held = await db.store.turns.hold_thread(
        thread, author="UASK", new_id=str(uuid.uuid4()), now=NOW, until=NOW + HOUR
    )
    assert held is not None
    turn = PausedTurn(str(uuid.uuid4()), held.conversation_id, thread, "s", "snap", NOW)
    context = Context(
        first=Said("pay rent", length=8, by="UASK", at=NOW),
        agent=Said("Paying.", length=7),
        sources={"amount": Source("human"), "to": Source("tool", "getBalance")},
        history=History(approved=2),
    )
    fresh = new_approval(thread, turn.id, 0)
    fresh = replace(fresh, request=replace(fresh.request, context=context))
    await db.store.turns.pause(turn, [fresh])
    stored = await db.store.reads.get(db.team, fresh.id)
    assert stored is not None and stored.request.context == context
    assert await db.store.reads.paused_snapshot(stored) == "snap"

    for status in (ApprovalState.APPROVED, ApprovalState.APPROVED, ApprovalState.DENIED):
        await db.seed(status=status)  # by UASK, transferMoney
    await db.seed(status=ApprovalState.EXPIRED)
    await db.seed(status=ApprovalState.ANSWERED)  # a question's answer: no part of it
    history = await db.store.reads.history(
        db.team, "UASK", ["transferMoney", "exportData"], since=NOW - HOUR, days=30
    )
    # Pending requests (the fresh one, the seeds' siblings) are not history yet.
    assert history == {
        "transferMoney": History(approved=2, denied=1, expired=1, days=30),
        "exportData": History(days=30),
    }
    assert await db.store.reads.history(
        db.team, "UOTHER", ["transferMoney"], since=NOW, days=1
    ) == {"transferMoney": History(days=1)}
    # The same counts, read with the tool's policy (none stored: the defaults); none where
    # its stored row lets calls run freely, since no card will show them.
    policies = PolicyStore(db.sessions)
    read = await policies.with_history(db.team, "transferMoney", "UASK", since=NOW - HOUR, days=30)
    assert read == (None, history["transferMoney"])
    await policies.change(db.team, "transferMoney", by="UADMIN", now=NOW, changes={"allowed": True})
    policy, none = await policies.with_history(db.team, "transferMoney", "UASK", since=NOW, days=30)
    assert policy is not None and policy.allowed and none is None

    await db.store.reads.note_viewed(stored, by="UBOSS", now=NOW)
    trail = await db.store.reads.audit_trail(db.team)
    assert ("conversation_viewed", "UBOSS", fresh.id) in {
        (e.action, e.actor, e.approval_id) for e in trail
    }
