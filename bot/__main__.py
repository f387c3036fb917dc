"""`python -m bot` (or `greenlight`) serves Slack; `python -m bot demo` runs the offline demo;
`greenlight audit export …` writes the audit trail to stdout; `greenlight policy check|test`
checks and tests a POLICY_FILE offline."""

from __future__ import annotations

import asyncio
import sys

from bot.logs import setup_logging
from bot.settings import ConfigError, Settings, load_settings
from storage.embedded import EmbeddedError


def settings_or_exit() -> Settings:
    """Validated settings with logging set up; else the problems on stderr and exit code 2."""
    try:
        settings = load_settings(serving=True)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        raise SystemExit(2) from None
    setup_logging(settings.LOG_LEVEL, settings.LOG_FORMAT)
    return settings


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["demo"]:
        from bot.demo import run_demo

        try:
            return asyncio.run(run_demo())
        except EmbeddedError as exc:
            print(f"The demo cannot start: {exc}", file=sys.stderr)
            return 1
    if args[:1] == ["audit"]:
        from bot.audit_export import main as audit_main

        return audit_main(args[1:])
    if args[:1] == ["policy"]:
        from bot.policy_cli import main as policy_main

        return policy_main(args[1:])
    if args and args[0] not in {"serve"}:
        print(
            "usage: greenlight [serve|demo|audit export --since DATE|policy check|policy test]",
            file=sys.stderr,
        )
        return 2
    settings = settings_or_exit()
    from bot.server import serve

    try:
        asyncio.run(serve(settings))
    except ConfigError as exc:  # found at start: what Slack says about the approver channel
        print(exc.render(), file=sys.stderr)
        return 2
    except EmbeddedError as exc:
        print(f"Greenlight cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
