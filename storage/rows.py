"""An approval's row as the domain value and back, and what every store of approvals shares.

The query that reads an approval with its thread (`LOCATED`), the audit row a transition
appends as its `Audit` spec says (`audit_row`), an approval's transition with that row
(`change`), and why a conditional write matched nothing (`refusal`: the lifecycle's verdict
on the row as it is now, IllegalTransition).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from pydantic import TypeAdapter

from storage import audit
from storage.db import Db, SessionFactory, autocommit
from storage.domain import (
    Answered,
    Approval,
    ApprovalState,
    Approved,
    Card,
    CardState,
    Context,
    Decision,
    Denied,
    Edit,
    EscalationState,
    Execution,
    ExecutionState,
    Expired,
    Finished,
    FollowUp,
    NotStarted,
    ReminderState,
    Request,
    Standing,
    StandingState,
    Started,
    Thread,
    Vote,
    Withdrawn,
)
from storage.driver import prepared
from storage.lifecycle import (
    OPEN_TURN,
    REQUEST,
    STATES,
    TRANSITIONS,
    IllegalTransition,
    Subject,
    Transition,
)
from storage.redaction import Secret, scrubbed
from storage.transitions import ROW_ID, A, Atomic, C, NewRow, T, V, facts

LOCATED = (
    sa.select(A, C.c.channel_id.label("thread_channel"), C.c.thread_ts.label("thread_ts"))
    .join(T, T.c.id == A.c.turn_id)
    .join(C, C.c.id == T.c.conversation_id)
    .order_by(A.c.requested_at, A.c.id)
)
TEAM = A.c.team_id == sa.bindparam("team")
GET = prepared(LOCATED.where(TEAM, A.c.id == ROW_ID))
OPEN = T.c.state.in_(OPEN_TURN)  # a turn not yet ended: it holds its thread
# A request's context as JSON and back (validated: the column is only as good as its reader).
CONTEXT = TypeAdapter(Context)
NOTE = NewRow(audit.TABLE, "audit_")  # a transition's audit row
VOTES = prepared(
    sa.select(V.c.approval_id, V.c.voter, V.c.at, V.c.note)
    .where(V.c.approval_id.in_(sa.bindparam("ids", expanding=True)))
    .order_by(V.c.at, V.c.voter)
)
EXPLAIN_APPROVAL = {t: GET.add_columns(*facts(t)) for t in TRANSITIONS if t.subject != Subject.TURN}
EXPLAIN_TURN = {
    t: sa.select(*facts(t)).where(T.c.id == sa.bindparam("row_id"))
    for t in TRANSITIONS
    if t.subject == Subject.TURN
}


async def get(sessions: SessionFactory, team_id: str, approval_id: str) -> Approval | None:
    """One approval, with its votes."""
    async with autocommit(sessions) as db:
        found = located(await db.execute(GET, {"team": team_id, "row_id": approval_id}))
    return (await with_votes(sessions, found))[0] if found else None


async def with_votes(
    sessions: SessionFactory, approvals: Sequence[Approval]
) -> tuple[Approval, ...]:
    """`approvals` with who approved each so far, for those that need several."""
    ids = [a.id for a in approvals if a.request.approvals_needed > 1]
    if not ids:
        return tuple(approvals)
    async with autocommit(sessions) as db:
        rows = (await db.execute(VOTES, {"ids": ids})).all()
    votes: dict[str, list[Vote]] = {}
    for row in rows:
        votes.setdefault(row.approval_id, []).append(Vote(row.voter, row.at, row.note))
    return tuple(replace(a, votes=tuple(votes.get(a.id, ()))) for a in approvals)


async def change(
    sessions: SessionFactory,
    atomic: Atomic,
    transition: Transition,
    approval: Approval,
    at: datetime,
    params: dict[str, Any],
) -> sa.Row[Any]:
    """An approval's transition with its audit row (`approval` as it is after it);
    IllegalTransition when it may not happen, and then nothing was written."""
    values = key(approval) | params
    note = NOTE.params(audit_row(transition, approval, at))
    if not (rows := await atomic.run(sessions, values | note)):
        async with autocommit(sessions) as db:
            raise await refusal(db, transition, EXPLAIN_APPROVAL, values | {"now": at})
    return rows[0]


async def refusal(
    db: Db,
    transition: Transition,
    explain: Mapping[Transition, Any],
    values: Mapping[str, Any],
) -> IllegalTransition:
    """Why `transition` matched no row: the lifecycle's verdict on the row as it is now."""
    row = (await db.execute(explain[transition], values)).first()
    if row is None:
        return IllegalTransition(transition, None)
    state = STATES[transition.subject](row.state)
    current = (
        None if transition.subject == Subject.TURN else approval_of(row._mapping, thread_of(row))
    )
    holds = {r: bool(row._mapping[f"holds_{r.name}"]) for r in transition.requirements(state)}
    try:
        transition.check(state, holds)
    except IllegalTransition as refused:
        refused.current = current
        return refused
    # Unreachable while states only move forward; said plainly if it ever is not.
    return IllegalTransition(transition, state, current=current)


