"""Configuration, read once from the environment and validated before anything starts.

Names are part of the product's interface: operators script against them, so they are
spelled exactly as the README's table says.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agent.mcp_config import McpServers, parse_servers
from agent.models import missing_plugins, provider, unknown_model
from bot.assistant import Prompt

SHUTDOWN_GRACE = 25.0  # seconds in-flight work gets at SIGTERM before it is cut off
# The database an unset DATABASE_URL meant before Greenlight ran on PostgreSQL alone.
OLD_DEFAULT_DATABASE = Path("greenlight.db")
DEFAULT_MODEL = "googleai/gemini-flash-latest"
DEFAULT_TOOLS = "agent.example_tools"

_SLACK_ID = re.compile(r"^[A-Z0-9]{2,}$")
MAX_PROMPTS = 4
DEFAULT_PROMPTS = (
    Prompt("What can you do?", "What can you do for me, and what needs someone's approval?"),
)


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    """Every knob Greenlight reads; see the README's configuration table."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", env_ignore_empty=True)

    SLACK_BOT_TOKEN: SecretStr | None = None
    SLACK_SIGNING_SECRET: SecretStr | None = None
    SLACK_APP_TOKEN: SecretStr | None = None
    SLACK_API_URL: str | None = None
    PORT: int = Field(default=3000, ge=0, le=65535)  # 0: any free port (tests)

    DATABASE_URL: str | None = None  # unset: the embedded PostgreSQL in ./greenlight-data
    DATABASE_POOL_SIZE: int = Field(default=20, ge=1, le=1000)
    MIGRATE_ON_START: bool = True

    GEMINI_API_KEY: SecretStr | None = None
    GEMINI_API_URL: str | None = None
    AGENT_MODEL: str = DEFAULT_MODEL
    # Tried in order once AGENT_MODEL's retries are spent (genkit-middleware Fallback).
    AGENT_FALLBACK_MODELS: Annotated[list[str], NoDecode] = Field(default_factory=list)
    AGENT_MODEL_RETRIES: int = Field(default=3, ge=0, le=10)
    AGENT_MODEL_RETRY_DELAY_SECONDS: float = Field(default=1.0, ge=0, le=60)
    ANTHROPIC_API_KEY: SecretStr | None = None
    OPENAI_API_KEY: SecretStr | None = None
    OPENAI_BASE_URL: str | None = None  # any OpenAI-compatible server
    OLLAMA_SERVER_ADDRESS: str | None = None  # the plugin's default: http://127.0.0.1:11434
    AGENT_SYSTEM_PROMPT: str | None = None
    AGENT_TOOLS: Annotated[list[str], NoDecode] = Field(default_factory=lambda: [DEFAULT_TOOLS])
    AGENT_ASK_HUMAN: bool = True  # the built-in askHuman: the agent may ask a person
    AGENT_FILES_ROOT: Path | None = None  # file tools (genkit-middleware Filesystem) under it
    AGENT_ARTIFACTS: bool = False  # artifact tools (genkit-middleware Artifacts)
    # MCP servers whose tools the agent gets (agent/mcp_config.py): JSON, name -> config.
    MCP_SERVERS: Annotated[McpServers, NoDecode] = Field(default_factory=dict)

    APPROVER_CHANNEL: str | None = None
    POLICY_FILE: Path | None = None
    ADMIN_USERS: Annotated[list[str], NoDecode] = Field(default_factory=list)
    APPROVAL_TIMEOUT_SECONDS: int = Field(default=24 * 3600, gt=0)
    RECOVERY_INTERVAL_SECONDS: float = Field(default=5.0, gt=0)
    RESUME_LEASE_SECONDS: float = Field(default=15.0, gt=0)
    TOOL_TIMEOUT_SECONDS: float = Field(default=15 * 60.0, gt=0)  # an approved call's run
    SHUTDOWN_GRACE_SECONDS: float = Field(default=SHUTDOWN_GRACE, ge=0, le=3600)
    MAX_CONCURRENT_TURNS: int = Field(default=8, ge=1, le=4096)
    RETENTION_DAYS: int = Field(default=90, ge=1, le=36500)
    AUDIT_RETENTION_DAYS: int = Field(default=400, ge=1, le=36500)
    # Back-pressure and fair use: messages per minute (counted across replicas), messages
    # waiting per process, and model calls in flight per process.
    USER_MESSAGES_PER_MINUTE: int = Field(default=20, ge=1, le=100_000)
    TEAM_MESSAGES_PER_MINUTE: int = Field(default=600, ge=1, le=1_000_000)
    MAX_QUEUED_TURNS: int = Field(default=500, ge=1, le=1_000_000)
    MAX_MODEL_CALLS: int = Field(default=32, ge=1, le=4096)
    LOG_LEVEL: str = "INFO"
    LOG_FORMAT: Literal["text", "json"] = "text"

    # Slack surfaces: how often a streamed reply is sent on (Slack rate limits the calls),
    # and the prompts an assistant thread offers when it opens (a JSON list: texts, or
    # {"title": ..., "message": ...}; at most 4, Slack's limit; [] for none).
    STREAM_INTERVAL_SECONDS: float = Field(default=1.0, ge=0, le=10)
    # The people directory: minutes between users.list syncs of who is a guest or an admin,
    # shared by the replicas and kept current by user_change events; 0: no directory,
    # every new person is asked of users.info (bot/people.py).
    PEOPLE_SYNC_MINUTES: int = Field(default=60, ge=0, le=7 * 24 * 60)
    ASSISTANT_PROMPTS: list[Prompt] = Field(default_factory=lambda: list(DEFAULT_PROMPTS))
    # The approvals API's callback_urls go to public addresses only, and to these networks
    # (CIDRs, comma-separated: "10.20.0.0/16,127.0.0.1/32"), docs/gateway.md.
    CALLBACK_ALLOWED_NETWORKS: Annotated[list[str], NoDecode] = Field(default_factory=list)

    _split_tools = field_validator(
        "AGENT_TOOLS",
        "ADMIN_USERS",
        "AGENT_FALLBACK_MODELS",
        "CALLBACK_ALLOWED_NETWORKS",
        mode="before",
    )(_split_csv)
    _mcp_json = field_validator("MCP_SERVERS", mode="before")(parse_servers)

    @field_validator("SLACK_API_URL", "GEMINI_API_URL", "OPENAI_BASE_URL", "OLLAMA_SERVER_ADDRESS")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @field_validator("AGENT_MODEL")
    @classmethod
    def _model_id(cls, value: str) -> str:
        if problem := unknown_model(value):
            raise ValueError(problem)
        return value

    @field_validator("AGENT_FALLBACK_MODELS")
    @classmethod
    def _model_ids(cls, value: list[str]) -> list[str]:
        if problems := [p for m in value if (p := unknown_model(m))]:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("DATABASE_URL")
    @classmethod
    def _postgresql(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from sqlalchemy.engine import make_url  # only when set: a config error stays quick
        from sqlalchemy.exc import ArgumentError

        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError("must be postgresql+asyncpg://user:pass@host/db") from None
        if (backend := url.get_backend_name()) != "postgresql":
            raise ValueError(
                f"names a {backend} database: Greenlight now runs on PostgreSQL only (SQLite "
                f"support was removed). The data in {url.database or 'it'} is not carried "
                "over and is left as it is. Set postgresql+asyncpg://user:pass@host/db, or "
                "unset DATABASE_URL for the embedded PostgreSQL in ./greenlight-data"
            )
        if url.drivername != "postgresql+asyncpg":
            raise ValueError("must use the async driver: postgresql+asyncpg://user:pass@host/db")
        return value

    @field_validator("APPROVER_CHANNEL")
    @classmethod
    def _channel_id(cls, value: str | None) -> str | None:
        if value is not None and not (_SLACK_ID.match(value) and value[0] in "CG"):
            raise ValueError("must be a channel ID such as C0123ABCD (not a #name)")
        return value

    @field_validator("POLICY_FILE")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a file")
        return value

    @field_validator("AGENT_FILES_ROOT")
    @classmethod
    def _directory(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"{value} is not a directory")
        return value

    @field_validator("CALLBACK_ALLOWED_NETWORKS")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"must be networks such as 10.0.0.0/8, got {network}") from None
        return value

    @field_validator("ADMIN_USERS")
    @classmethod
    def _user_ids(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not (_SLACK_ID.match(v) and v[0] in "UW")]
        if bad:
            raise ValueError(f"must be Slack user IDs such as U0123ABCD, got {', '.join(bad)}")
        return value

    @field_validator("ASSISTANT_PROMPTS", mode="before")
    @classmethod
    def _prompts(cls, value: object) -> object:
        """Plain texts are prompts whose title is the text itself."""
        if isinstance(value, list):
            return [{"title": v, "message": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("ASSISTANT_PROMPTS")
    @classmethod
    def _few_prompts(cls, value: list[Prompt]) -> list[Prompt]:
        if len(value) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts (Slack shows no more)")
        if any(not (p.title.strip() and p.message.strip()) for p in value):
            raise ValueError("a prompt needs a title and a message")
        return value

    @field_validator("LOG_LEVEL")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR")
        return value.upper()

    @model_validator(mode="after")
    def _no_old_database(self) -> Settings:
        # An upgrade must not silently start on an empty database beside the old one.
        if self.DATABASE_URL is None and OLD_DEFAULT_DATABASE.exists():
            raise ValueError(
                f"DATABASE_URL is unset, and ./{OLD_DEFAULT_DATABASE} is the SQLite database "
                "an earlier Greenlight used then. Greenlight now runs on PostgreSQL only: "
                "unset, DATABASE_URL means an embedded PostgreSQL in ./greenlight-data. "
                "The old file's conversations, approvals, policy and audit trail are not "
                "carried over, and the file is left as it is. Move or delete it to start "
                "afresh, or set DATABASE_URL to your PostgreSQL"
            )
        return self

    @model_validator(mode="after")
    def _audit_outlives_data(self) -> Settings:
        # The trail is the record of what happened in the conversations: it must not go
        # before them.
        if self.AUDIT_RETENTION_DAYS < self.RETENTION_DAYS:
            raise ValueError(
                f"AUDIT_RETENTION_DAYS ({self.AUDIT_RETENTION_DAYS}) must be at least "
                f"RETENTION_DAYS ({self.RETENTION_DAYS}): the audit trail outlives the "
                "conversations it records"
            )
        return self

    @property
    def socket_mode(self) -> bool:
        return self.SLACK_APP_TOKEN is not None

    def _model_problems(self) -> list[str]:
        """A plugin not installed, or a key not set, for any model the agent may call."""
        models = [self.AGENT_MODEL, *self.AGENT_FALLBACK_MODELS]
        problems = missing_plugins(models)
        keys = {
            "googleai": (
                "GEMINI_API_KEY",
                "create a key at https://aistudio.google.com/app/apikey",
            ),
            "anthropic": ("ANTHROPIC_API_KEY", "create a key at https://console.anthropic.com"),
            "openai": (
                "OPENAI_API_KEY",
                "create a key at https://platform.openai.com/api-keys (any value for an "
                "OpenAI-compatible server at OPENAI_BASE_URL that needs none)",
            ),
        }
        unset: dict[str, tuple[str, str]] = {}  # each key once, for the first model needing it
        for model in models:
            if (key := keys.get(provider(model))) and getattr(self, key[0]) is None:
                unset.setdefault(key[0], (model, key[1]))
        problems += [f"{k} is not set (needed for {m}): {how}" for k, (m, how) in unset.items()]
        return problems

    def serving_problems(self) -> list[str]:
        """What is missing to serve Slack traffic, each with how to fix it."""
        problems = []
        if self.SLACK_BOT_TOKEN is None:
            problems.append(
                "SLACK_BOT_TOKEN is not set: copy the Bot User OAuth Token (xoxb-...) "
                "from your Slack app's OAuth & Permissions page"
            )
        problems += self._model_problems()
        if self.APPROVER_CHANNEL is None:
            problems.append(
                "APPROVER_CHANNEL is not set: every tool needs approval until an admin allows "
                "it, and approval cards need a channel. Create a private channel, invite the "
                "bot, and put the channel's ID (C0...) here"
            )
        if self.SLACK_APP_TOKEN is None and self.SLACK_SIGNING_SECRET is None:
            problems.append(
                "SLACK_SIGNING_SECRET is not set (needed in HTTP mode): copy it from your "
                "Slack app's Basic Information page, or set SLACK_APP_TOKEN (xapp-...) "
                "to use Socket Mode instead"
            )
        return problems


class ConfigError(Exception):
    """Raised with every configuration problem at once, ready to print."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems

    def render(self) -> str:
        lines = ["Greenlight cannot start: the configuration has problems."]
        lines += [f"  - {p}" for p in self.problems]
        lines.append("Set these environment variables (see the README's configuration table).")
        return "\n".join(lines)


def load_settings(*, serving: bool) -> Settings:
    """Read the environment once; raise ConfigError naming every problem, never a traceback."""
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            name = ".".join(str(p) for p in err["loc"]) or "configuration"
            message = str(err["msg"]).removeprefix("Value error, ")
            problems.append(f"{name}: {message}")
        if serving:
            # Report missing tokens too, so one run names everything to fix.
            def given(name: str) -> SecretStr | None:
                return SecretStr("set") if os.environ.get(name) else None

            probe = Settings.model_construct(
                SLACK_BOT_TOKEN=given("SLACK_BOT_TOKEN"),
                SLACK_SIGNING_SECRET=given("SLACK_SIGNING_SECRET"),
                SLACK_APP_TOKEN=given("SLACK_APP_TOKEN"),
                APPROVER_CHANNEL=os.environ.get("APPROVER_CHANNEL") or None,
                GEMINI_API_KEY=given("GEMINI_API_KEY"),
                ANTHROPIC_API_KEY=given("ANTHROPIC_API_KEY"),
                OPENAI_API_KEY=given("OPENAI_API_KEY"),
                AGENT_MODEL=os.environ.get("AGENT_MODEL") or DEFAULT_MODEL,
                AGENT_FALLBACK_MODELS=[
                    m.strip()
                    for m in os.environ.get("AGENT_FALLBACK_MODELS", "").split(",")
                    if m.strip()
                ],
            )
            problems += probe.serving_problems()
        raise ConfigError(problems) from None
    if serving and (problems := settings.serving_problems()):
        raise ConfigError(problems)
    return settings
