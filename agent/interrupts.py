"""Interrupts as requests: a paused turn's requests, and the one resume that answers them all.

A turn that stopped on interrupts becomes a paused turn and one request per interrupt,
each under the policy the middleware read for its call (`Interrupts.paused`). Once every
request is settled, one resume answers them all, built from the stored requests only,
never from a button (`resume_parts`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, assert_never

from genkit import Part
from genkit.exp import AgentInterrupt, AgentResponse

from agent.approval import interrupt_note
from agent.gate import note_of, noted, recorded
from agent.policy import HISTORY_DAYS, Policy, PolicyService
from agent.questions import answered
from agent.scope import TurnScope
from storage.domain import (
    Answered,
    Approval,
    Approved,
    Card,
    Context,
    Denied,
    EscalationState,
    Expired,
    FollowUp,
    History,
    NotStarted,
    PausedTurn,
    ReminderState,
    Request,
    Thread,
    Withdrawn,
)
from storage.reads import ReadStore

# Why a call its requester withdrew did not run: the model gets it as a denial's error.
WITHDRAWN = "withdrawn by the requester"


@dataclass(frozen=True)
class Interrupts:
    """Turns a turn's interrupts into the requests it waits on."""

    reads: ReadStore
    policies: PolicyService
    clock: Callable[[], datetime]
    new_id: Callable[[], str]

    async def paused(
        self, conversation_id: str, thread: Thread, scope: TurnScope, out: AgentResponse[Any]
    ) -> tuple[PausedTurn, tuple[Approval, ...]]:
        """A turn that stopped on interrupts, as the paused turn and one approval per
        interrupt, each under the policy the middleware read for its call."""
        now = self.clock()
        turn = PausedTurn(
            id=self.new_id(),
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
        # Each call's history as read with its policy (agent/approval.py); read now for the
        # tools whose calls did not (a rule asked, a tool interrupted itself).
        history = {
            intr.name: called.history
            for intr in out.interrupts
            if (called := scope.calls.get(intr.ref or "")) and called.history is not None
        }
        if unread := list(dict.fromkeys(i.name for i in out.interrupts if i.name not in history)):
            history |= await self.reads.history(
                scope.team_id,
                scope.requester,
                unread,
                since=now - timedelta(days=HISTORY_DAYS),
                days=HISTORY_DAYS,
            )
        approvals = [
            await self._approval(turn, scope, intr, notes.get(intr.ref, {}), history[intr.name])
            for intr in out.interrupts
        ]
        return turn, tuple(approvals)

    async def _approval(
        self,
        turn: PausedTurn,
        scope: TurnScope,
        intr: AgentInterrupt[Any, Any],
        note: dict[str, Any],
        history: History,
    ) -> Approval:
        """One interrupt as a request, with where its card goes and its follow-ups."""
        now = turn.at
        called = scope.calls.get(intr.ref or "")
        raw = intr.input  # the model's own arguments: a restart must carry them exactly
        given = raw if isinstance(raw, dict) else {"value": raw}  # version 1, as shown
        if called is not None:
            policy, context = called.policy, called.context
            if isinstance(called.input, dict):
                given = called.input  # as the tool's schema took it
        else:  # interrupted by the tool itself, or by a restart the gate refused
            stored = await self.policies.get(scope.team_id, intr.name)
            policy, context = stored.for_call(raw, scope.requester), Context()
        preview = note.get("preview")
        asks = note.get("asks") if note.get("asks") in ("requester", "approvers") else None
        request = Request(
            tool=intr.name,
            ref=intr.ref or "",
            input=given,
            asked=None if _exactly(given, raw) else raw,
            requester=scope.requester,
            why=str(note.get("why") or policy.why),
            requested_at=now,
            expires_at=now + policy.timeout,
            participants=scope.participants,
            preview=preview if isinstance(preview, str) else None,
            approvals_needed=1 if asks else policy.approvals,
            context=replace(context, history=history),
            asks=asks,
            note_required=policy.note_required and not asks,
            standing=None if asks else policy.standing_offer,
            redact=policy.redact,
        )
        # A question to the requester goes into their thread; anything else to a channel.
        channel = turn.thread.channel_id if asks == "requester" else policy.channel
        reminder, escalation = _follow_ups(policy, now, to_approvers=asks != "requester")
        return Approval(
            self.new_id(),
            turn.id,
            turn.thread,
            request,
            card=Card(channel) if channel else None,
            reminder=reminder,
            escalation=escalation,
        )


def _follow_ups(
    policy: Policy, now: datetime, *, to_approvers: bool
) -> tuple[FollowUp | None, FollowUp | None]:
    """A request's reminder and escalation, as its policy asks; none for a question to the
    requester (they are in their thread: no reminder, nobody to escalate to)."""
    reminder = escalation = None
    if to_approvers and policy.remind_after is not None:
        reminder = FollowUp(now + policy.remind_after, ReminderState.SCHEDULED)
    if to_approvers and policy.escalate_after and policy.escalate_to is not None:
        escalation = FollowUp(
            now + policy.escalate_after, EscalationState.SCHEDULED, policy.escalate_to
        )
    return reminder, escalation


def _exactly(a: Any, b: Any) -> bool:
    """Equal as Genkit compares a restart's input with the request (sorted-key JSON)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


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
        asked = r.asked if r.asked is not None else r.actual
        intr: AgentInterrupt[Any, Any] = AgentInterrupt(r.tool, r.ref or None, asked)
        if r.question:
            respond.append(intr.respond(answered(approval, r.tool in forms)))
            continue
        match approval.decision:
            case Approved() if approval.edit is not None:  # run by the resume, answered here
                if isinstance(approval.execution, NotStarted):
                    raise ValueError(f"approval {approval.id} was edited and has not run")
                changes = approval.edit.changes(r.input)
                output = {"output": recorded(approval.execution), "approved_with_changes": changes}
                respond.append(intr.respond(output | note_of(approval)))
            case Approved(by=by):
                if isinstance(approval.execution, NotStarted):
                    meta = {"tool_approved": True, "approval_id": approval.id, "approved_by": by}
                    restart.append(intr.restart(resumed_metadata=meta))
                else:
                    respond.append(intr.respond(noted(approval, recorded(approval.execution))))
            case Denied(by=by, reason=reason):
                error = f"denied by {by}" + (f": {reason}" if reason else "")
                respond.append(intr.respond({"ok": False, "error": error}))
            case Expired():
                respond.append(intr.respond({"ok": False, "error": "approval expired"}))
            case Withdrawn():
                respond.append(intr.respond({"ok": False, "error": WITHDRAWN}))
            case Answered():
                raise ValueError(f"approval {approval.id} asked no question, yet was answered")
            case None:
                raise ValueError(f"approval {approval.id} is still pending; the turn is not ready")
            case unreachable:
                assert_never(unreachable)
    return respond, restart


def shaped_by(participants: tuple[str, ...], approvals: Sequence[Approval]) -> tuple[str, ...]:
    """The turn's participants once it resumes: whoever answered one of its questions,
    denied with a reason the model is sent, or approved with a note (which it gets too),
    put words before the model, so they may not approve what it asks next."""
    more = [
        a.decision.by
        for a in approvals
        if isinstance(a.decision, Answered)
        or (isinstance(a.decision, Denied) and a.decision.reason)
    ]
    noted_by = [by for a in approvals if isinstance(a.decision, Approved) for by, _ in a.notes()]
    return tuple(dict.fromkeys([*participants, *more, *noted_by]))
