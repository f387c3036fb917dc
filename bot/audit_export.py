"""`greenlight audit export`: the audit trail on stdout, for a compliance review.

Reads DATABASE_URL only (no Slack tokens needed). Every workspace the database serves, with
a team_id column, unless `--team` picks one. Streams a page of rows per query, so a trail of
any length is exported without loading it whole.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from sqlalchemy.exc import SQLAlchemyError

from bot.settings import ConfigError, load_settings
from storage import audit, embedded
from storage.db import make_engine, make_session_factory


def since(text: str) -> datetime:
    """A date (midnight UTC) or an ISO 8601 time; without a zone, UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date: write 2026-01-01 or 2026-01-01T09:30:00Z"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="greenlight audit export",
        description="Write the audit trail from --since on, oldest first, to stdout.",
    )
    p.add_argument("--since", type=since, required=True, help="e.g. 2026-01-01 (UTC)")
    p.add_argument("--tool", help="only this tool's events")
    p.add_argument("--team", help="only this workspace (team ID); default: all")
    p.add_argument("--format", choices=("csv", "jsonl"), default="csv", help="default: csv")
    p.add_argument("--page-size", type=int, default=1000, help=argparse.SUPPRESS)
    return p


def _plain(row: Any) -> dict[str, Any]:
    values = dict(zip(audit.COLUMNS, row, strict=True))
    values["at"] = values["at"].astimezone(UTC).isoformat()
    return values


async def export(args: argparse.Namespace, url: str, out: TextIO) -> int:
    engine = make_engine(url)
    rows = 0
    writer = csv.writer(out, lineterminator="\n")
    if args.format == "csv":
        writer.writerow(audit.COLUMNS)
    try:
        pages = audit.export(
            make_session_factory(engine),
            since=args.since,
            tool=args.tool,
            team_id=args.team,
            page=args.page_size,
        )
        async for page in pages:
            for row in page:
                values = _plain(row)
                if args.format == "csv":
                    values["detail"] = json.dumps(values["detail"], sort_keys=True)
                    writer.writerow(values.values())
                else:
                    out.write(json.dumps(values, sort_keys=True) + "\n")
            rows += len(page)
            out.flush()
    finally:
        await engine.dispose()
    print(f"exported {rows} audit event(s)", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    """`argv`: the words after `audit`. Exit 2 with usage on stderr for bad arguments."""
    p = parser()
    if argv[:1] != ["export"]:
        p.print_usage(sys.stderr)
        print("greenlight audit: the one subcommand is `export`", file=sys.stderr)
        return 2
    args = p.parse_args(argv[1:])  # exits 2 with the usage on stderr
    if args.page_size < 1:
        p.error("--page-size must be at least 1")
    try:
        url = load_settings(serving=False).DATABASE_URL
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    try:
        with embedded.unless_given(url) as given:
            return asyncio.run(export(args, given, sys.stdout))
    except (OSError, SQLAlchemyError, embedded.EmbeddedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"cannot read the audit trail: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
