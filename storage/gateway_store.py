"""Gateway requests in storage: an approval asked from outside the agent, the callers that
wait for it (by lease), the callbacks owed when it is decided, and MCP sessions' facts.

A gateway request is an approval like any other (the same row, card outbox, audit trail,
decisions and execution gate), in a conversation of its own. Its turn row is recorded as
done when it is made: there is no Genkit turn to resume, so no CLAIM (and no recovery sweep)
ever takes it; the caller waits for the decision and runs the call behind START_EXECUTION.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime
from typing import cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError

from storage.db import SessionFactory, autocommit
from storage.domain import Approval, ApprovalState, PausedTurn, TurnState
from storage.models import (
    ApiKeyRow,
    ApprovalRow,
    ConversationRow,
    GatewayCallbackRow,
    GatewayWaiterRow,
    McpSessionRow,
)
from storage.rows import CONTEXT
from storage.turns import pause_params, paused_turn

A = cast(sa.Table, ApprovalRow.__table__)
C = cast(sa.Table, ConversationRow.__table__)
CB = cast(sa.Table, GatewayCallbackRow.__table__)
W = cast(sa.Table, GatewayWaiterRow.__table__)
S = cast(sa.Table, McpSessionRow.__table__)
K = cast(sa.Table, ApiKeyRow.__table__)
GATEWAY_CHANNEL = "gateway"  # the conversation's "channel": no Slack thread behind it
SETTLED = sa.select(A.c.id).where(
    A.c.id.in_(sa.bindparam("ids", expanding=True)), A.c.status != ApprovalState.PENDING
)


class Exists(Exception):
    """A request of this id is there already (an idempotency key used again)."""


@dataclass(frozen=True)
class OwedCallback:
    """A callback claimed for delivery: where, signed with which secret, which attempt."""

    approval_id: str
    team_id: str
    url: str
    secret: str
    attempt: int


@dataclass(frozen=True)
class McpSession:
    """What an MCP session's initialize request said, and whose key opened it."""

    id: str
    team_id: str
    key_id: str
    client: str | None


