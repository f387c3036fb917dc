"""`/approvals` called as the function it is, with the running service's own deps."""

from __future__ import annotations

from slack_bolt.context.ack.async_ack import AsyncAck

from bot.listeners.commands import SUBCOMMANDS, on_command
from bot.server import Service
from tests.bot.conftest import ADMIN


async def run(service: Service, team: str, user: str, text: str) -> str:
    assert service.deps is not None and service.app is not None
    ack = AsyncAck()  # type: ignore[no-untyped-call]
    body = {"team_id": team, "user_id": user, "text": text}
    await on_command(ack=ack, body=body, client=service.app.client, deps=service.deps)
    assert ack.response is not None and ack.response.status == 200
    return str(ack.response.body)  # a text-only ack is the text itself


async def test_each_subcommand_answers_through_the_table(service: Service, team: str) -> None:
    assert set(SUBCOMMANDS) == {
        "list", "pending", "audit", "rules", "help", "allow", "require", "route", "approvers",
        "timeout",
    }  # fmt: skip
    assert "`transferMoney` — needs approval" in await run(service, team, "UASK", "list")
    assert await run(service, team, "UASK", "pending") == "Nothing is waiting for approval."
    assert (await run(service, team, ADMIN, "allow getBalance")).startswith("Done.")
    assert "`getBalance` — runs freely" in await run(service, team, "UASK", "list")
    assert "policy_changed `getBalance` by <@UADMIN>" in await run(service, team, "UASK", "audit")
    assert (await run(service, team, "UASK", "frobnicate")).startswith("I don't know `frobnicate`")
    assert (await run(service, team, "UASK", "")).startswith("*`/approvals`*")  # help
    assert await run(service, team, "bad id", "list") == "I couldn't read that command."
