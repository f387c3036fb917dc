"""`/approvals`: see and change tool policy, pending approvals and the audit trail.

Replies are ephemeral. Changing subcommands are for ADMIN_USERS and workspace admins/owners.
Each subcommand is a function of SUBCOMMANDS, returning the reply. Slack is acknowledged at
once and the reply goes to the command's response_url: a subcommand may wait on Slack (an
admin look-up retried through rate limits) for longer than Slack's 3 seconds, and the admin
must not see "operation_timeout" for a change that was made.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond
from slack_sdk.web.async_client import AsyncWebClient

from agent.keys import ApiKey, BadName, NameTaken
from agent.policy import Policy, UnknownTool
from agent.policy_cases import Outcome, decide
from agent.workflow import Workflow
from bot.card import span
from bot.deps import Deps
from bot.listeners.shared import slack_id
from bot.safe_text import escape
from storage.domain import CardState
from storage.policy_spec import Rule, split_principals
from storage.redaction import hide

HELP = """*`/approvals`* — who approves what the agent does
• `list` — every tool: allowed or needs approval, channel, approvers, timeout
• `pending [page]` — open approval requests, 20 a page
• `audit [tool] [page]` — recent requests, decisions and policy changes, newest first, 20 a page
• `rules <tool>` — the tool's rules (from the policy file), in order
• `explain <tool> <json input>` — what the policy does with such a call, and why
• `keys create NAME` · `keys list` · `keys revoke NAME` — API keys your agents use to ask \
Greenlight (they act as you; answered to you alone)
Admins only:
• `keys list all` · `keys revoke NAME @user` — anyone's API keys
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
log = logging.getLogger(__name__)
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
PAGE_SIZE = 20
MAX_PAGE = 500  # deeper than 10,000 rows: `greenlight audit export`


class Usage(ValueError):
    """A malformed command; the message tells the admin how to write it."""


@dataclass(frozen=True)
class Invocation:
    """One `/approvals …` as typed: who, where, the subcommand and its words."""

    deps: Deps
    client: AsyncWebClient
    team: str
    user: str
    verb: str
    args: list[str]
    rest: str = ""  # the text after the verb as typed (JSON keeps its spaces)


def parse_duration(text: str) -> timedelta:
    match = DURATION.match(text.strip().lower())
    if not match:
        raise Usage("Write the timeout like `30m`, `4h` or `2d`.")
    value = timedelta(**{UNITS[match.group(2)]: int(match.group(1))})
    if not timedelta(minutes=1) <= value <= timedelta(days=30):
        raise Usage("The timeout must be between 1 minute and 30 days.")
    return value


def describe(policy: Policy, *, asks: bool = False) -> str:
    """One tool's policy as an admin reads it; `asks`: the tool only asks a person (its
    policy says where approvers' questions go and who answers them)."""
    state = "asks a person" if asks else "runs freely" if policy.allowed else "needs approval"
    channel = f"<#{policy.channel}>" if policy.channel else "_no channel: set one with `route`_"
    who = _who(policy.approver_users, policy.approver_groups)
    hours = policy.timeout.total_seconds() / 3600
    line = f"• `{policy.tool}` — {state} · {channel} · approvers: {who} · timeout {hours:g}h"
    if policy.approvals > 1:
        line += f" · {policy.approvals} approvals"
    if policy.note_required:
        line += " · an Approve takes a note"
    if policy.standing:
        line += f" · standing approvals of {span(policy.standing)}"
    if policy.redact:
        line += " · hides " + ", ".join(f"`{escape(f)}`" for f in policy.redact)
    if policy.rules and not policy.allowed:
        count = len(policy.rules)
        line += f" · {count} rule{'s' * (count > 1)} (`/approvals rules {policy.tool}`)"
    return line


def _who(users: Sequence[str], groups: Sequence[str]) -> str:
    people = [f"<@{u}>" for u in users] + [f"<!subteam^{g}>" for g in groups]
    return " ".join(people) or "anyone in the channel"


def describe_rule(number: int, rule: Rule) -> str:
    """One rule as an admin reads it: when, then what changes for the call."""
    then = []
    if rule.allow is not None:
        then.append("runs freely" if rule.allow else "needs approval")
    if rule.approvals is not None:
        then.append(f"{rule.approvals} approval{'s' * (rule.approvals > 1)}")
    if rule.channel is not None:
        then.append(f"cards to <#{rule.channel}>")
    if rule.approvers is not None:
        then.append("approvers: " + _who(*split_principals(rule.approvers)))
    if rule.timeout is not None:
        then.append(f"timeout {rule.timeout.total_seconds() / 3600:g}h")
    return f"{number}. when `{escape(rule.when)}` → {', '.join(then) or 'no change'}"


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
        return {"timeout": parse_duration(args[0])}
    if args == ["channel"]:
        return {"approvers": []}
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
    return {"approvers": users + groups}


