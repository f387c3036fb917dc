"""`python -m bot` (or `greenlight`) serves Slack; `python -m bot demo` runs the offline demo."""

from __future__ import annotations

import asyncio
import logging
import sys

from bot.settings import ConfigError, load_settings


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["demo"]:
        from bot.demo import run_demo

        return asyncio.run(run_demo())
    if args and args[0] not in {"serve"}:
        print("usage: greenlight [serve|demo]", file=sys.stderr)
        return 2
    try:
        settings = load_settings(serving=True)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.LOG_LEVEL, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from bot.server import serve

    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
