"""The `greenlight` command (`python -m bot`): it serves Slack, and has the operator's other
entry points.

Those are its subcommands: the offline demo, the audit export, `policy check|test` (a
POLICY_FILE, offline), migrations, the container's health probe, the Slack app manifest and
the version."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from importlib import resources
from typing import Any

from bot import __version__
from bot.logs import setup_logging
from bot.settings import ConfigError, Settings, load_settings
from storage.embedded import EmbeddedError

USAGE = (
    "usage: greenlight [serve | demo | audit export --since DATE | policy check | policy test |"
    " migrate | healthcheck | manifest | keys create|revoke | --version]"
)
HEALTHCHECK_TIMEOUT = 5.0  # seconds; /healthz itself gives the database 2


def new_loop() -> asyncio.AbstractEventLoop:
    """The service's event loop: uvloop, which Genkit requires everywhere but Windows (and
    recommends), else asyncio's. Fifty messages at once reach their last card 5 to 15% sooner
    on it (docs/contributors.md, stop 37); the test suite runs on it too (tests/conftest.py)."""
    try:
        import uvloop
    except ImportError:  # Windows: Genkit installs no uvloop there
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the service on `new_loop`'s loop, as `asyncio.run` would on its own."""
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(main)


def settings_or_exit(*, serving: bool = True) -> Settings:
    """Validated settings with logging set up; else the problems on stderr and exit code 2."""
    try:
        settings = load_settings(serving=serving)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        raise SystemExit(2) from None
    setup_logging(settings.LOG_LEVEL, settings.LOG_FORMAT)
    return settings


def migrate() -> int:
    """Apply pending migrations to DATABASE_URL and exit: the Kubernetes migration Job, run
    once per release while the replicas start with MIGRATE_ON_START=false."""
    settings = settings_or_exit(serving=False)
    url = settings.DATABASE_URL
    if url is None:
        print(
            "DATABASE_URL is not set: `greenlight migrate` migrates your PostgreSQL (the "
            "embedded default is migrated at every start).",
            file=sys.stderr,
        )
        return 2
    from storage.db import make_engine
    from storage.migrate import upgrade

    async def run() -> None:
        engine = make_engine(url)
        try:
            await upgrade(engine)
        finally:
            await engine.dispose()

    asyncio.run(run())
    print("migrations applied: the schema is at head")
    return 0


def healthcheck() -> int:
    """Exit 0 when this container's /healthz answers 200: the image's HEALTHCHECK (a slim
    image has no curl). Reads only PORT, so a probe never fails on unrelated settings."""
    import os
    import urllib.error
    import urllib.request

    port = os.environ.get("PORT") or "3000"
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=HEALTHCHECK_TIMEOUT) as response:
            ok = response.status == 200
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


def manifest() -> int:
    """The Slack app manifest this version was built with, to paste into api.slack.com."""
    print(resources.files("bot").joinpath("manifest.yml").read_text(encoding="utf-8"), end="")
    return 0


def demo() -> int:
    """The offline demo, its PostgreSQL starting while Genkit and the rest are imported.
    Start-up from end to end (two seconds, then the process ends): no garbage collection."""
    from bot import heap
    from storage import embedded

    try:
        with embedded.starting() as server, heap.building():
            from bot.demo import run_demo

            return asyncio.run(run_demo(server.result().url))
    except EmbeddedError as exc:
        print(f"The demo cannot start: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["--version"], ["-V"]):
        print(f"greenlight {__version__}")
        return 0
    if args[:1] == ["demo"]:
        return demo()
    if args[:1] == ["audit"]:
        from bot.audit_export import main as audit_main

        return audit_main(args[1:])
    if args[:1] == ["keys"]:
        from bot.keys_cli import main as keys_main

        return keys_main(args[1:])
    if args[:1] == ["policy"]:
        from bot.policy_cli import main as policy_main

        return policy_main(args[1:])
    if args == ["migrate"]:
        return migrate()
    if args == ["healthcheck"]:
        return healthcheck()
    if args == ["manifest"]:
        return manifest()
    if args and args != ["serve"]:
        print(USAGE, file=sys.stderr)
        return 2
    settings = settings_or_exit()  # first: a configuration error is told at once
    from bot.server import serve

    try:
        run_loop(serve(settings))
    except ConfigError as exc:  # found at start: what Slack says about the approver channel
        print(exc.render(), file=sys.stderr)
        return 2
    except EmbeddedError as exc:
        print(f"Greenlight cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
