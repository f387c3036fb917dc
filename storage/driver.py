"""Statements built once, compiled once and run by the driver (asyncpg) on a pooled connection.

A lone statement through SQLAlchemy's `Connection` cost about 340 µs of CPU here, of which
asyncpg's own work is about 140: the rest is the Core connection around it (the isolation
level set and reset, an execution context, the compiled cache's lookup, a greenlet per
await). The hot statements (every transition, the thread's hold, the policy and approval
reads, the snapshot's) are module constants, so each is compiled once here and run as
SQLAlchemy's asyncpg cursor would run it, on a connection of SQLAlchemy's own pool: about
195 µs (`python -m bench.ops`). SQLAlchemy still builds the SQL, converts every parameter
and column with the types' own processors, keeps the prepared statements (its cache, per
connection), owns the pool (its liveness check, size and gauge), tells its cursor-execute
listeners and raises its own exceptions, so callers see the same rows and errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import Dialect, IteratorResult
from sqlalchemy.engine.result import SimpleResultMetaData
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.util import greenlet_spawn

_STATUS = re.compile(r"(?:SELECT|UPDATE|DELETE|INSERT \d+|MERGE) (\d+)")
Processor = Callable[[Any], Any] | None
S = TypeVar("S", bound=sa.ClauseElement)


class Rows(IteratorResult[*tuple[Any, ...]]):
    """A statement's rows, with SQLAlchemy's Result API, and how many rows it touched."""

    def __init__(self, meta: SimpleResultMetaData, rows: Sequence[Any], rowcount: int) -> None:
        super().__init__(meta, iter(rows))
        self.rowcount = rowcount


class Prepared:
    """A Core statement (a module constant) and its compiled form for one dialect."""

    def __init__(self, statement: sa.ClauseElement) -> None:
        self.statement = statement
        self._dialect: Dialect | None = None
        self._compiled: SQLCompiler | None = None
        self._binds: list[tuple[str, Processor]] = []
        self._meta = SimpleResultMetaData([])
        self.returns_rows = False
        self._expands = False
        self._defaults: dict[str, Any] = {}

    def compiled(self, dialect: Dialect) -> SQLCompiler:
        """Compile once. Each engine has a dialect of its own: a statement run by one engine,
        then by another, compiles again (each statement here runs on one engine)."""
        if self._compiled is None or dialect is not self._dialect:
            compiled = self.statement.compile(dialect=dialect)
            assert isinstance(compiled, SQLCompiler) and compiled.positional
            assert not compiled.escaped_bind_names, "parameter names need no escaping"
            # What SQLAlchemy's own execution applies (a tuple's processors: not used here).
            binds = cast(Mapping[str, Processor], compiled._bind_processors)
            self._binds = [(name, binds.get(name)) for name in compiled.positiontup or ()]
            columns = compiled._result_columns
            self._meta = SimpleResultMetaData(
                [c.keyname for c in columns],
                _processors=[c.type._cached_result_processor(dialect, None) for c in columns],
            )
            self.returns_rows = bool(columns)
            self._defaults = _defaults(compiled)
            self._expands = bool(compiled.post_compile_params or compiled.literal_execute_params)
            self._dialect, self._compiled = dialect, compiled
        return self._compiled

    def sql(self, dialect: Dialect, params: Mapping[str, Any] | None) -> tuple[str, list[Any]]:
        """The SQL and its positional arguments, each converted as its type says."""
        compiled = self.compiled(dialect)
        if self._defaults:
            params = self._defaults | dict(params or {})
        if not self._expands:
            values = compiled.construct_params(params)
            return compiled.string, [p(values[n]) if p else values[n] for n, p in self._binds]
        # An IN list is spread into one parameter per item, as SQLAlchemy does per execution.
        state = compiled.construct_expanded_state(params)
        processors = {
            **cast(Mapping[str, Processor], compiled._bind_processors),
            **state.processors,
        }
        return state.statement, [
            p(v) if (p := processors.get(n)) else v
            for n, v in zip(state.positiontup or (), state.positional_parameters, strict=True)
        ]

    def rows(self, records: Sequence[Any], rowcount: int) -> Rows:
        return Rows(self._meta, records, rowcount)


# Statements marked by `prepared`, by identity: each is a module constant, held here, so no
# other object can take its id.
_MARKED: dict[int, Prepared] = {}


def _defaults(compiled: SQLCompiler) -> dict[str, Any]:
    """The columns' defaults an INSERT (or an UPDATE) takes from Python: SQLAlchemy computes
    them per execution; here only constants are (a default a function makes is refused)."""
    fixed: dict[str, Any] = {}
    if not (compiled.insert_prefetch or compiled.update_prefetch):
        return fixed
    key = compiled._within_exec_param_key_getter
    for columns, which in (
        (compiled.insert_prefetch, "default"),
        (compiled.update_prefetch, "onupdate"),
    ):
        for column in columns:
            default = getattr(column, which)
            if default is None or not default.is_scalar:
                raise ValueError(f"{column}: its {which} is computed per execution")
            fixed[key(column)] = default.arg
    return fixed


def prepared(statement: S) -> S:
    """Mark a statement built once (a module constant) to run on the driver when it runs
    alone; it is returned unchanged (it may still be part of others, or of a transaction)."""
    _MARKED[id(statement)] = Prepared(statement)
    return statement


def marked(statement: object) -> Prepared | None:
    found = _MARKED.get(id(statement))
    return found if found is not None and found.statement is statement else None


async def run(engine: AsyncEngine, statement: Prepared, params: Mapping[str, Any] | None) -> Rows:
    """Run `statement` alone (it commits on its own) on a connection of `engine`'s pool."""
    sync = engine.sync_engine
    dialect = sync.dialect
    sql, args = statement.sql(dialect, params)
    fairy = await greenlet_spawn(sync.raw_connection)  # the pool's checkout and its checks
    try:
        if sync.dispatch.before_cursor_execute or sync.dispatch.after_cursor_execute:
            return await _observed(sync, fairy, statement, sql, args)
        return await _fetch(fairy.dbapi_connection, dialect, statement, sql, args)
    except Exception as error:
        raise _translated(dialect, fairy, sql, error) from error
    except BaseException:  # cancelled mid-statement: the connection's state is unknown
        fairy.invalidate()
        raise
    finally:
        await greenlet_spawn(fairy.close)  # checkin (and its reset) as SQLAlchemy does it


