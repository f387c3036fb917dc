"""Gateway requests in storage: an approval asked from outside the agent, and how the
caller that waits for it learns it was decided.

A gateway request is an approval like any other (the same row, card outbox, audit trail,
decisions and execution gate), in a conversation of its own. Its turn row is recorded as
done when it is made: there is no Genkit turn to resume, so no CLAIM (and no recovery sweep)
ever takes it; the caller waits for the decision and runs the call behind START_EXECUTION.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from datetime import datetime
from typing import cast

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from storage.db import SessionFactory, autocommit
from storage.domain import Approval, ApprovalState, PausedTurn, TurnState
from storage.models import ApprovalRow, ConversationRow
from storage.rows import CONTEXT
from storage.turns import pause_params, paused_turn

A = cast(sa.Table, ApprovalRow.__table__)
C = cast(sa.Table, ConversationRow.__table__)
GATEWAY_CHANNEL = "gateway"  # the conversation's "channel": no Slack thread behind it
SETTLED = sa.select(A.c.id).where(
    A.c.id.in_(sa.bindparam("ids", expanding=True)), A.c.status != ApprovalState.PENDING
)


class Exists(Exception):
    """A request of this id is there already (an idempotency key used again)."""


class GatewayStore:
    def __init__(self, sessions: SessionFactory) -> None:
        self._sessions = sessions

    async def open(self, approval: Approval, *, now: datetime) -> None:
        """The request's conversation, its (done) turn and the approval, audited as
        requested. The conversation is written first: one left alone by a crash holds
        nothing and goes with retention."""
        thread = approval.thread
        conversation = {
            "id": approval.turn_id,
            "team_id": thread.team_id,
            "channel_id": thread.channel_id,
            "thread_ts": thread.thread_ts,
            "snapshot_id": None,
            "busy_until": None,
            "created_at": now,
            "last_active_at": now,
            "participants": [approval.request.requester],
        }
        try:
            async with autocommit(self._sessions) as db:
                await db.execute(sa.insert(C).values(conversation))
        except IntegrityError:
            pass  # made before, by a request of the same id; its approval says whether
        turn = PausedTurn(approval.turn_id, approval.turn_id, thread, "", "", now)
        params = pause_params(turn, [approval]) | {"t_state": TurnState.DONE}
        try:
            await paused_turn(1).run(self._sessions, params)
        except IntegrityError:
            raise Exists(approval.id) from None

    async def settled(self, ids: Collection[str]) -> set[str]:
        """Which of these requests are no longer pending."""
        if not ids:
            return set()
        async with autocommit(self._sessions) as db:
            return set((await db.execute(SETTLED, {"ids": list(ids)})).scalars())

    async def caller_gone(self, approval: Approval) -> Approval:
        """Note on the request that its caller went away (the card says so; nothing runs).
        Only the waiting caller writes a gateway request's context after it is made."""
        via = approval.request.context.via
        if via is None or via.gone:
            return approval
        context = replace(approval.request.context, via=replace(via, gone=True))
        stored = CONTEXT.dump_python(context, mode="json", exclude_defaults=True)
        stmt = (
            sa.update(A)
            .where(A.c.id == approval.id, A.c.team_id == approval.thread.team_id)
            .values(context=stored)
        )
        async with autocommit(self._sessions) as db:
            await db.execute(stmt)
        return replace(approval, request=replace(approval.request, context=context))
