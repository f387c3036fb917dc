"""Genkit `SessionStore` on SQL, storing each message once.

Genkit saves a new snapshot per turn holding the whole conversation, so storing snapshots
whole grows quadratically. Here a snapshot whose messages extend its parent's stores only the
new tail in `agent_messages`, and `inherited` says how many leading messages come from up the
parent chain. A load is one recursive query, however long the history.

Tenant: `context['team_id']` when Genkit passes a context carrying one, else the
`current_team` ContextVar, which the application sets around a turn (the in-process agent
runtime passes only the ambient action context, usually None), else the store's default.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple, cast

import sqlalchemy as sa
from genkit._ai._agents._session_stores._util import (
    apply_save,
    assert_safe_snapshot_id,
    require_one_selector,
    select_leaf,
    session_id_of,
)
from genkit._core._base import _default_serializer
from genkit._core._error import GenkitError
from genkit.exp import SessionSnapshot, SessionStore
from genkit.model import Message
from pydantic import TypeAdapter
from sqlalchemy.exc import DBAPIError, IntegrityError

from storage import held_saves
from storage.db import Db, SessionFactory, autocommit
from storage.driver import prepared
from storage.held_saves import Held, Holding
from storage.models import MessageRow, SnapshotRow
from storage.turn_snapshots import WRITTEN_AS, KeptSnapshots, started

current_team: ContextVar[str | None] = ContextVar("greenlight_current_team", default=None)

SaveFn = Callable[[SessionSnapshot | None], SessionSnapshot | None]
_Row = sa.Row[Any, Any, Any, Any, Any, Any]  # a GET_ROW result
# A PEEK result: a row's message count, inherited and digest, then its parent's count, digest.
_Peek = tuple[int | None, int, str, int | None, str | None]
_LEAVES = 1024  # how many rows a store remembers creating: about one per live conversation
_RETRY_SQLSTATES = {"40001", "40P01"}  # PostgreSQL serialization failure, deadlock
_MESSAGES = TypeAdapter(list[Message])  # serializes a list a little faster than to_json

# Statements are built once: building them per call costs more than running them.
S, M = cast(sa.Table, SnapshotRow.__table__), cast(sa.Table, MessageRow.__table__)
_team: sa.BindParameter[str] = sa.bindparam("team", type_=S.c.team_id.type)
_KEY = sa.and_(S.c.team_id == _team, S.c.snapshot_id == sa.bindparam("sid"))
_ROW = sa.select(S.c.snapshot_id, S.c.meta, S.c.message_count, S.c.inherited, S.c.digest)
GET_ROW = prepared(_ROW.add_columns(S.c.version).where(_KEY))
LOCK_ROW = GET_ROW.with_for_update()
LOCK_KIDS = (
    _ROW.add_columns(S.c.version)
    .where(S.c.team_id == _team, S.c.parent_id == sa.bindparam("sid"), S.c.inherited > 0)
    .with_for_update()
)
_OWNED = sa.and_(S.c.team_id == _team, S.c.session_id == sa.bindparam("session"))
# A session's rows, light: Genkit's own select_leaf picks the leaf from them. Lookups by
# session are rare here (the workflow resumes by snapshot id; a new chat finds no rows).
LIGHT = prepared(sa.select(S.c.snapshot_id, S.c.parent_id, S.c.created_at).where(_OWNED))
# The parent's count and digest and its parent's: what a new message list may extend.
_g = S.alias("grand")
PEEK = (
    sa.select(S.c.message_count, S.c.inherited, S.c.digest, _g.c.message_count, _g.c.digest)
    .outerjoin(_g, sa.and_(_g.c.team_id == S.c.team_id, _g.c.snapshot_id == S.c.parent_id))
    .where(_KEY)
)
# FOR SHARE: messages a child inherits cannot be rewritten before the child commits.
PARENT = PEEK.with_for_update(read=True, of=S)


def _chain(t: Any, lo: Any, hi: Any) -> sa.Select[Any]:
    """A chain row: (team_id, snapshot_id, parent_id, lo, hi), lo = min(inherited, hi)."""
    lo = sa.case((t.c.inherited < lo, t.c.inherited), else_=lo)
    return sa.select(t.c.team_id, t.c.snapshot_id, t.c.parent_id, lo.label("lo"), hi.label("hi"))


# Up the parents while messages are inherited. Each row gives positions [lo, hi): hi is what
# the row below still needs (at first the target's count). Join keys come from the chain, so
# each step is a primary-key lookup; UNION (not UNION ALL) ends a corrupt, cyclic chain.
_up = S.alias("up")
_cte = _chain(S, S.c.message_count, S.c.message_count).where(_KEY).cte("chain", recursive=True)
_cte = _cte.union(
    _chain(_up, _cte.c.lo, _cte.c.lo)
    .join(_cte, sa.and_(_up.c.team_id == _cte.c.team_id, _up.c.snapshot_id == _cte.c.parent_id))
    .where(_cte.c.lo > 0)
)
_messages = (
    sa.select(M.c.position, M.c.data)
    .join(_cte, sa.and_(M.c.team_id == _cte.c.team_id, M.c.snapshot_id == _cte.c.snapshot_id))
    .where(M.c.position >= _cte.c.lo, M.c.position < _cte.c.hi)
)
MESSAGES = _messages.order_by(M.c.position)
# A snapshot whole in one statement, so from one state of the data with no transaction
# around it: its row first (position -1, `data` its meta), then its messages in order.
LOAD = prepared(
    sa.union_all(
        sa.select(
            sa.literal(-1).label("position"), S.c.meta.label("data"), S.c.message_count
        ).where(_KEY),
        _messages.add_columns(sa.null()),
    ).order_by("position")
)
_VALUES = ["session_id", "parent_id", "created_at", "meta", "message_count", "inherited", "digest"]
_new = {c: sa.bindparam(f"new_{c}", type_=S.c[c].type) for c in _VALUES}
# PostgreSQL only: a new row and its messages in one statement, atomic without a transaction.
# The row goes in only if it inherits nothing or its parent's digest is still the one read
# (locked FOR SHARE till the statement commits, as PARENT is); `created` is 0 rows if not.
# A turn's ending statement writes a held row with it (storage/turns.py), gated on CREATED.
_unchanged = (
    sa.select(S.c.snapshot_id)
    .where(
        S.c.team_id == _team,
        S.c.snapshot_id == _new["parent_id"],
        S.c.digest == sa.bindparam("parent_digest", type_=S.c.digest.type),
    )
    .with_for_update(read=True)
    .cte("unchanged")
)
# Its first version is written out: SQLAlchemy fills a Python default in only for the
# statement's own INSERT, not for one in a CTE of another (a turn's ending statement).
_FIRST = sa.literal(WRITTEN_AS, S.c.version.type)  # what a kept copy is checked against
CREATED = (
    sa.insert(S)
    .from_select(
        ["team_id", "snapshot_id", *_VALUES, "version"],
        sa.select(
            _team, sa.bindparam("sid", type_=S.c.snapshot_id.type), *_new.values(), _FIRST
        ).where(sa.or_(_new["inherited"] == 0, sa.exists(_unchanged.select()))),
    )
    .returning(S.c.team_id, S.c.snapshot_id, S.c.inherited)
    .cte("created")
)
_tail = sa.func.json_array_elements(sa.cast(sa.bindparam("tail", type_=sa.Text), sa.JSON))
_elements = _tail.table_valued("value", with_ordinality="n").render_derived()
STORED = (
    sa.insert(M)
    .from_select(
        ["team_id", "snapshot_id", "position", "data"],
        sa.select(
            CREATED.c.team_id,
            CREATED.c.snapshot_id,
            CREATED.c.inherited + _elements.c.n - 1,
            _elements.c.value,
        ).select_from(CREATED.join(_elements, sa.true())),
    )
    .cte("stored")
)
CREATE = prepared(sa.select(sa.func.count()).select_from(CREATED).add_cte(STORED))
CAS = (
    sa.update(S)
    .where(_KEY, S.c.version == sa.bindparam("seen"))
    .values(version=S.c.version + 1, **_new)
)
CHECKPOINT = sa.update(S).where(_KEY).values(inherited=0, version=S.c.version + 1)
DELETE_MESSAGES = sa.delete(M).where(M.c.team_id == _team, M.c.snapshot_id == sa.bindparam("sid"))


class _Plan(NamedTuple):
    values: dict[str, Any]  # the row, but its key
    tail: list[Message]  # the messages it stores: those the parent chain lacks
    proof: str | None  # the parent's digest that the inherited messages rest on, if any
    as_parent: _Peek  # the row as PEEK will read it
    size: int  # bytes of all its messages as JSON


class _Conflict(Exception):
    """Another writer changed the row since we read it: roll back and run fn again."""


def _retryable(exc: Exception) -> bool:
    """A lost race: duplicate insert, failed version check, deadlock, serialization failure."""
    if isinstance(exc, _Conflict | IntegrityError):
        return True
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in _RETRY_SQLSTATES


def _json(messages: list[Message]) -> bytes:
    """The messages as one JSON array, as `model_dump(mode='json')` stores them."""
    return _MESSAGES.dump_json(
        messages, by_alias=True, exclude_none=True, fallback=_default_serializer
    )


def _digests(messages: list[Message], cuts: Iterable[int]) -> tuple[dict[int, str], int]:
    """sha256 of the JSON array of messages[:k] for each k in cuts (k > 0), and of them all;
    and the array's length in bytes.

    One serialization and one pass: a prefix's array is the whole array cut where the tail's
    starts, then closed. Pydantic writes fields in a fixed order and `json` columns keep key
    order, so equal messages give equal bytes; a spurious mismatch only costs a checkpoint.
    """
    whole, h, pos, out = _json(messages), hashlib.sha256(), 0, {}
    view = memoryview(whole)
    for k in sorted(set(cuts)):
        cut = len(whole) - len(_json(messages[k:])) if k < len(messages) else len(whole) - 1
        h.update(view[pos:cut])
        pos, prefix = cut, h.copy()
        prefix.update(b"]")
        out[k] = prefix.hexdigest()
    h.update(view[pos:])
    out[len(messages)] = h.hexdigest()
    return out, len(whole)


def _checked(snapshot_id: str, count: int, rows: Sequence[Any]) -> list[dict[str, Any]]:
    """The messages of (position, data) rows, if they are exactly positions 0..count-1."""
    if [r.position for r in rows] != list(range(count)):
        raise GenkitError(
            status="DATA_LOSS",
            message=f"Snapshot {snapshot_id!r}: its stored message chain is incomplete.",
        )
    return [r.data for r in rows]


def _assemble(
    snapshot_id: str, meta: dict[str, Any], count: int | None, rows: Sequence[Any]
) -> SessionSnapshot:
    """Genkit's snapshot from its stored row and messages (None count: no message list)."""
    whole = dict(meta)
    if count is not None:
        messages = _checked(snapshot_id, count, rows)
        whole["state"] = {**whole.get("state", {}), "messages": messages}
    return SessionSnapshot.model_validate(whole)


