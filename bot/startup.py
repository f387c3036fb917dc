"""The policy a service starts with: POLICY_FILE checked, approver channels private, the
policy applied.

Every channel whose members decide must be private before the file's policy is applied to
the workspace."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent import policy_file as policy_files
from agent.policy_file import PolicyFile
from agent.workflow import Workflow
from bot.settings import ConfigError

log = logging.getLogger(__name__)


def read_policy_file(path: Path | None) -> PolicyFile | None:
    """POLICY_FILE, checked; a ConfigError naming the line of anything wrong with it."""
    if path is None:
        return None
    try:
        return policy_files.load(path)
    except policy_files.PolicyFileError as exc:
        raise ConfigError([f"POLICY_FILE {p}" for p in exc.problems]) from None


async def approver_channel_problems(
    client: AsyncWebClient, channel: str, named: str = "APPROVER_CHANNEL"
) -> list[str]:
    """Why a channel whose members decide (APPROVER_CHANNEL, or one `named` in POLICY_FILE
    for a tool that names no approvers) cannot be an approver group, if it cannot: anyone
    able to join it could approve."""
    try:
        info = (await client.conversations_info(channel=channel))["channel"]
    except SlackApiError as exc:
        return [
            f"{named} {channel}: Slack answered {exc.response.get('error')!r} to "
            "conversations.info. Check the channel ID, invite the bot to the channel, and "
            "reinstall the app with the manifest's scopes (channels:read, groups:read)"
        ]
    except aiohttp.ClientError as exc:
        return [f"{named} {channel}: could not reach Slack to check it ({exc!r})"]
    if not info.get("is_private"):
        return [
            f"{named} {channel} is a public channel: anyone in the workspace could join it "
            "and approve. Use a private channel (or make this one private), or name approvers"
        ]
    return []


async def prepare_policy(
    client: AsyncWebClient,
    workflow: Workflow,
    approver_channel: str,
    policy_file: PolicyFile | None,
) -> str | None:
    """Every channel whose members decide must be private; then the workspace this token
    serves gets POLICY_FILE's policy. Returns that workspace (None without POLICY_FILE)."""
    channels = {approver_channel: "APPROVER_CHANNEL"}
    if policy_file is not None:
        channels |= policy_files.member_channels(policy_file)
    problems = []
    for channel, named in channels.items():
        problems += await approver_channel_problems(client, channel, named)
    if problems:
        raise ConfigError(problems)
    if policy_file is None:
        return None
    team = str((await client.auth_test())["team_id"])
    changed = await workflow.policies.apply_file(team, policy_file)
    log.info("POLICY_FILE set the policy of %d tool(s): %s", len(changed), changed)
    return team
