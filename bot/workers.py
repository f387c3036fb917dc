"""WORKERS > 1: worker processes sharing one listening socket, under a small supervisor.

One event loop keeps one core busy; on a machine with more, a second process uses the next.
Workers share nothing but the socket and the database, where every once-only step is a
conditional write: they are replicas, as two hosts would be, and need no coordination.
The supervisor migrates once, opens the socket, starts the workers with it, forwards
SIGTERM/SIGINT and exits when they have; if a worker dies on its own it stops the others
and exits 1, so that whatever runs the service (systemd, Kubernetes) restarts it whole.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from types import FrameType

from bot.settings import Settings
from storage.db import make_engine
from storage.migrate import upgrade

log = logging.getLogger(__name__)

WORKER = "--worker"  # python -m bot serve --worker <listening fd> <supervisor-alive fd>


async def _migrate(url: str) -> None:
    engine = make_engine(url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


def supervise(settings: Settings, *, host: str = "0.0.0.0") -> int:  # noqa: S104
    """Run settings.WORKERS worker processes until a signal; their combined exit status."""
    if settings.MIGRATE_ON_START:
        asyncio.run(_migrate(settings.DATABASE_URL))  # once, before any worker starts
    listener = socket.create_server((host, settings.PORT), backlog=1024)
    # The workers read this pipe, which nobody writes: it ends when the supervisor does,
    # however it ends (SIGKILL leaves no time to forward a signal).
    alive, _held_open_until_exit = os.pipe()
    fds = (listener.fileno(), alive)
    env = {**os.environ, "WORKERS": "1", "MIGRATE_ON_START": "false"}
    argv = [sys.executable, "-m", "bot", "serve", WORKER, *map(str, fds)]
    spawn = range(settings.WORKERS)
    pids = [subprocess.Popen(argv, env=env, pass_fds=fds).pid for _ in spawn]  # noqa: S603
    listener.close()  # the workers hold it now
    os.close(alive)
    log.info("supervising %d workers (pids %s)", len(pids), ", ".join(map(str, pids)))
    running, failed, stopping = set(pids), False, False

    def stop(signum: int = signal.SIGTERM, _frame: FrameType | None = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in running:
            os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while running:
        pid, status = os.wait()
        running.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 or not stopping:
            failed = True
            if not stopping:
                log.error("worker %d exited (%d) unasked: stopping the others", pid, code)
                stop()
    return 1 if failed else 0