def count(result: Any) -> int:
    return int(cast(sa.CursorResult[Any], result).rowcount)


def thread_params(thread: Thread) -> dict[str, str]:
    return {"team": thread.team_id, "channel": thread.channel_id, "thread": thread.thread_ts}


def key(approval: Approval) -> dict[str, str]:
    return {"row_id": approval.id, "team": approval.thread.team_id}


def audit_row(transition: Transition, approval: Approval, at: datetime) -> dict[str, Any]:
    """The audit row `transition` appends, as its Audit spec says, for `approval` as it is
    once the transition took."""
    spec = transition.audit
    assert spec is not None, f"{transition.name} records nothing"
    r, decision, execution = approval.request, approval.decision, approval.execution
    decider: str = ""
    editor = approval.edit.by if approval.edit else ""
    reason: str | None = None
    answer: Any = None
    match decision:
        case Approved(by=decider, reason=reason) | Denied(by=decider, reason=reason):
            pass
        case Answered(by=decider, answer=answer):
            pass
        case Withdrawn(by=decider):
            pass
    standing = approval.standing
    actor = {
        "decider": decider,
        "editor": editor,
        "requester": r.requester,
        "revoker": (standing.revoked_by if standing else None) or "",
        "greenlight": "greenlight",
    }
    # An approver's note: the approval's (a VOTE's or APPROVE's), or an EDIT's, its vote's.
    note = approval.votes[-1].note if approval.votes else None
    output = execution.output if isinstance(execution, Finished) else None
    fields = {
        "input": r.input,  # redacted fields as their masks (storage/redaction.py)
        "edited": approval.edit.input if approval.edit else None,
        "why": r.why,
        "reason": reason,
        "note": reason if isinstance(decision, Approved) else note,
        "answer": answer,
        "output": scrubbed(output, r.redact, r.secrets) if r.secrets else output,
        "under": approval.under,  # the standing approval that approved this call
        "standing": (
            None
            if standing is None
            else {"until": standing.until.isoformat(), "rule": standing.rule}
        ),
    }
    # Which door the request came through (slack, or the gateway's mcp, api) and its key.
    via = r.context.via
    door: dict[str, Any] = {"door": "slack"} if via is None else {"door": via.door, "key": via.key}
    if r.secrets and "input" in spec.detail:  # what was hidden, comparable across requests
        door["sha256"] = {s.name: s.sha256 for s in r.secrets}
    return audit.entry(
        team_id=approval.thread.team_id,
        at=at,
        actor=actor[spec.actor],
        action=spec.action,
        tool=r.tool,
        approval_id=approval.id,
        **{key: fields[key] for key in spec.detail},
        **door,
    )


def thread_of(row: Any) -> Thread:
    return Thread(row.team_id, row.thread_channel, row.thread_ts)


def located(result: Any) -> tuple[Approval, ...]:
    return tuple(approval_of(row._mapping, thread_of(row)) for row in result)


def approval_of(row: Mapping[Any, Any], thread: Thread) -> Approval:
    """An approvals row as the domain's value."""
    channel = row["card_channel"]
    card = None if channel is None else Card(channel, row["card_ts"], CardState(row["card_state"]))
    reminder = None
    if row["remind_at"] is not None:
        reminder = FollowUp(row["remind_at"], ReminderState(row["reminder"]))
    escalation = None
    if row["escalate_at"] is not None:
        card_state = row["escalation_card"]
        escalation = FollowUp(
            row["escalate_at"],
            EscalationState(row["escalation"]),
            row["escalation_channel"],
            row["escalation_ts"],
            None if card_state is None else CardState(card_state),
        )
    edit = None
    if row["edited_input"] is not None:
        edit = Edit(
            dict(row["edited_input"]), row["edited_by"], row["edited_at"], row["edited_preview"]
        )
    return Approval(
        id=row["id"],
        turn_id=row["turn_id"],
        thread=thread,
        request=_request(row),
        edit=edit,
        decision=_decision(row),
        execution=_execution(row),
        card=card,
        reminder=reminder,
        escalation=escalation,
        version=row["version"],
        standing=_standing(row),
        under=row["under"],
    )


