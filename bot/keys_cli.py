"""`greenlight keys create|revoke`: API keys for service accounts, from the command line.

Reads DATABASE_URL; the workspace is `--team`, or the one SLACK_BOT_TOKEN serves (asked of
Slack's auth.test). `create` prints the key alone on its last line, so a script can take it
with `tail -1`; it is never shown again.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Callable

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy.exc import SQLAlchemyError

from agent.clock import new_uuid, utc_now
from agent.keys import ApiKeys, BadName, NameTaken
from bot.settings import ConfigError, Settings, load_settings
from storage import embedded
from storage.db import make_engine, make_session_factory

SLACK_ID = re.compile(r"^[UWT][A-Z0-9]{2,31}$")


def _id(kind: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not SLACK_ID.match(text) or not text.startswith(kind):
            raise argparse.ArgumentTypeError(f"{text!r} is not a Slack {kind}… ID")
        return text

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="greenlight keys", description="Make or revoke API keys.")
    sub = p.add_subparsers(dest="verb", required=True)
    for verb, what in (("create", "make a key"), ("revoke", "revoke a key")):
        one = sub.add_parser(verb, help=what)
        one.add_argument("--user", required=True, type=_id("U"), help="the owner, U…")
        one.add_argument("--name", required=True, help="the key's name")
        one.add_argument("--team", type=_id("T"), help="the workspace, T… (default: the token's)")
    return p


async def _team(args: argparse.Namespace, settings: Settings) -> str:
    if args.team:
        return str(args.team)
    if settings.SLACK_BOT_TOKEN is None:
        raise ConfigError(["give --team T…, or set SLACK_BOT_TOKEN to find the workspace"])
    client = AsyncWebClient(
        token=settings.SLACK_BOT_TOKEN.get_secret_value(),
        base_url=settings.SLACK_API_URL or AsyncWebClient.BASE_URL,
    )
    try:
        return str((await client.auth_test())["team_id"])
    except SlackApiError as exc:
        raise ConfigError([f"Slack's auth.test answered {exc.response.get('error')!r}"]) from None
    finally:
        if client.session is not None:
            await client.session.close()


async def run(args: argparse.Namespace, settings: Settings, url: str) -> int:
    team = await _team(args, settings)
    engine = make_engine(url)
    keys = ApiKeys(make_session_factory(engine), clock=utc_now, new_id=new_uuid)
    try:
        if args.verb == "create":
            try:
                made = await keys.create(team, args.user, args.name)
            except BadName:
                print("a key name is 1 to 64 letters, digits, _, . or -", file=sys.stderr)
                return 2
            except NameTaken:
                print(f"{args.user} already has a key named {args.name!r}", file=sys.stderr)
                return 1
            print(f"API key {args.name!r} for {args.user} in {team}; it is not shown again.")
            print(f"callback signing secret: {made.callback_secret}")
            print(made.token)
            return 0
        if not await keys.revoke(team, args.user, args.name):
            print(f"no live key {args.name!r} of {args.user} in {team}", file=sys.stderr)
            return 1
        print(f"revoked {args.name!r} of {args.user} in {team}")
        return 0
    finally:
        await engine.dispose()


def main(argv: list[str]) -> int:
    """`argv`: the words after `keys`. Exit 2 with usage on stderr for bad arguments."""
    args = parser().parse_args(argv)
    try:
        settings = load_settings(serving=False)
        with embedded.unless_given(settings.DATABASE_URL) as url:
            return asyncio.run(run(args, settings, url))
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    except (OSError, SQLAlchemyError, embedded.EmbeddedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"cannot reach the database: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
