"""API keys as a person and an operator make them: `/approvals keys …` answered privately,
and `greenlight keys create|revoke` for service accounts."""

from __future__ import annotations

import re

from sqlalchemy import text

from agent.keys import TOKEN
from storage.db import SessionFactory
from tests.bot.conftest import ADMIN, SlackClient
from tests.bot.test_cli import run_bot

KEY = re.compile(r"glk_[A-Za-z0-9_-]{20,}")


async def test_a_key_is_made_listed_and_revoked_by_its_owner(
    client: SlackClient, team: str, bot_sessions: SessionFactory
) -> None:
    status, reply = await client.command(team, "UALICE", "keys create ci-bot")
    assert status == 200
    [token] = KEY.findall(reply)
    assert TOKEN.match(token)
    # Answered through the command's response_url (ephemeral), never in the channel.
    posted = [c for c in client.slack.calls if c.method == "chat.postMessage"]
    assert all(token not in str(c.args) for c in posted)
    # Only its hash is stored.
    async with bot_sessions() as db:
        stored = (
            await db.execute(text("SELECT * FROM api_keys WHERE team_id = :t"), {"t": team})
        ).all()
    assert len(stored) == 1 and token not in str(stored)

    _, again = await client.command(team, "UALICE", "keys create ci-bot")
    assert "already have a key named `ci-bot`" in again and not KEY.search(again)
    _, listed = await client.command(team, "UALICE", "keys list")
    assert "`ci-bot`" in listed and "never used" in listed and not KEY.search(listed)
    _, others = await client.command(team, "UBOB", "keys list")
    assert "ci-bot" not in others

    _, refused = await client.command(team, "UBOB", "keys revoke ci-bot <@UALICE>")
    assert "Only workspace admins" in refused
    _, revoked = await client.command(team, "UALICE", "keys revoke ci-bot")
    assert revoked.startswith("Revoked `ci-bot`")
    _, listed = await client.command(team, "UALICE", "keys list")
    assert "no API keys" in listed


async def test_admins_list_and_revoke_anyones_keys(client: SlackClient, team: str) -> None:
    await client.command(team, "UALICE", "keys create one")
    await client.command(team, "UBOB", "keys create two")
    _, refused = await client.command(team, "UBOB", "keys list all")
    assert "Only workspace admins" in refused
    _, everyone = await client.command(team, ADMIN, "keys list all")
    assert "`one` of <@UALICE>" in everyone and "`two` of <@UBOB>" in everyone
    _, revoked = await client.command(team, ADMIN, "keys revoke two <@UBOB>")
    assert revoked.startswith("Revoked `two` of <@UBOB>")
    _, bad = await client.command(team, "UALICE", "keys create bad name!")
    assert "Usage" in bad


def test_the_cli_prints_the_key_alone_on_the_last_line(team: str, bot_database: str) -> None:
    env = {"DATABASE_URL": bot_database}
    made = run_bot("keys", "create", "--user", "USVC", "--name", "deploys", "--team", team, env=env)
    assert made.returncode == 0, made.stderr
    last = made.stdout.strip().splitlines()[-1]
    assert TOKEN.match(last) and last == last.strip()
    twice = run_bot(
        "keys", "create", "--user", "USVC", "--name", "deploys", "--team", team, env=env
    )
    assert twice.returncode == 1 and "already has a key" in twice.stderr
    gone = run_bot("keys", "revoke", "--user", "USVC", "--name", "deploys", "--team", team, env=env)
    assert gone.returncode == 0 and "revoked" in gone.stdout
    again = run_bot(
        "keys", "revoke", "--user", "USVC", "--name", "deploys", "--team", team, env=env
    )
    assert again.returncode == 1
    bad = run_bot("keys", "create", "--user", "alice", "--name", "x", "--team", team, env=env)
    assert bad.returncode == 2 and "not a Slack U" in bad.stderr