async def change(c: Invocation) -> str:
    if not c.args:
        raise Usage(f"Usage: `/approvals {c.verb} <tool> …`")
    if not await c.deps.people.is_admin(c.client, c.user, c.team):
        return "Only workspace admins and Greenlight admins can change that."
    tool, changes = c.args[0], policy_change(c.verb, c.args[1:])
    if refused := await public_channel_refusal(c, tool, changes):
        return refused
    policy = await c.deps.workflow.policies.change(c.team, tool, by=c.user, **changes)
    return "Done.\n" + describe(policy, asks=c.deps.workflow.runtime.asks(tool))


async def public_channel_refusal(c: Invocation, tool: str, changes: dict[str, Any]) -> str | None:
    """Why a route or an approvers change is refused: it would leave the tool's approvers
    "the members of a channel" that anyone in the workspace can join."""
    if c.verb not in ("route", "approvers"):
        return None
    policies = c.deps.workflow.policies
    if not policies.knows(tool):
        raise UnknownTool(tool, policies.known_tools())
    current = await policies.get(c.team, tool)
    channel = changes.get("channel", current.channel)
    named = current.names_approvers
    if "approvers" in changes:
        named = bool(changes["approvers"])
    if named or channel is None or await c.deps.people.is_private(c.client, channel):
        return None
    name = escape(tool)
    return (
        f"<#{channel}> is a public channel: anyone in the workspace could join it and approve "
        f"`{name}`. Make the channel private, or first name who may approve with "
        f"`/approvals approvers {name} @user @group`. Nothing was changed."
    )


async def list_tools(c: Invocation) -> str:
    return await policy_summary(c.deps.workflow, c.team)


async def policy_summary(workflow: Workflow, team: str) -> str:
    """Every tool's policy, a line each: `/approvals list`, and admins' Home tab."""
    policies = await workflow.policies.all(team)
    return "\n".join(describe(p, asks=workflow.runtime.asks(p.tool)) for p in policies) or (
        "No tools are loaded."
    )


def page_of(args: list[str], usage: str) -> tuple[list[str], int]:
    """The words before an optional trailing page number, and the page (1 when none)."""
    if not args or not args[-1].isdigit():
        return args, 1
    page = int(args[-1])
    if not 1 <= page <= MAX_PAGE:
        raise Usage(f"Pages run from 1 to {MAX_PAGE}. Usage: `{usage}`")
    return args[:-1], page


def paged(lines: list[str], page: int, more: str) -> str:
    """A page of lines (one extra was fetched to see whether another page follows)."""
    text = "\n".join(lines[:PAGE_SIZE])
    if len(lines) > PAGE_SIZE:
        text += f"\n_Page {page}. Next: `{more} {page + 1}`_"
    elif page > 1:
        text += f"\n_Page {page}, the last._"
    return text


async def list_pending(c: Invocation) -> str:
    rest, page = page_of(c.args, "/approvals pending [page]")
    if rest:
        raise Usage("Usage: `/approvals pending [page]`")
    found = await c.deps.workflow.reads.pending(
        c.team, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE
    )
    lines = []
    for a in found:
        asked = a.request.requested_at
        when = f"<!date^{int(asked.timestamp())}^{{date_short_pretty}} {{time}}|"
        when += f"{asked:%Y-%m-%d %H:%M} UTC>"
        where = f" in <#{a.card.channel}>" if a.card else ""
        if a.card is None or a.card.state == CardState.FAILED:
            where += " — its card could not be posted"
        lines.append(f"• `{a.request.tool}` for <@{a.request.requester}>, asked {when}{where}")
    if not lines:
        return "Nothing is waiting for approval." if page == 1 else f"Page {page} is empty."
    return paged(lines, page, "/approvals pending")


async def audit_trail(c: Invocation) -> str:
    rest, page = page_of(c.args, "/approvals audit [tool] [page]")
    if len(rest) > 1:
        raise Usage("Usage: `/approvals audit [tool] [page]`")
    tool = rest[0] if rest else None
    trail = await c.deps.workflow.reads.audit_trail(
        c.team, tool, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE
    )
    lines = [
        f"• {e.at:%Y-%m-%d %H:%M} {e.action} `{escape(e.tool or '-')}` by "
        + (f"<@{e.actor}>" if USER.match(f"<@{e.actor}>") else escape(e.actor))
        + _door(e.detail)
        for e in trail
    ]
    if not lines:
        return "The audit trail is empty." if page == 1 else f"Page {page} is empty."
    return paged(lines, page, f"/approvals audit {escape(tool)}" if tool else "/approvals audit")