_DUE = sa.and_(
    CB.c.delivered_at.is_(None),
    CB.c.gave_up_at.is_(None),
    CB.c.next_at <= sa.bindparam("now"),
    sa.or_(CB.c.claimed_until.is_(None), CB.c.claimed_until < sa.bindparam("now")),
)
# Claimed by one statement: rows another replica is claiming are skipped (SKIP LOCKED), and
# one it claimed has claimed_until ahead, so no two replicas send the same delivery at once.
CLAIM = (
    sa.update(CB)
    .where(
        CB.c.approval_id.in_(
            sa.select(CB.c.approval_id)
            .join(A, A.c.id == CB.c.approval_id)
            .where(_DUE, A.c.status != ApprovalState.PENDING)
            .limit(sa.bindparam("limit"))
            .with_for_update(of=CB, skip_locked=True)
            .scalar_subquery()
        ),
        _DUE,
    )
    .values(claimed_until=sa.bindparam("lease_until"), attempts=CB.c.attempts + 1)
    .returning(CB.c.approval_id, CB.c.team_id, CB.c.url, CB.c.key_id, CB.c.attempts)
)
# Claimed for a lease, not deleted: the row goes once the card says the caller went away.
LOST = (
    sa.update(W)
    .where(W.c.approval_id == A.c.id, W.c.until < sa.bindparam("now"))
    .values(until=sa.bindparam("lease_until"))
    .returning(A.c.team_id, W.c.approval_id)
)


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

    # -- callbacks owed (the approvals API's callback_url) ---------------------------------

    async def owe_callback(
        self, approval: Approval, *, key_id: str, url: str, now: datetime
    ) -> None:
        """A POST of the request's final status is owed to `url` once it is decided (one per
        request: a second ask, by its idempotency key, keeps the first)."""
        row = {
            "approval_id": approval.id,
            "team_id": approval.thread.team_id,
            "key_id": key_id,
            "url": url,
            "attempts": 0,
            "next_at": now,
        }
        stmt = pg_insert(CB).values(row).on_conflict_do_nothing(index_elements=["approval_id"])
        async with autocommit(self._sessions) as db:
            await db.execute(stmt)

    async def claim_callbacks(
        self, *, now: datetime, lease_until: datetime, limit: int
    ) -> list[OwedCallback]:
        """Callbacks now due (their request decided), each claimed until `lease_until`."""
        params = {"now": now, "lease_until": lease_until, "limit": limit}
        async with autocommit(self._sessions) as db:
            claimed = (await db.execute(CLAIM, params)).all()
            if not claimed:
                return []
            keys = {r.key_id for r in claimed}
            found = await db.execute(sa.select(K.c.id, K.c.callback_secret).where(K.c.id.in_(keys)))
            secrets = {r.id: r.callback_secret for r in found}
        return [
            OwedCallback(r.approval_id, r.team_id, r.url, secrets.get(r.key_id, ""), r.attempts)
            for r in claimed
        ]

    async def callback_done(
        self,
        approval_id: str,
        *,
        now: datetime,
        delivered: bool,
        error: str | None = None,
        retry_at: datetime | None = None,
    ) -> None:
        """Delivered (never sent again), failed for now (tried again at `retry_at`), or
        failed for good (`retry_at` None)."""
        values: dict[str, object] = {"claimed_until": None, "last_error": (error or "")[:200]}
        if delivered:
            values |= {"delivered_at": now, "last_error": None}
        elif retry_at is None:
            values["gave_up_at"] = now
        else:
            values["next_at"] = retry_at
        stmt = sa.update(CB).where(CB.c.approval_id == approval_id).values(values)
        async with autocommit(self._sessions) as db:
            await db.execute(stmt)

    # -- MCP callers waiting, by lease ------------------------------------------------------

    async def hold_waiters(self, ids: Collection[str], *, until: datetime) -> None:
        """These calls are waited on by a live process until `until` (renewed before then)."""
        if not ids:
            return
        rows = [{"approval_id": i, "until": until} for i in ids]
        insert = pg_insert(W).values(rows)
        stmt = insert.on_conflict_do_update(
            index_elements=["approval_id"], set_={"until": insert.excluded.until}
        )
        async with autocommit(self._sessions) as db:
            await db.execute(stmt)

    async def release_waiter(self, approval_id: str) -> None:
        async with autocommit(self._sessions) as db:
            await db.execute(sa.delete(W).where(W.c.approval_id == approval_id))

    async def lost_waiters(self, *, now: datetime, lease_until: datetime) -> list[tuple[str, str]]:
        """(team, approval id) of the calls whose waiting process's lease ran out (it died),
        each claimed until `lease_until` by the caller, who releases it once it is noted."""
        params = {"now": now, "lease_until": lease_until}
        async with autocommit(self._sessions) as db:
            return [(r.team_id, r.approval_id) for r in await db.execute(LOST, params)]

    # -- MCP sessions, so that any replica serves any request of one ------------------------

    async def open_session(self, session: McpSession, *, now: datetime) -> None:
        row = {
            "id": session.id,
            "team_id": session.team_id,
            "key_id": session.key_id,
            "client": (session.client or "")[:300] or None,
            "created_at": now,
        }
        async with autocommit(self._sessions) as db:
            await db.execute(sa.insert(S).values(row))

    async def session(self, session_id: str) -> McpSession | None:
        async with autocommit(self._sessions) as db:
            row = (await db.execute(sa.select(S).where(S.c.id == session_id))).first()
        if row is None:
            return None
        return McpSession(row.id, row.team_id, row.key_id, row.client)

    async def close_session(self, session_id: str, key_id: str) -> bool:
        stmt = sa.delete(S).where(S.c.id == session_id, S.c.key_id == key_id)
        async with autocommit(self._sessions) as db:
            done = await db.execute(stmt)
        return int(cast(sa.CursorResult[object], done).rowcount) > 0

    async def prune_sessions(self, *, before: datetime) -> int:
        """Sessions opened before `before` are forgotten (their clients initialize anew)."""
        async with autocommit(self._sessions) as db:
            done = await db.execute(sa.delete(S).where(S.c.created_at < before))
        return int(cast(sa.CursorResult[object], done).rowcount)
