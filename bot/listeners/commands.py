"""`/approvals`: see and change tool policy, pending approvals and the audit trail.

Replies are ephemeral. Changing subcommands are for ADMIN_USERS and workspace admins/owners.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncBoltContext

from agent.policy import Policy, UnknownTool
from bot.blocks import escape
from bot.deps import Deps
from bot.listeners.fields import slack_id

HELP = """*`/approvals`* — who approves what the agent does
• `list` — every tool: allowed or needs approval, channel, approvers, timeout
• `pending` — open approval requests
• `audit [tool]` — recent requests, decisions and policy changes
Admins only:
• `allow <tool>` — run it without approval  •  `require <tool>` — needs approval again
• `route <tool> #channel` — where its approval cards go
• `approvers <tool> @user @group…` — who may approve it (`approvers <tool> channel` resets to \
anyone in its channel)
• `timeout <tool> <duration>` — e.g. `30m`, `4h`, `2d`; unanswered requests are then denied"""

CHANGING = {"allow", "require", "route", "approvers", "timeout"}
CHANNEL = re.compile(r"^<#([CG][A-Z0-9]+)(?:\|[^>]*)?>$|^([CG][A-Z0-9]+)$")
USER = re.compile(r"^<@([UW][A-Z0-9]+)(?:\|[^>]*)?>$")
GROUP = re.compile(r"^<!subteam\^([S][A-Z0-9]+)(?:\|[^>]*)?>$")
DURATION = re.compile(r"^(\d{1,6})\s*([smhd])$")  # more digits: timedelta overflows
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class Usage(ValueError):
    """A malformed command; the message tells the admin how to write it."""


def parse_duration(text: str) -> timedelta:
    match = DURATION.match(text.strip().lower())
    if not match:
        raise Usage("Write the timeout like `30m`, `4h` or `2d`.")
    value = timedelta(**{UNITS[match.group(2)]: int(match.group(1))})
    if not timedelta(minutes=1) <= value <= timedelta(days=30):
        raise Usage("The timeout must be between 1 minute and 30 days.")
    return value


def describe(policy: Policy) -> str:
    state = "runs freely" if policy.allowed else "needs approval"
    channel = f"<#{policy.channel}>" if policy.channel else "_no channel: set one with `route`_"
    people = [f"<@{u}>" for u in policy.approver_users]
    people += [f"<!subteam^{g}>" for g in policy.approver_groups]
    who = " ".join(people) or "anyone in the channel"
    hours = policy.timeout.total_seconds() / 3600
    return f"• `{policy.tool}` — {state} · {channel} · approvers: {who} · timeout {hours:g}h"


def policy_change(verb: str, args: list[str]) -> dict[str, Any]:
    """The fields a changing subcommand sets, or Usage."""
    if verb == "allow":
        return {"allowed": True}
    if verb == "require":
        return {"allowed": False}
    if verb == "route":
        match = CHANNEL.match(args[0]) if len(args) == 1 else None
        if not match:
            raise Usage("Usage: `/approvals route <tool> #channel`")
        return {"channel": match.group(1) or match.group(2)}
    if verb == "timeout":
        if len(args) != 1:
            raise Usage("Usage: `/approvals timeout <tool> <duration>`, e.g. `4h`")
        return {"timeout_seconds": int(parse_duration(args[0]).total_seconds())}
    if args == ["channel"]:
        return {"approver_users": [], "approver_groups": []}
    users, groups = [], []
    for arg in args:
        if user := USER.match(arg):
            users.append(user.group(1))
        elif group := GROUP.match(arg):
            groups.append(group.group(1))
        else:
            raise Usage("Usage: `/approvals approvers <tool> @user @group…` (mention them)")
    if not users and not groups:
        raise Usage("Name at least one @user or @group, or `channel` to reset.")
    return {"approver_users": users, "approver_groups": groups}


def register(app: AsyncApp, deps: Deps) -> None:
    workflow = deps.workflow

    @app.command("/approvals")
    async def on_command(ack: AsyncAck, body: dict[str, Any], context: AsyncBoltContext) -> None:
        team, user = body.get("team_id"), body.get("user_id")
        words = str(body.get("text") or "").split()
        if not slack_id(team) or not slack_id(user) or context.client is None:
            await ack(text="I couldn't read that command.")
            return
        verb, args = (words[0].lower(), words[1:]) if words else ("help", [])
        try:
            if verb in CHANGING:
                if not args:
                    raise Usage(f"Usage: `/approvals {verb} <tool> …`")
                if not await deps.people.is_admin(context.client, user):
                    await ack(text="Only workspace admins and Greenlight admins can change that.")
                    return
                changes = policy_change(verb, args[1:])
                policy = await workflow.policies.change(team, args[0], by=user, **changes)
                await ack(text="Done.\n" + describe(policy))
            elif verb == "list":
                policies = await workflow.policies.all(team)
                await ack(text="\n".join(describe(p) for p in policies) or "No tools are loaded.")
            elif verb == "pending":
                pending = await workflow.pending(team)
                lines = [
                    f"• `{a.tool}` for <@{a.requester}>, asked "
                    f"<!date^{int(a.requested_at.timestamp())}^{{date_short_pretty}} {{time}}|"
                    f"{a.requested_at:%Y-%m-%d %H:%M} UTC>"
                    + (f" in <#{a.card_channel}>" if a.card_channel else "")
                    for a in pending
                ]
                await ack(text="\n".join(lines) or "Nothing is waiting for approval.")
            elif verb == "audit":
                tool = args[0] if args else None
                trail = await workflow.audit_trail(team, tool)
                lines = [
                    f"• {e.at:%Y-%m-%d %H:%M} {e.action} `{escape(e.tool or '-')}` by "
                    + (f"<@{e.actor}>" if USER.match(f"<@{e.actor}>") else escape(e.actor))
                    for e in trail
                ]
                await ack(text="\n".join(lines) or "The audit trail is empty.")
            elif verb == "help":
                await ack(text=HELP)
            else:
                await ack(text=f"I don't know `{escape(verb)}`.\n\n{HELP}")
        except UnknownTool as exc:
            known = ", ".join(f"`{t}`" for t in exc.known)
            await ack(text=f"There is no tool `{escape(exc.tool)}`. Known tools: {known}")
        except Usage as exc:
            await ack(text=str(exc))