def _door(detail: dict[str, Any]) -> str:
    """ " via mcp, key `ci`" for an entry of a gateway request; "" for Slack's own."""
    door = detail.get("door")
    if not isinstance(door, str) or door == "slack":
        return ""
    return f" via {escape(door)}, key `{escape(str(detail.get('key', '?')))}`"


async def list_rules(c: Invocation) -> str:
    if len(c.args) != 1:
        raise Usage("Usage: `/approvals rules <tool>`")
    tool, policies = c.args[0], c.deps.workflow.policies
    if not policies.knows(tool):
        raise UnknownTool(tool, policies.known_tools())
    policy = await policies.get(c.team, tool)
    if not policy.rules:
        return f"`{tool}` has no rules: {describe(policy)[2:]}"
    lines = [describe_rule(i, rule) for i, rule in enumerate(policy.rules, 1)]
    note = "\n_The first rule that matches a call decides; others get the policy above._"
    if policy.allowed:
        note = "\n_The tool is allowed outright (`/approvals allow`), so no rule applies now._"
    return describe(policy) + "\n" + "\n".join(lines) + note


async def explain(c: Invocation) -> str:
    """What the policy in force does with a call of `tool` with this input, for anyone: the
    same schema check and rules the approval middleware applies, the caller as requester."""
    usage = "Usage: `/approvals explain <tool> <json input>`, e.g. "
    usage += '`/approvals explain transferMoney {"amount": 500, "toAccount": "ACC-1"}`'
    if not c.rest.strip():
        raise Usage(usage)
    tool, given = [*c.rest.split(None, 1), ""][:2]
    workflow = c.deps.workflow
    if not workflow.policies.knows(tool):
        raise UnknownTool(tool, workflow.policies.known_tools())
    try:
        args = json.loads(given) if given.strip() else {}
    except ValueError:
        raise Usage(f"That input is not JSON. {usage}") from None
    found = workflow.runtime.tools.get(tool)
    action = found.action() if found is not None else None
    policy = await workflow.policies.get(c.team, tool)
    got = decide(policy, action, args, c.user)
    shown = escape(json.dumps(hide(args, policy.redact)[0], ensure_ascii=False))
    return f"*`{escape(tool)}`* with `{shown[:500]}`:\n" + "\n".join(explained(got))


def explained(got: Outcome) -> list[str]:
    """An outcome as bullet lines: allowed or not and why, where the card goes, who may
    decide, how long it waits, reminders and escalation."""
    p = got.policy
    if not got.evaluated:
        return [f"• Never reaches an approver: {escape(got.error or '')}; the agent is told."]
    why = f" ({escape(p.note)})" if p.note else ""
    if got.allowed:
        return [f"• Runs without approval{why}."]
    approvals = f"{p.approvals} approval{'s' * (p.approvals > 1)}"
    where = f"<#{p.channel}>" if p.channel else "_no channel: set one with `route`_"
    deciders = _who(p.approver_users, p.approver_groups)
    if not p.names_approvers and p.channel:
        deciders = f"the members of <#{p.channel}>"
    lines = [
        f"• Needs {approvals}{why}.",
        f"• The card goes to {where}; who may decide: {deciders}, never the requester "
        "or anyone else whose words led to the call.",
        f"• Expires after {p.timeout.total_seconds() / 3600:g}h unless decided.",
    ]
    if p.note_required:
        lines.append("• An Approve takes a note, which the agent reads with the result.")
    if p.redact:
        hidden = ", ".join(f"`{escape(f)}`" for f in p.redact)
        lines.append(
            f"• Hidden on the card, the Home, the audit trail and the logs: {hidden} "
            "(shown as ••••; the tool gets the value; approvers cannot change it)."
        )
    if p.standing_offer is not None:
        lines.append(
            f"• The card offers Approve for {span(p.standing_offer)} (a standing approval)."
        )
    if p.remind_after is not None:
        lines.append(f"• A reminder after {p.remind_after.total_seconds() / 3600:g}h.")
    if p.escalate_after is not None and p.escalate_to is not None:
        more = _who(p.escalate_users, p.escalate_groups)
        if not (p.escalate_users or p.escalate_groups):
            more = f"the members of <#{p.escalate_to}>"
        lines.append(
            f"• Escalates to <#{p.escalate_to}> after "
            f"{p.escalate_after.total_seconds() / 3600:g}h; then {more} may decide too."
        )
    return lines


async def show_help(c: Invocation) -> str:
    return HELP


