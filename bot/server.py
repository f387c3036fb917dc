"""The running service: HTTP (or Socket Mode), health, metrics, the recovery sweep, clean
shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import signal
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import SecretStr
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import text

from agent import policy_file as policy_files
from agent.approval import ToolTimeouts
from agent.assemble import build_workflow, new_uuid, utc_now
from agent.files import FileTools
from agent.keys import ApiKeys
from agent.limits import MessageLimits
from agent.mcp_config import McpServers
from agent.models import Credentials, ModelPluginError, Resilience
from agent.policy import policy_defaults
from agent.policy_file import PolicyFile
from agent.runtime import DEFAULT_SYSTEM_PROMPT, AgentConfig, ToolModuleError
from agent.workflow import Workflow
from bot.app import build_app
from bot.assistant import AssistantThreads
from bot.background import Background
from bot.clicks import ClickLimit
from bot.delivery import Delivery
from bot.deps import Deps
from bot.home import HomeTabs
from bot.listeners.commands import policy_summary
from bot.metrics import Metrics
from bot.people import People
from bot.settings import ConfigError, Settings
from gateway.api import ApiDoor
from gateway.callbacks import Deliveries, Reach
from gateway.calls import PROMPT_PREFIX, Gateway
from gateway.mcp import PATH as MCP_PATH, McpDoor
from gateway.requests import Requests
from gateway.sweep import GatewaySweep
from storage import embedded
from storage.approval_store import ApprovalStore
from storage.db import make_engine, make_session_factory
from storage.gateway_store import GatewayStore

if TYPE_CHECKING:
    from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

    from agent.mcp_tools import McpTools

log = logging.getLogger(__name__)

FOLLOW_UP_INTERVAL = 5.0  # seconds between looks for due reminders and escalations
SLACK_PATH = "/slack/events"
# Socket Mode: seconds between pings to Slack; a connection silent for four of them is stale,
# and reconnecting after a failure waits one (slack_sdk's SocketModeClient).
SOCKET_PING_INTERVAL = 10.0
HEALTH_TIMEOUT = 2.0  # seconds /healthz waits for the database before it answers 503
COUNTER_POOL = 5  # connections for the message counters (their own engine, see Service)


def signed_only(signing_secret: str) -> Middleware:
    """Let only correctly signed requests reach Bolt, and never let a body become a 500.

    Bolt parses a body before it checks the signature, and raises on what Slack never sends
    (bytes that are not UTF-8, JSON that is not an object, a `payload=` that is not JSON, a
    timestamp that is not a number); aiohttp answered those with a 500 to anyone who asked.
    Now: no valid signature, 401 whatever the body; signed but unreadable, 400.
    """
    verifier = SignatureVerifier(signing_secret)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "POST" or request.path != SLACK_PATH:
            return await handler(request)
        body = await request.read()
        try:
            signed = verifier.is_valid_request(body, dict(request.headers))
        except ValueError:  # a timestamp that is not a number
            signed = False
        if not signed:
            return web.json_response({"error": "invalid request"}, status=401)
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception as exc:
            log.warning("a signed request Bolt could not read: %r", exc)
            return web.json_response({"error": "malformed request"}, status=400)

    return guard


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


def mcp_servers(settings: Settings, policy_file: PolicyFile | None) -> McpServers:
    """The MCP servers: from MCP_SERVERS or from POLICY_FILE's `mcp_servers`, never both
    (two lists would leave it unclear which one an operator edits)."""
    in_file = policy_file.mcp_servers if policy_file is not None else {}
    if settings.MCP_SERVERS and in_file:
        raise ConfigError(
            [
                "MCP_SERVERS and POLICY_FILE's mcp_servers are both set: list the MCP "
                "servers in one of them"
            ]
        )
    return dict(settings.MCP_SERVERS or in_file)


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


def read_policy_file(path: Path | None) -> PolicyFile | None:
    """POLICY_FILE, checked; a ConfigError naming the line of anything wrong with it."""
    if path is None:
        return None
    try:
        return policy_files.load(path)
    except policy_files.PolicyFileError as exc:
        raise ConfigError([f"POLICY_FILE {p}" for p in exc.problems]) from None


class Service:
    """Everything `python -m bot` runs, with start/stop so tests run the very same thing."""

    def __init__(
        self,
        settings: Settings,
        *,
        host: str = "0.0.0.0",  # noqa: S104
        clock: Callable[[], datetime] = utc_now,
        socket_ping_interval: float = SOCKET_PING_INTERVAL,
    ) -> None:
        # Checked here too, not only by the CLI: without a signing secret Bolt would take
        # unsigned HTTP requests as Slack's.
        if problems := settings.serving_problems():
            raise ConfigError(problems)
        self.settings = settings
        self.host = host
        self._clock = clock
        self._ping_interval = socket_ping_interval
        self.port: int | None = None
        # Connections kept open: past them, each burst opens (and the pool later closes)
        # one per extra request, which costs both sides far more than the statements.
        if settings.DATABASE_URL is None:
            raise ConfigError(["DATABASE_URL is not set (serve() starts the embedded server)"])
        self._engine = make_engine(settings.DATABASE_URL, pool_size=settings.DATABASE_POOL_SIZE)
        # /healthz has a connection of its own, outside the pool: a pool that busy work
        # exhausted would make it wait (30 s) for one, not tell whether the database answers.
        # Kept open, so a server at max_connections still answers it.
        self._health = make_engine(
            settings.DATABASE_URL, pool_size=1, max_overflow=0, pool_timeout=HEALTH_TIMEOUT
        )
        # Message counters commit without waiting for the disk (synchronous_commit off):
        # a count is not worth an fsync, and a crash loses at most the last few. Every
        # message and every gateway call makes one.
        self._counters = make_engine(
            settings.DATABASE_URL,
            pool_size=COUNTER_POOL,
            max_overflow=0,
            connect_args={"server_settings": {"synchronous_commit": "off"}},
        )
        self.metrics = Metrics()
        self._runner: web.AppRunner | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._follower: asyncio.Task[None] | None = None
        self.mcp: McpTools | None = None
        self._team: str | None = None  # the workspace this token serves, once known
        self.deps: Deps | None = None
        self.app: AsyncApp | None = None
        self.gateway: Gateway | None = None
        self._gateway_running = contextlib.AsyncExitStack()

    async def start(self) -> None:
        s = self.settings
        if s.MIGRATE_ON_START:
            from storage.migrate import upgrade  # Alembic: only when it runs

            await upgrade(self._engine)
        policy_file = read_policy_file(s.POLICY_FILE)
        servers = mcp_servers(s, policy_file)
        background = Background(limit=s.MAX_CONCURRENT_TURNS, queue=s.MAX_QUEUED_TURNS)
        self.metrics.queue_depth_from(lambda: background.waiting)
        workflow = self._workflow(policy_file, background, servers)
        assistant = AssistantThreads(s.ASSISTANT_PROMPTS)
        people = People(admin_users=s.ADMIN_USERS, clock=self._clock)
        delivery = Delivery(
            workflow,
            clock=self._clock,
            stream_interval=s.STREAM_INTERVAL_SECONDS,
            assistant_thread=assistant.knows,
            # Its own cache: a card's post must not make a click see a channel's privacy late.
            is_private=People(admin_users=s.ADMIN_USERS, clock=self._clock).is_private,
        )
        home = HomeTabs(
            workflow=workflow,
            people=people,
            background=background,
            links=delivery.link,
            summary=policy_summary,
        )
        delivery.watch(home.changed)  # a card redrawn: so are the Homes showing it
        self.metrics.known_tools(workflow.policies.known_tools())
        self.deps = deps = Deps(
            workflow=workflow,
            delivery=delivery,
            people=people,
            background=background,
            clicks=ClickLimit(clock=self._clock),
            limits=MessageLimits(
                make_session_factory(self._counters),
                clock=self._clock,
                per_user=s.USER_MESSAGES_PER_MINUTE,
                per_team=s.TEAM_MESSAGES_PER_MINUTE,
            ),
            home=home,
            assistant=assistant,
            keys=ApiKeys(make_session_factory(self._engine), clock=self._clock, new_id=new_uuid),
        )
        assert s.SLACK_BOT_TOKEN is not None
        signing = s.SLACK_SIGNING_SECRET.get_secret_value() if s.SLACK_SIGNING_SECRET else None
        self.app = app = build_app(
            deps,
            token=s.SLACK_BOT_TOKEN.get_secret_value(),
            signing_secret=None if s.socket_mode else signing,
            api_url=s.SLACK_API_URL,
            slack_errors=self.metrics.slack_api_error,
        )
        if servers:
            from agent.mcp_tools import McpTools  # the MCP SDK: only when a server is set

            self.mcp = McpTools(servers, workflow.runtime)
            self.mcp.on_added = functools.partial(self._mcp_tools_added, workflow, policy_file)
            await self.mcp.start()
        await self._prepare_policy(app.client, workflow, policy_file)
        # Socket Mode gets no Slack route: unsigned HTTP requests must never reach Bolt.
        web_app = web.Application() if s.socket_mode else app.web_app(path=SLACK_PATH)
        if not s.socket_mode and signing is not None:
            web_app.middlewares.append(signed_only(signing))
        # The gateway (gateway/): a second transport on the same workflow; its cards go out
        # through this delivery and its outbox, like any other.
        sessions = make_session_factory(self._engine)
        self.gateway = Gateway(
            workflow,
            ApprovalStore(sessions),
            GatewayStore(sessions),
            clock=self._clock,
            new_id=new_uuid,
            post_card=functools.partial(delivery.post_card, app.client),
            refresh_card=functools.partial(delivery.refresh_card, app.client),
            observer=self.metrics,
            tool_timeouts=workflow.tool_timeouts,
            limits=deps.limits,
            lease=timedelta(seconds=s.RESUME_LEASE_SECONDS),
        )
        door = McpDoor(self.gateway, deps.keys)
        await self._gateway_running.enter_async_context(door.running())
        for method in ("GET", "POST", "DELETE"):
            web_app.router.add_route(method, MCP_PATH, door.handle)
        requests, reach = Requests(self.gateway), Reach.of(s.CALLBACK_ALLOWED_NETWORKS)
        ApiDoor(requests, deps.keys, reach).routes(web_app)
        deliveries = Deliveries(self.gateway.store, reach, requests.body, clock=self._clock)
        sweep = GatewaySweep(self.gateway, deliveries, clock=self._clock)
        await self._gateway_running.enter_async_context(sweep.running())
        web_app.router.add_get("/healthz", self._healthz)
        web_app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(web_app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host=self.host, port=s.PORT)
        await site.start()
        self.port = self._runner.addresses[0][1]
        if s.SLACK_APP_TOKEN is not None:
            from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

            self._socket = AsyncSocketModeHandler(
                app, s.SLACK_APP_TOKEN.get_secret_value(), ping_interval=self._ping_interval
            )
            await self._socket.connect_async()  # type: ignore[no-untyped-call]
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="recovery sweep")
        self._follower = asyncio.create_task(self._follow_up_forever(), name="follow-ups")
        log.info(
            "Greenlight is up (%s; /healthz and /metrics on :%d): model %s, tools %s",
            "Socket Mode" if s.socket_mode else "HTTP",
            self.port,
            s.AGENT_MODEL,
            ", ".join(workflow.policies.known_tools()),
        )

    def _workflow(
        self, policy_file: PolicyFile | None, background: Background, servers: McpServers
    ) -> Workflow:
        """The agent and its workflow, under the configured policy defaults."""
        s = self.settings
        config = AgentConfig(
            model=s.AGENT_MODEL,
            system_prompt=s.AGENT_SYSTEM_PROMPT or DEFAULT_SYSTEM_PROMPT,
            tool_modules=tuple(s.AGENT_TOOLS),
            ask_human=s.AGENT_ASK_HUMAN,
            credentials=Credentials(
                gemini_api_key=_secret(s.GEMINI_API_KEY),
                gemini_api_url=s.GEMINI_API_URL,
                anthropic_api_key=_secret(s.ANTHROPIC_API_KEY),
                openai_api_key=_secret(s.OPENAI_API_KEY),
                openai_base_url=s.OPENAI_BASE_URL,
                ollama_server_address=s.OLLAMA_SERVER_ADDRESS,
            ),
            resilience=Resilience(
                retries=s.AGENT_MODEL_RETRIES,
                delay_seconds=s.AGENT_MODEL_RETRY_DELAY_SECONDS,
                fallbacks=tuple(s.AGENT_FALLBACK_MODELS),
            ),
        )
        defaults = policy_defaults(
            policy_file,
            channel=s.APPROVER_CHANNEL,
            timeout=timedelta(seconds=s.APPROVAL_TIMEOUT_SECONDS),
        )
        try:
            workflow = build_workflow(
                make_session_factory(self._engine),
                config,
                defaults=defaults,
                clock=self._clock,
                new_id=new_uuid,
                lease=timedelta(seconds=s.RESUME_LEASE_SECONDS),
                tool_timeouts=ToolTimeouts(
                    timedelta(seconds=s.TOOL_TIMEOUT_SECONDS),
                    policy_files.tool_timeouts(policy_file),
                ),
                outside=background.outside,
                model_calls=s.MAX_MODEL_CALLS,
                files=FileTools(root=s.AGENT_FILES_ROOT, artifacts=s.AGENT_ARTIFACTS),
                observer=self.metrics,
                keep_data=timedelta(days=s.RETENTION_DAYS),
                keep_audit=timedelta(days=s.AUDIT_RETENTION_DAYS),
            )
            # The gateway's names: the approvals API's tools, Claude Code's (prompt.<tool>).
            api_tools = policy_file.api_tools if policy_file is not None else []
            workflow.policies.also_knows(api_tools, prefixes=(PROMPT_PREFIX,))
            if policy_file is not None and s.POLICY_FILE is not None:
                known = workflow.policies.known_tools()
                policy_files.check_tools(s.POLICY_FILE, policy_file, known, servers)
        # AGENT_TOOLS names something that cannot be loaded, or a model's plugin is missing.
        except (ToolModuleError, ModelPluginError) as exc:
            raise ConfigError([str(exc)]) from None
        except policy_files.PolicyFileError as exc:
            raise ConfigError([f"POLICY_FILE {p}" for p in exc.problems]) from None
        return workflow

    async def _prepare_policy(
        self, client: AsyncWebClient, workflow: Workflow, policy_file: PolicyFile | None
    ) -> None:
        """Every channel whose members decide must be private; then the workspace this
        token serves gets POLICY_FILE's policy."""
        assert self.settings.APPROVER_CHANNEL is not None  # serving_problems() requires it
        channels = {self.settings.APPROVER_CHANNEL: "APPROVER_CHANNEL"}
        if policy_file is not None:
            channels |= policy_files.member_channels(policy_file)
        problems = []
        for channel, named in channels.items():
            problems += await approver_channel_problems(client, channel, named)
        if problems:
            raise ConfigError(problems)
        if policy_file is not None:
            self._team = team = str((await client.auth_test())["team_id"])
            changed = await workflow.policies.apply_file(team, policy_file)
            log.info("POLICY_FILE set the policy of %d tool(s): %s", len(changed), changed)

    async def _mcp_tools_added(
        self, workflow: Workflow, policy_file: PolicyFile | None, tools: list[str]
    ) -> None:
        """An MCP server's tools joined after start: POLICY_FILE applies to them too. (Before
        the workspace is known, the start's own pass over every tool covers them.)"""
        if policy_file is None or self._team is None:
            return
        changed = await workflow.policies.apply_file(self._team, policy_file, only=tools)
        log.info("POLICY_FILE set the policy of MCP tool(s) as they joined: %s", changed)

    async def stop(self) -> None:
        """Stop taking work, let in-flight turns finish, close connections.

        The Slack socket closes first: Slack then sends this replica's envelopes to the
        others (or retries them) instead of to a process that is going away."""
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]
        for loop in (self._sweeper, self._follower):
            if loop is not None:
                loop.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loop
        if self._runner is not None:
            await self._runner.cleanup()
        if self.gateway is not None:
            self.gateway.close()
        await self._gateway_running.aclose()
        if self.deps is not None:
            self.deps.home.close()
            cut = await self.deps.background.drain(self.settings.SHUTDOWN_GRACE_SECONDS)
            if cut:
                log.warning(
                    "shutdown cut off %d turns: resumes were handed back for the next "
                    "recovery sweep (any replica's) to finish; a message cut off before its "
                    "answer gets none",
                    cut,
                )
        if self.mcp is not None:
            await self.mcp.stop()  # after the turns: they may call MCP tools
        if self.app is not None and self.app.client.session is not None:
            await self.app.client.session.close()  # after the turns: they post to Slack
        await self._engine.dispose()
        await self._health.dispose()
        await self._counters.dispose()

    async def _healthz(self, request: web.Request) -> web.Response:
        """200 when the database answers and, in Socket Mode, a connection to Slack is up:
        a replica without one receives nothing, so it is not ready."""
        link = self._socket.client if self._socket is not None else None  # slack_sdk's
        if link is not None and not await link.is_connected():
            return web.json_response({"ok": False, "slack": "disconnected"}, status=503)
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT), self._health.connect() as conn:
                await conn.execute(text("SELECT 1"))
        except Exception:
            log.warning("health check: database unreachable", exc_info=True)
            return web.json_response({"ok": False, "database": "unreachable"}, status=503)
        return web.json_response({"ok": True})

    async def _metrics(self, request: web.Request) -> web.Response:
        """Prometheus' text format (bot/metrics.py)."""
        assert self.deps is not None
        body = await self.metrics.render(self.deps.workflow.pending_by_tool)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _sweep_forever(self) -> None:
        """Expire overdue approvals and finish turns a dead process left; first at start-up."""
        assert self.deps is not None and self.app is not None
        while True:
            try:
                streams = self.deps.delivery.streams(self.app.client)
                report = await self.deps.workflow.sweep(on_text=streams)
                if report.expired or report.resumed:
                    log.info(
                        "recovery sweep resumed %d turn(s), expired %d approval(s)",
                        len(report.resumed),
                        len(report.expired),
                    )
                if report.purged.rows:
                    log.info("retention deleted %s", report.purged)
                await self.deps.delivery.sweep(self.app.client, report, streams)
                await streams.close_rest()
                await self.deps.limits.sweep()
            except Exception:
                log.exception("recovery sweep failed; trying again next interval")
            await asyncio.sleep(self.settings.RECOVERY_INTERVAL_SECONDS)

    async def _follow_up_forever(self) -> None:
        """Reminders and escalations, within FOLLOW_UP_INTERVAL of their time: each is
        recorded as done by whichever replica gets there first, then done."""
        assert self.deps is not None and self.app is not None
        while True:
            try:
                due = await self.deps.workflow.follow_ups()
                await self.deps.delivery.follow_ups(self.app.client, due)
            except Exception:
                log.exception("follow-ups failed; trying again shortly")
            await asyncio.sleep(FOLLOW_UP_INTERVAL)


def freeze_heap() -> None:
    """Keep what start-up built (modules, Genkit's registry, pydantic's schemas) out of every
    later garbage collection. Each full collection walked all of it: under load that paused
    the event loop for 200 ms and more, and Slack's acknowledgements waited (bench/bot.py)."""
    gc.collect()
    gc.freeze()


async def serve(settings: Settings, *, host: str = "0.0.0.0") -> None:  # noqa: S104
    """Run until SIGTERM or SIGINT; with DATABASE_URL unset, on the embedded PostgreSQL."""
    with embedded.unless_given(settings.DATABASE_URL) as url:
        service = Service(settings.model_copy(update={"DATABASE_URL": url}), host=host)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await service.start()
            freeze_heap()
            await stop.wait()
            log.info("shutting down")
        finally:
            await service.stop()