async def _fetch(
    adapted: Any, dialect: Any, statement: Prepared, sql: str, args: list[Any]
) -> Rows:
    """As SQLAlchemy's asyncpg cursor runs it: the statement prepared once per connection, in
    the same cache its own statements use, then bound and run."""
    ready, _ = await adapted._prepare(sql, dialect._invalidate_schema_cache_asof)
    records = await ready.fetch(*args)
    if statement.returns_rows:
        return statement.rows(records, len(records))
    found = _STATUS.match(ready.get_statusmsg() or "")
    return statement.rows([], int(found.group(1)) if found else -1)


async def _observed(
    sync: sa.Engine, fairy: Any, statement: Prepared, sql: str, args: list[Any]
) -> Rows:
    """With cursor-execute listeners (the benchmark's counters, the tests' faults): told as
    SQLAlchemy tells them, with a cursor of the same connection, in autocommit as the
    statement is."""
    adapted = fairy.dbapi_connection
    level, adapted.isolation_level = adapted.isolation_level, "autocommit"
    try:
        cursor, context = adapted.cursor(), SimpleNamespace()
        dispatch = sync.dispatch
        told = (None, cursor, sql, args, context, False)
        await greenlet_spawn(dispatch.before_cursor_execute, *told)
        rows = await _fetch(adapted, sync.dialect, statement, sql, args)
        await greenlet_spawn(dispatch.after_cursor_execute, *told)
        return rows
    finally:
        adapted.isolation_level = level


def _translated(dialect: Dialect, fairy: Any, sql: str, error: Exception) -> Exception:
    """SQLAlchemy's exception for a driver's error (IntegrityError, OperationalError, ...),
    the connection invalidated when it was lost, and no parameter in its text."""
    if isinstance(error, exc.SQLAlchemyError):
        return error
    try:
        fairy.dbapi_connection._handle_exception(error)  # raises the DBAPI-level error
    except Exception as dbapi_error:
        error = dbapi_error
    lost = dialect.is_disconnect(cast(Any, error), fairy.dbapi_connection, None)
    if lost:
        fairy.invalidate(error)
    return exc.DBAPIError.instance(
        sql,
        None,
        error,
        dialect.loaded_dbapi.Error,
        hide_parameters=True,
        dialect=dialect,
        connection_invalidated=lost,
    )