KEYS_USAGE = (
    "Usage: `/approvals keys create NAME`, `/approvals keys list`, `/approvals keys revoke NAME`"
)


async def keys(c: Invocation) -> str:
    """API keys: each person's own; admins list and revoke anyone's. Every answer goes to
    the caller alone (the response_url, ephemeral): a new key is shown there, once."""
    verb, rest = (c.args[0].lower(), c.args[1:]) if c.args else ("", [])
    if verb == "create" and len(rest) == 1:
        try:
            made = await c.deps.keys.create(c.team, c.user, rest[0])
        except BadName:
            return (
                "A key name is 1 to 64 letters, digits, `_`, `.` or `-`, first a letter or digit."
            )
        except NameTaken:
            name = escape(rest[0])
            return f"You already have a key named `{name}`: revoke it, or pick another name."
        return (
            f"Your new API key `{escape(made.key.name)}` (it acts as you; keep it secret, it is "
            "not shown again):\n"
            f"```{made.token}```\n"
            f"Callback signing secret (for `callback_url`s): ```{made.callback_secret}```"
        )
    if verb == "list" and rest in ([], ["all"]):
        everyone = rest == ["all"]
        if everyone and not await c.deps.people.is_admin(c.client, c.user):
            return "Only workspace admins and Greenlight admins can list everyone's keys."
        found = await c.deps.keys.live(c.team, None if everyone else c.user)
        if not found:
            return (
                "No API keys."
                if everyone
                else "You have no API keys: `/approvals keys create NAME`."
            )
        return "\n".join(_key_line(k, owner=everyone) for k in found)
    if verb == "revoke" and len(rest) in (1, 2):
        owner = c.user
        if len(rest) == 2:
            if not (user := USER.match(rest[1])):
                raise Usage("Usage: `/approvals keys revoke NAME @user`")
            owner = user.group(1)
            if owner != c.user and not await c.deps.people.is_admin(c.client, c.user):
                return "Only workspace admins and Greenlight admins can revoke others' keys."
        if not await c.deps.keys.revoke(c.team, owner, rest[0]):
            return f"No key named `{escape(rest[0])}` of <@{owner}>. Nothing was changed."
        return f"Revoked `{escape(rest[0])}` of <@{owner}>: it is refused from now on."
    raise Usage(KEYS_USAGE)


def _key_line(key: ApiKey, *, owner: bool) -> str:
    used = f"last used {key.last_used_at:%Y-%m-%d %H:%M} UTC" if key.last_used_at else "never used"
    whose = f" of <@{key.user_id}>" if owner else ""
    return f"• `{escape(key.name)}`{whose} — created {key.created_at:%Y-%m-%d %H:%M} UTC, {used}"


SUBCOMMANDS: dict[str, Callable[[Invocation], Awaitable[str]]] = {
    "list": list_tools,
    "pending": list_pending,
    "audit": audit_trail,
    "rules": list_rules,
    "explain": explain,
    "help": show_help,
    "keys": keys,
    **dict.fromkeys(CHANGING, change),
}


async def on_command(
    ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, respond: AsyncRespond, deps: Deps
) -> None:
    team, user = body.get("team_id"), body.get("user_id")
    words = str(body.get("text") or "").split()
    if not slack_id(team) or not slack_id(user):
        await ack(text="I couldn't read that command.")
        return
    verb, args = (words[0].lower(), words[1:]) if words else ("help", [])
    subcommand = SUBCOMMANDS.get(verb)
    if subcommand is None:
        await ack(text=f"I don't know `{escape(verb)}`.\n\n{HELP}")
        return
    await ack()
    typed = str(body.get("text") or "").split(None, 1)
    rest = typed[1] if len(typed) > 1 else ""
    invocation = Invocation(deps, client, team, user, verb, args, rest)
    deps.background.spawn(answer(subcommand, invocation, respond), name=f"/approvals {verb}")


async def answer(
    subcommand: Callable[[Invocation], Awaitable[str]], c: Invocation, respond: AsyncRespond
) -> None:
    """Run the subcommand after the acknowledgement; its reply goes to the response_url."""
    try:
        reply = await subcommand(c)
    except UnknownTool as exc:
        known = ", ".join(f"`{t}`" for t in exc.known)
        reply = f"There is no tool `{escape(exc.tool)}`. Known tools: {known}"
    except Usage as exc:
        reply = str(exc)
    except Exception:
        log.exception("/approvals %s failed", c.verb)
        reply = "Sorry, that did not work. Try again in a minute: `/approvals list` shows "
        reply += "what is in force now."
    await respond(text=reply, response_type="ephemeral")


def register(app: AsyncApp) -> None:
    app.command("/approvals")(on_command)