def _request(row: Mapping[Any, Any]) -> Request:
    offer = row["standing_offer_seconds"]
    return Request(
        tool=row["tool"],
        ref=row["ref"],
        input=dict(row["input"]),
        requester=row["requester"],
        why=row["why"],
        requested_at=row["requested_at"],
        expires_at=row["expires_at"],
        participants=tuple(row["participants"]),
        preview=row["preview"],
        approvals_needed=row["approvals_needed"],
        context=Context() if row["context"] is None else CONTEXT.validate_python(row["context"]),
        asks=row["asks"],
        asked=row["asked_input"],
        note_required=row["note_required"],
        standing=None if offer is None else timedelta(seconds=offer),
        redact=tuple(row["redact"] or ()),
        secrets=tuple(Secret.of_json(s) for s in row["secrets"] or ()),
    )


def _standing(row: Mapping[Any, Any]) -> Standing | None:
    state = StandingState(row["standing"])
    if state == StandingState.NONE:
        return None
    return Standing(
        until=row["standing_until"],
        rule=row["standing_rule"] or "",
        uses=row["standing_uses"],
        state=state,
        revoked_by=row["standing_revoked_by"],
        revoked_at=row["standing_revoked_at"],
    )


def _decision(row: Mapping[Any, Any]) -> Decision | None:
    by, at, reason = row["decided_by"], row["decided_at"], row["reason"]
    match ApprovalState(row["status"]):
        case ApprovalState.PENDING:
            return None
        case ApprovalState.APPROVED:
            return Approved(by, at, reason)
        case ApprovalState.DENIED:
            return Denied(by, at, reason)
        case ApprovalState.EXPIRED:
            return Expired(at)
        case ApprovalState.ANSWERED:
            return Answered(by, at, row["answer"])
        case ApprovalState.WITHDRAWN:
            return Withdrawn(by, at)


def _execution(row: Mapping[Any, Any]) -> Execution:
    match ExecutionState(row["execution"]):
        case ExecutionState.NOT_STARTED:
            return NotStarted()
        case ExecutionState.STARTED:
            return Started()
        case ExecutionState.FINISHED:
            return Finished(row["output"])


def columns(approval: Approval) -> dict[str, Any]:
    """A new (pending) approval as an approvals row."""
    r = approval.request
    return {
        "id": approval.id,
        "team_id": approval.thread.team_id,
        "turn_id": approval.turn_id,
        "tool": r.tool,
        "ref": r.ref,
        "input": r.input,
        "requester": r.requester,
        "requested_at": r.requested_at,
        "expires_at": r.expires_at,
        "why": r.why,
        "participants": list(r.participants),
        "preview": r.preview,
        "context": CONTEXT.dump_python(r.context, mode="json", exclude_defaults=True) or None,
        "asks": r.asks,
        "answer": None,
        "edited_input": None,
        "edited_by": None,
        "edited_at": None,
        "edited_preview": None,
        "version": approval.version,
        "asked_input": r.asked,
        "status": REQUEST.enters,
        "decided_by": None,
        "decided_at": None,
        "reason": None,
        "execution": ExecutionState.NOT_STARTED,
        "output": None,
        "card_channel": approval.card.channel if approval.card else None,
        "card_ts": None,
        # Recorded before the post: whoever paused the turn posts it now (else a sweep will).
        "card_state": CardState.POSTING if approval.card else CardState.FAILED,
        "card_attempted_at": r.requested_at,
        "approvals_needed": r.approvals_needed,
        "votes": 0,
        "remind_at": approval.reminder.at if approval.reminder else None,
        "reminder": ReminderState.SCHEDULED if approval.reminder else ReminderState.NONE,
        "escalate_at": approval.escalation.at if approval.escalation else None,
        "escalation": (EscalationState.SCHEDULED if approval.escalation else EscalationState.NONE),
        "escalation_channel": approval.escalation.channel if approval.escalation else None,
        "escalation_ts": None,
        "escalation_card": None,
        "escalation_attempted_at": None,
        "note_required": r.note_required,
        "standing_offer_seconds": (None if r.standing is None else int(r.standing.total_seconds())),
        "standing": StandingState.NONE,
        "standing_until": None,
        "standing_rule": None,
        "standing_uses": 0,
        "standing_revoked_by": None,
        "standing_revoked_at": None,
        "under": approval.under,
        "redact": list(r.redact),
        "secrets": [s.as_json() for s in r.secrets] or None,
    }