class SqlSessionStore(SessionStore[Any]):
    """Snapshots in `agent_snapshots`, the messages each one added in `agent_messages`.

    A save is all or nothing and safe across processes. An existing row is read FOR UPDATE
    and rewritten only if its version is unchanged; a new row, most saves, is one statement.
    A lost insert race, version check or parent check rolls back and runs fn again, up to
    `max_attempts`.
    """

    def __init__(
        self, sessions: SessionFactory, *, team_id: str = "", max_attempts: int = 20
    ) -> None:
        self._sessions = sessions
        self._default_team = team_id
        self._max_attempts = max_attempts
        # Rows this store created, by (team, id), as PEEK reads them: the next snapshot of a
        # conversation finds its parent here, a round trip saved. Taken out when used (so a
        # retry reads afresh) or rewritten here; CREATE's digest check catches other writers.
        self._leaves: dict[tuple[str, str], _Peek] = {}
        self._kept = KeptSnapshots()  # snapshots paused on here, for their resume

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
        """By id (one query), or the session's newest leaf (Genkit's own pick; two; none for
        the session a turn starts, see `starting`)."""
        require_one_selector(snapshot_id=snapshot_id, session_id=session_id)
        if snapshot_id is not None:
            assert_safe_snapshot_id(snapshot_id=snapshot_id)  # as FileSessionStore does
        team = self.team(context)
        if (hold := held_saves.current()) is not None:
            await hold.flush()  # whatever it reads, it reads as written
        if snapshot_id is None and session_id is not None and session_id == started():
            return None  # a session made for this turn: no query finds what cannot be there
        kept = None if snapshot_id is None else self._kept.for_resume(team, snapshot_id)
        if kept is not None:
            return kept
        async with autocommit(self._sessions) as s:  # single statements: no BEGIN, no COMMIT
            if snapshot_id is None:
                params = {"team": team, "session": session_id}
                rows = (await s.execute(LIGHT, params)).all()
                stubs = [
                    SessionSnapshot(snapshot_id=i, parent_id=p, created_at=c) for i, p, c in rows
                ]
                sid = cast(str, session_id)
                leaf = select_leaf(snapshots=stubs, session_id=sid, reject_ambiguous=False)
                if leaf is None:
                    return None  # a new chat's lookup ends here
                snapshot_id = leaf.snapshot_id
            rows = (await s.execute(LOAD, {"team": team, "sid": snapshot_id})).all()
        if not rows:
            return None
        head, body = rows[0], rows[1:]
        return _assemble(snapshot_id, head.data, head.message_count, body)

    async def save_snapshot(
        self, snapshot_id: str, fn: SaveFn, *, context: dict[str, Any] | None = None
    ) -> SessionSnapshot | None:
        """Atomic read-modify-write of one snapshot under Genkit's own rules (`apply_save`)."""
        assert_safe_snapshot_id(snapshot_id=snapshot_id)
        hold = held_saves.current()
        if hold is not None:
            await hold.flush()  # a second save in one turn: the first goes in first
        return await self._saved(self.team(context), snapshot_id, fn, hold)

    async def _saved(
        self, team: str, snapshot_id: str, fn: SaveFn, hold: Holding | None
    ) -> SessionSnapshot | None:
        for attempt in range(self._max_attempts):
            try:
                new = attempt == 0 and (team, snapshot_id) not in self._leaves
                return await self._save(team, snapshot_id, fn, new=new, hold=hold)
            except (_Conflict, DBAPIError) as exc:
                if not _retryable(exc):
                    raise
                await asyncio.sleep(random.uniform(0, 0.002 * 2 ** min(attempt, 7)))
        raise GenkitError(
            status="ABORTED",
            message=f"Snapshot {snapshot_id!r}: gave up after {self._max_attempts} conflicts.",
        )

    async def _save(
        self, team: str, snapshot_id: str, fn: SaveFn, *, new: bool, hold: Holding | None
    ) -> SessionSnapshot | None:
        """A missing row has nothing to lock: it is written (one statement) in autocommit,
        no BEGIN or COMMIT. `new`: the id is likely new (this store did not create it, and
        Genkit reserves a new id per turn), so fn is asked first and what it makes is
        written straight away, without a lookup; a row that exists after all fails the
        insert (its primary key), and the retry looks it up. A lookup comes first
        otherwise, or when fn makes nothing of a missing row (an update: heartbeat, abort).
        `hold`: a new row is held back there for the turn's ending statement to write."""
        async with autocommit(self._sessions) as s:
            snap = apply_save(existing=None, snapshot_id=snapshot_id, fn=fn) if new else None
            exists = False
            if snap is None:
                key = {"team": team, "sid": snapshot_id}
                exists = (await s.execute(GET_ROW, key)).first() is not None
                if not (exists or new):
                    snap = apply_save(existing=None, snapshot_id=snapshot_id, fn=fn)
            if not exists:
                if snap is not None and new and hold is not None:
                    hold.held = await self._held(s, team, snap, fn)
                elif snap is not None:
                    await self._create(s, team, snap)
                return snap
        return await self._save_locked(team, snapshot_id, fn)

    async def _save_locked(self, team: str, snapshot_id: str, fn: SaveFn) -> SessionSnapshot | None:
        """In one transaction, the row (if any) locked, so fn runs once unless a race is lost."""
        async with self._sessions() as s, s.begin():
            row = (await s.execute(LOCK_ROW, {"team": team, "sid": snapshot_id})).first()
            existing = None if row is None else await self._load(s, team, row)
            snap = apply_save(existing=existing, snapshot_id=snapshot_id, fn=fn)
            if snap is not None:
                await self._write(s, team, snap, row)
            return snap

    async def _load(self, s: Db, team: str, row: _Row) -> SessionSnapshot:
        rows: Sequence[Any] = ()
        if row.message_count is not None:
            rows = (await s.execute(MESSAGES, {"team": team, "sid": row.snapshot_id})).all()
        return _assemble(row.snapshot_id, row.meta, row.message_count, rows)

    async def _messages(self, s: Db, team: str, row: _Row) -> list[dict[str, Any]]:
        rows = (await s.execute(MESSAGES, {"team": team, "sid": row.snapshot_id})).all()
        return _checked(row.snapshot_id, row.message_count, rows)

    async def _plan(self, s: Db, team: str, snap: SessionSnapshot, *, locked: bool) -> _Plan:
        """The row, and the messages it stores: only those its parent lacks. `locked`: read
        the parent FOR SHARE; else (for CREATE, which checks its digest) a leaf will do."""
        msgs = snap.state.messages if snap.state is not None else None
        n = len(msgs or [])
        bases: list[tuple[int, str]] = []  # (count, digest) the list may extend, longest first
        parent: _Peek | None = None
        if msgs and snap.parent_id and snap.parent_id != snap.snapshot_id:
            if not locked:
                parent = self._leaves.pop((team, snap.parent_id), None)
            if parent is None:
                key = {"team": team, "sid": snap.parent_id}
                row = (await s.execute(PARENT if locked else PEEK, key)).first()
                parent = cast(_Peek | None, row)
            if parent is not None and parent[0] is not None:
                bases.append((parent[0], parent[2]))
                # A resume rewrites the paused model message (interrupt -> resolvedInterrupt):
                # the list extends the grandparent's, which the parent inherited whole.
                if parent[3] is not None and parent[1] == parent[3]:
                    bases.append((parent[3], cast(str, parent[4])))
        bases = [(k, d) for k, d in bases if 0 < k <= n]
        digests, size = _digests(msgs or [], [k for k, _ in bases])
        inherited = next((k for k, d in bases if digests[k] == d), 0)
        count = None if msgs is None else n
        values = {
            "session_id": session_id_of(snap),
            "parent_id": snap.parent_id,
            "created_at": snap.created_at,
            "meta": snap.model_dump(
                mode="json", by_alias=True, exclude_none=True, exclude={"state": {"messages"}}
            ),
            "message_count": count,
            "inherited": inherited,
            "digest": digests[n],
        }
        proof = parent[2] if parent is not None and inherited else None
        up = (None, None) if parent is None else (parent[0], parent[2])
        peek = (count, inherited, digests[n], *up)
        return _Plan(values, (msgs or [])[inherited:], proof, peek, size)

    async def _create(self, s: Db, team: str, snap: SessionSnapshot) -> None:
        """A new row and its messages in one statement (PostgreSQL, autocommit)."""
        params, plan = await self._creating(s, team, snap)
        if (await s.execute(CREATE, params)).scalar() != 1:
            raise _Conflict  # the parent changed since it was read
        self._remember(team, snap.snapshot_id, plan)

    async def _creating(
        self, s: Db, team: str, snap: SessionSnapshot
    ) -> tuple[dict[str, Any], _Plan]:
        """CREATE's parameters, and the plan they come from."""
        plan = await self._plan(s, team, snap, locked=False)
        params = {f"new_{c}": v for c, v in plan.values.items()}
        params |= {"team": team, "sid": snap.snapshot_id, "parent_digest": plan.proof}
        return params | {"tail": _json(plan.tail).decode()}, plan

    def _remember(
        self, team: str, sid: str, plan: _Plan, paused: SessionSnapshot | None = None
    ) -> None:
        """A row written here: a child's parent (as PEEK reads it); `paused`, a pause's
        snapshot, kept whole for the resume a click here would start."""
        self._leaves[(team, sid)] = plan.as_parent
        if len(self._leaves) > _LEAVES:
            del self._leaves[next(iter(self._leaves))]  # the oldest
        if paused is not None:
            self._kept.keep(team, paused, plan.size)

    async def _held(self, s: Db, team: str, snap: SessionSnapshot, fn: SaveFn) -> Held:
        """A new row held back (storage/held_saves.py): CREATE's parameters, for the turn's
        ending statement, and how to write it alone if that statement does not."""
        params, plan = await self._creating(s, team, snap)
        sid = snap.snapshot_id

        async def flush() -> None:
            await self._saved(team, sid, fn, None)  # looked up first if it exists already

        def written(resumable: bool) -> None:
            self._remember(team, sid, plan, snap if resumable else None)

        return Held(sid, params, written, flush)

    async def _write(self, s: Db, team: str, snap: SessionSnapshot, old: _Row | None) -> None:
        """Insert, or compare-and-swap, the row; store only the messages the parent lacks."""
        key = {"team": team, "sid": snap.snapshot_id}
        self._leaves.pop((team, snap.snapshot_id), None)  # a child would read it afresh
        values, tail, *_ = await self._plan(s, team, snap, locked=True)
        if old is None:
            await s.execute(sa.insert(S), {"team_id": team, "snapshot_id": key["sid"], **values})
        else:
            stored = (values["message_count"], values["inherited"], values["digest"])
            same = (old.message_count, old.inherited, old.digest) == stored
            if not same:  # while the children can still read the old messages
                await self._checkpoint_children(s, team, snap.snapshot_id)
            new = {f"new_{c}": v for c, v in values.items()}
            res = await s.execute(CAS, {**key, "seen": old.version, **new})
            if cast(sa.CursorResult[Any], res).rowcount != 1:
                raise _Conflict
            if same:
                return  # status, heartbeat or custom state only: the messages stand
            await s.execute(DELETE_MESSAGES, key)
        dumped = [m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in tail]
        await self._insert(s, team, snap.snapshot_id, dumped, values["inherited"])

    @staticmethod
    async def _insert(s: Db, team: str, sid: str, data: list[dict[str, Any]], start: int) -> None:
        if data:
            rows = [
                {"team_id": team, "snapshot_id": sid, "position": i, "data": d}
                for i, d in enumerate(data, start=start)
            ]
            await s.execute(sa.insert(M), rows)

    async def _checkpoint_children(self, s: Db, team: str, snapshot_id: str) -> None:
        """Before a row's messages change, give the children that inherit them a full copy."""
        kids = await s.execute(LOCK_KIDS, {"team": team, "sid": snapshot_id})
        for kid in kids.all():
            full = await self._messages(s, team, kid)
            key = {"team": team, "sid": kid.snapshot_id}
            await s.execute(DELETE_MESSAGES, key)
            await self._insert(s, team, kid.snapshot_id, full, 0)
            await s.execute(CHECKPOINT, key)
