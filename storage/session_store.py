"""Genkit `SessionStore` on SQL: each snapshot row stores only the messages it added.

Every turn Genkit saves a new snapshot holding the whole conversation, so storing snapshots
whole grows quadratically. Here a snapshot whose message list extends its parent's keeps only
the new tail in `agent_messages` and records in `inherited` how many leading messages come
from up the parent chain; a load is one recursive query, however long the history.

Tenant: `context['team_id']` when Genkit passes a context that has one, else the
`current_team` ContextVar (set by the application around a turn: the in-process agent
runtime passes only the ambient action context, usually None), else the store's default.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, cast

from genkit._ai._agents._session_stores._util import (
    apply_save,
    assert_safe_snapshot_id,
    require_one_selector,
    select_leaf,
    session_id_of,
)
from genkit._core._error import GenkitError
from genkit.exp import SessionSnapshot, SessionStore
from sqlalchemy import CursorResult, Row, and_, case, delete, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from storage.db import SessionFactory
from storage.models import MessageRow, SnapshotRow

current_team: ContextVar[str | None] = ContextVar("greenlight_current_team", default=None)

SaveFn = Callable[[SessionSnapshot | None], SessionSnapshot | None]
S, M = SnapshotRow, MessageRow
_ROW = (S.snapshot_id, S.meta, S.message_count, S.inherited, S.digest, S.version)
_RETRY_SQLSTATES = {"40001", "40P01"}  # serialization failure, deadlock (PostgreSQL)


class _Conflict(Exception):
    """Another writer changed the row since we read it: roll back and run fn again."""


def _retryable(exc: Exception) -> bool:
    """A lost race: duplicate insert, failed version check, deadlock or serialization failure."""
    if isinstance(exc, _Conflict | IntegrityError):
        return True
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in _RETRY_SQLSTATES


def _canonical(message: dict[str, Any]) -> bytes:
    return json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _digests(messages: Sequence[dict[str, Any]], marks: set[int]) -> dict[int, str]:
    """sha256 of messages[:k] for every k in marks and for the whole list, in one pass."""
    h, out = hashlib.sha256(), {}
    for i, m in enumerate(messages):
        if i in marks:
            out[i] = h.hexdigest()
        h.update(_canonical(m) + b"\n")
    out[len(messages)] = h.hexdigest()
    return out


class SqlSessionStore(SessionStore[Any]):
    """Snapshots in `agent_snapshots`, their new messages in `agent_messages`.

    Saves are one transaction each (all-or-nothing) and safe across processes: the existing
    row is read `FOR UPDATE` (SQLite: BEGIN IMMEDIATE) and rewritten with a version check;
    a lost insert race or a failed check rolls back and calls fn again.
    """

    def __init__(
        self, sessions: SessionFactory, *, team_id: str = "", max_attempts: int = 20
    ) -> None:
        self._sessions = sessions
        self._default_team = team_id
        self._max_attempts = max_attempts

    def team(self, context: dict[str, Any] | None) -> str:
        """Explicit context wins, then the `current_team` ContextVar, then the default."""
        if context and context.get("team_id") is not None:
            return str(context["team_id"])
        team = current_team.get()
        return self._default_team if team is None else team

    async def get_snapshot(
        self,
        *,
        snapshot_id: str | None = None,
        session_id: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> SessionSnapshot | None:
        """By id, or the session's newest leaf (Genkit's tie-break), loaded in a few queries."""
        require_one_selector(snapshot_id=snapshot_id, session_id=session_id)
        if snapshot_id is not None:
            assert_safe_snapshot_id(snapshot_id=snapshot_id)  # as FileSessionStore does
        team = self.team(context)
        async with self._sessions() as s, s.begin():
            if s.get_bind().dialect.name == "postgresql":  # row and messages from one snapshot
                await s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            if snapshot_id is None:
                snapshot_id = await self._leaf(s, team, cast(str, session_id))
                if snapshot_id is None:
                    return None
            row = (await s.execute(select(*_ROW).where(*self._key(team, snapshot_id)))).first()
            return None if row is None else await self._load(s, team, row)

    async def save_snapshot(
        self, snapshot_id: str, fn: SaveFn, *, context: dict[str, Any] | None = None
    ) -> SessionSnapshot | None:
        """Atomic read-modify-write of one snapshot, with Genkit's own rules (`apply_save`)."""
        assert_safe_snapshot_id(snapshot_id=snapshot_id)
        team = self.team(context)
        for attempt in range(self._max_attempts):
            try:
                async with self._sessions() as s, s.begin():
                    query = select(*_ROW).where(*self._key(team, snapshot_id)).with_for_update()
                    row = (await s.execute(query)).first()
                    existing = None if row is None else await self._load(s, team, row)
                    snap = apply_save(existing=existing, snapshot_id=snapshot_id, fn=fn)
                    if snap is not None:
                        await self._write(s, team, snap, row)
                    return snap
            except (_Conflict, DBAPIError) as exc:
                if not _retryable(exc):
                    raise
                await asyncio.sleep(random.uniform(0, 0.002 * 2 ** min(attempt, 7)))
        raise GenkitError(
            status="ABORTED",
            message=f"Snapshot {snapshot_id!r}: gave up after {self._max_attempts} conflicts.",
        )

    @staticmethod
    def _key(team: str, snapshot_id: str) -> tuple[Any, ...]:
        return (S.team_id == team, S.snapshot_id == snapshot_id)

    async def _leaf(self, s: AsyncSession, team: str, session_id: str) -> str | None:
        """Leaves (rows no row of the session names as parent) on light rows, then Genkit's pick."""
        child = aliased(SnapshotRow)
        owned = (S.team_id == team, S.session_id == session_id)
        has_child = (
            select(child.snapshot_id)
            .where(child.team_id == team, child.session_id == session_id)
            .where(child.parent_id == S.snapshot_id)
            .exists()
        )
        light = select(S.snapshot_id, S.parent_id, S.created_at).where(*owned)
        rows = (await s.execute(light.where(~has_child))).all()
        if not rows:  # none at all, or a cyclic history: Genkit's own answer for either
            rows = (await s.execute(light)).all()
        stubs = [SessionSnapshot(snapshot_id=i, parent_id=p, created_at=c) for i, p, c in rows]
        leaf = select_leaf(snapshots=stubs, session_id=session_id, reject_ambiguous=False)
        return None if leaf is None else leaf.snapshot_id

    async def _load(self, s: AsyncSession, team: str, row: Row[Any]) -> SessionSnapshot:
        meta = dict(row.meta)
        if row.message_count is not None:
            state = dict(meta.get("state", {}))
            state["messages"] = await self._messages(s, team, row)
            meta["state"] = state
        return SessionSnapshot.model_validate(meta)

    async def _messages(self, s: AsyncSession, team: str, row: Row[Any]) -> list[dict[str, Any]]:
        """Walk up the parents while messages are inherited; each row gives [lo, hi).

        `hi` is what the row below still needs (the target's count at first), `lo` is
        min(inherited, hi). UNION, not UNION ALL, so a corrupt cyclic chain still ends.
        """
        lo = case((S.inherited < S.message_count, S.inherited), else_=S.message_count)
        chain = (
            select(S.snapshot_id, S.parent_id, lo.label("lo"), S.message_count.label("hi"))
            .where(*self._key(team, row.snapshot_id))
            .cte("chain", recursive=True)
        )
        up = aliased(SnapshotRow)
        up_lo = case((up.inherited < chain.c.lo, up.inherited), else_=chain.c.lo)
        chain = chain.union(
            select(up.snapshot_id, up.parent_id, up_lo, chain.c.lo)
            .join(chain, and_(up.team_id == team, up.snapshot_id == chain.c.parent_id))
            .where(chain.c.lo > 0)
        )
        query = (
            select(M.position, M.data)
            .join(chain, M.snapshot_id == chain.c.snapshot_id)
            .where(M.team_id == team, M.position >= chain.c.lo, M.position < chain.c.hi)
            .order_by(M.position)
        )
        rows = (await s.execute(query)).all()
        if [r.position for r in rows] != list(range(row.message_count)):
            raise GenkitError(
                status="DATA_LOSS",
                message=f"Snapshot {row.snapshot_id!r}: stored message chain is incomplete.",
            )
        return [r.data for r in rows]

    async def _write(
        self, s: AsyncSession, team: str, snap: SessionSnapshot, old: Row[Any] | None
    ) -> None:
        """Insert or compare-and-swap the row; store only the messages the parent lacks."""
        msgs = snap.state.messages if snap.state is not None else None
        dumped = [m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in msgs or []]
        bases: list[tuple[int, str]] = []  # (count, digest) the list may extend, longest first
        if msgs is not None and snap.parent_id:
            # FOR SHARE: the parent's messages cannot be rewritten until we commit.
            grand = aliased(SnapshotRow)
            query = (
                select(S.message_count, S.inherited, S.digest, grand.message_count, grand.digest)
                .outerjoin(grand, and_(grand.team_id == team, grand.snapshot_id == S.parent_id))
                .where(*self._key(team, snap.parent_id))
                .with_for_update(read=True, of=S)
            )
            parent = (await s.execute(query)).first()
            if parent is not None and parent[0] is not None:
                bases.append((parent[0], parent[2]))
                # A resumed turn rewrites the paused model message's metadata, so it extends
                # the grandparent's list (which the parent inherited whole) but not the parent's.
                if parent[3] is not None and parent[1] == parent[3]:
                    bases.append((parent[3], parent[4]))
        bases = [(k, d) for k, d in bases if 0 < k <= len(dumped)]
        digests = _digests(dumped, {k for k, _ in bases})
        inherited = next((k for k, d in bases if digests[k] == d), 0)
        values = {
            "session_id": session_id_of(snap),
            "parent_id": snap.parent_id,
            "created_at": snap.created_at,
            "meta": snap.model_dump(
                mode="json", by_alias=True, exclude_none=True, exclude={"state": {"messages"}}
            ),
            "message_count": None if msgs is None else len(dumped),
            "inherited": inherited,
            "digest": digests[len(dumped)],
        }
        if old is None:
            await s.execute(insert(S).values(team_id=team, snapshot_id=snap.snapshot_id, **values))
        else:
            was = (old.message_count, old.inherited, old.digest)
            same = was == (values["message_count"], inherited, values["digest"])
            if not same:  # while the children can still read the old messages
                await self._detach_children(s, team, snap.snapshot_id)
            cas = update(S).where(*self._key(team, snap.snapshot_id), S.version == old.version)
            res = await s.execute(cas.values(version=old.version + 1, **values))
            if cast(CursorResult[Any], res).rowcount != 1:
                raise _Conflict
            if same:
                return  # status, heartbeat or custom state only: the messages stand
            await s.execute(delete(M).where(M.team_id == team, M.snapshot_id == snap.snapshot_id))
        if len(dumped) > inherited:
            rows = [
                {"team_id": team, "snapshot_id": snap.snapshot_id, "position": i, "data": d}
                for i, d in enumerate(dumped[inherited:], start=inherited)
            ]
            await s.execute(insert(M), rows)

    async def _detach_children(self, s: AsyncSession, team: str, snapshot_id: str) -> None:
        """Before a row's messages change, give children that inherit them a full copy."""
        kids = select(*_ROW).where(S.team_id == team, S.parent_id == snapshot_id, S.inherited > 0)
        for kid in (await s.execute(kids.with_for_update())).all():
            full = await self._messages(s, team, kid)
            await s.execute(delete(M).where(M.team_id == team, M.snapshot_id == kid.snapshot_id))
            rows = [
                {"team_id": team, "snapshot_id": kid.snapshot_id, "position": i, "data": d}
                for i, d in enumerate(full)
            ]
            await s.execute(insert(M), rows)
            bump = update(S).where(*self._key(team, kid.snapshot_id))
            await s.execute(bump.values(inherited=0, version=S.version + 1))
