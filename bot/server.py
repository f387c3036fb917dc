"""The running service: everything `python -m bot` runs, wired together, started and
stopped in order.

HTTP or Socket Mode, both transports (bot/, gateway/) on one workflow, the loops; on
SIGTERM, a clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from bot import heap

# Everything below builds what lasts as long as the process: no garbage collection meanwhile.
with heap.building():
    from aiohttp import web
    from pydantic import SecretStr
    from slack_bolt.async_app import AsyncApp
    from slack_sdk.web.async_client import AsyncWebClient

    from agent import policy_file as policy_files
    from agent.assemble import build_workflow
    from agent.clock import new_uuid, utc_now
    from agent.files import FileTools
    from agent.gate import ToolTimeouts
    from agent.keys import ApiKeys
    from agent.limits import MessageLimits
    from agent.mcp_config import McpServers
    from agent.models import Credentials, ModelPluginError, Resilience, provider
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
    from bot.loops import Loops
    from bot.mcp_servers import McpConnections, mcp_servers
    from bot.metrics import Metrics
    from bot.people import Directory, People
    from bot.routes import HEALTH_TIMEOUT, Probes, slack_web_app
    from bot.settings import ConfigError, Settings
    from bot.startup import prepare_policy, read_policy_file
    from gateway.api import ApiDoor
    from gateway.callbacks import Deliveries, Reach
    from gateway.calls import PROMPT_PREFIX, Gateway
    from gateway.mcp_route import PATH as MCP_PATH, LazyMcpDoor
    from gateway.requests import Requests
    from gateway.sweep import GatewaySweep
    from storage import embedded
    from storage.approval_store import ApprovalStore
    from storage.db import connections_in_use, make_engine, make_session_factory
    from storage.gateway_store import GatewayStore
    from storage.people import PeopleStore

if TYPE_CHECKING:
    import aiohttp
    from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

    from agent.mcp_tools import McpTools

log = logging.getLogger(__name__)

# Socket Mode: seconds between pings to Slack; a connection silent for four of them is stale,
# and reconnecting after a failure waits one (slack_sdk's SocketModeClient).
SOCKET_PING_INTERVAL = 10.0
COUNTER_POOL = 5  # connections for the message counters (their own engine, see Service)


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


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
        self.settings, self.host = settings, host
        self._clock = clock
        self._ping_interval = socket_ping_interval
        self.port: int | None = None
        if settings.DATABASE_URL is None:
            raise ConfigError(["DATABASE_URL is not set (serve() starts the embedded server)"])
        # A fixed pool: past it, a statement waits for a connection (a millisecond or so)
        # rather than opening one that is closed again when it comes back. A new connection
        # costs the bot ~3.8 ms of CPU and PostgreSQL ~5.6 ms (bench/ops.py), and its
        # statements are prepared and planned again; with 10 for bursts that was 0.2 a
        # conversation at 50 at once and 0.08 at saturation (docs/contributors.md,
        # Performance). Nothing holds a connection while it waits for another, so a full
        # pool only queues. Last in, first out: when few statements run at once they go to
        # the same few connections, whose statements are prepared and planned already and
        # which are not idle long enough to be pinged (storage/db.py), rather than to each
        # of the pool's in turn.
        self._engine = make_engine(
            settings.DATABASE_URL,
            pool_size=settings.DATABASE_POOL_SIZE,
            max_overflow=0,
            pool_use_lifo=True,
        )
        # /healthz has a connection of its own, outside the pool: a pool that busy work
        # exhausted would make it wait (30 s) for one, not tell whether the database answers.
        # Kept open, so a server at max_connections still answers it.
        self._health = make_engine(
            settings.DATABASE_URL, pool_size=1, max_overflow=0, pool_timeout=HEALTH_TIMEOUT
        )
        # Message counters commit without waiting for the disk (synchronous_commit off):
        # a count is not worth an fsync, and a crash loses at most the last few. Every
        # gateway call makes one. A Slack message's count is written with its event id,
        # which must outlive a crash (a retry runs nothing twice), on the main engine.
        self._counters = make_engine(
            settings.DATABASE_URL,
            pool_size=COUNTER_POOL,
            max_overflow=0,
            connect_args={"server_settings": {"synchronous_commit": "off"}},
        )
        self.metrics = Metrics()
        self._runner: web.AppRunner | None = None
        self._socket: AsyncSocketModeHandler | None = None
        self._loops: Loops | None = None
        self._mcp: McpConnections | None = None
        self.deps: Deps | None = None
        self.app: AsyncApp | None = None
        self.gateway: Gateway | None = None
        self._model_http: aiohttp.ClientSession | None = None  # Google AI's (agent/gemini.py)
        self._gateway_running = contextlib.AsyncExitStack()

    @property
    def mcp(self) -> McpTools | None:
        """The MCP servers' tools, once started with any server configured."""
        return self._mcp.tools if self._mcp is not None else None

    async def start(self) -> None:
        s = self.settings
        if s.MIGRATE_ON_START:
            from storage.migrate import upgrade  # Alembic: only when it runs

            await upgrade(self._engine)
        policy_file = read_policy_file(s.POLICY_FILE)
        self._mcp = mcp = McpConnections(mcp_servers(s, policy_file), policy_file)
        background = Background(limit=s.MAX_CONCURRENT_TURNS, queue=s.MAX_QUEUED_TURNS)
        self.metrics.queue_depth_from(lambda: background.waiting)
        self.metrics.db_connections_from(connections_in_use(self._engine))
        workflow = self._workflow(policy_file, background, mcp.servers)
        self.deps = deps = self._deps(workflow, background)
        self.metrics.known_tools(workflow.policies.known_tools())
        assert s.SLACK_BOT_TOKEN is not None
        signing = s.SLACK_SIGNING_SECRET.get_secret_value() if s.SLACK_SIGNING_SECRET else None
        self.app = app = build_app(
            deps,
            token=s.SLACK_BOT_TOKEN.get_secret_value(),
            signing_secret=None if s.socket_mode else signing,
            api_url=s.SLACK_API_URL,
            slack_errors=self.metrics.slack_api_error,
        )
        await mcp.start(workflow)
        assert s.APPROVER_CHANNEL is not None  # serving_problems() requires it
        mcp.team = await prepare_policy(app.client, workflow, s.APPROVER_CHANNEL, policy_file)
        web_app = slack_web_app(app, socket_mode=s.socket_mode, signing=signing)
        await self._gateway(web_app, deps, app.client)
        probes = Probes(self._health, self.metrics, workflow.reads.pending_by_tool)
        probes.routes(web_app)
        await self._listen(web_app, app, probes)
        self._loops = Loops(
            deps,
            app.client,
            sweep_interval=s.RECOVERY_INTERVAL_SECONDS,
            people_sync_interval=60.0 * s.PEOPLE_SYNC_MINUTES,
        )
        self._loops.start()
        log.info(
            "Greenlight is up (%s; /healthz and /metrics on :%d): model %s, tools %s",
            "Socket Mode" if s.socket_mode else "HTTP",
            self.port,
            s.AGENT_MODEL,
            ", ".join(workflow.policies.known_tools()),
        )

    def _deps(self, workflow: Workflow, background: Background) -> Deps:
        """What the listeners share; the Home tabs redrawn with the cards they show."""
        s = self.settings
        assistant = AssistantThreads(s.ASSISTANT_PROMPTS)
        outside = background.outside
        directory = None
        if s.PEOPLE_SYNC_MINUTES:
            store = PeopleStore(make_session_factory(self._engine))
            directory = Directory(store, every=timedelta(minutes=s.PEOPLE_SYNC_MINUTES))
        people = People(
            admin_users=s.ADMIN_USERS, clock=self._clock, outside=outside, directory=directory
        )
        # Its own cache: a card's post must not make a click see a channel's privacy late.
        for_cards = People(
            admin_users=s.ADMIN_USERS, clock=self._clock, outside=outside, directory=directory
        )
        delivery = Delivery(
            workflow,
            clock=self._clock,
            stream_interval=s.STREAM_INTERVAL_SECONDS,
            assistant_thread=assistant.knows,
            people=for_cards,
        )
        home = HomeTabs(
            workflow=workflow,
            people=people,
            background=background,
            links=delivery.link,
            summary=policy_summary,
        )
        delivery.watch(home.changed)  # a card redrawn: so are the Homes showing it
        return Deps(
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
                # A message's count records its Slack event id, which must outlive a crash.
                events=make_session_factory(self._engine),
            ),
            home=home,
            assistant=assistant,
            keys=ApiKeys(make_session_factory(self._engine), clock=self._clock, new_id=new_uuid),
        )

    async def _gateway(self, web_app: web.Application, deps: Deps, client: AsyncWebClient) -> None:
        """The gateway (gateway/): a second transport on the same workflow; its cards go out
        through this delivery and its outbox, like any other."""
        s, workflow, delivery = self.settings, deps.workflow, deps.delivery
        sessions = make_session_factory(self._engine)
        self.gateway = Gateway(
            workflow,
            ApprovalStore(sessions),
            GatewayStore(sessions),
            clock=self._clock,
            new_id=new_uuid,
            post_card=functools.partial(delivery.post_card, client),
            refresh_card=functools.partial(delivery.refresh_card, client),
            observer=self.metrics,
            tool_timeouts=workflow.tool_timeouts,
            limits=deps.limits,
            lease=timedelta(seconds=s.RESUME_LEASE_SECONDS),
        )
        door = LazyMcpDoor(self.gateway, deps.keys)
        await self._gateway_running.enter_async_context(door.running())
        for method in ("GET", "POST", "DELETE"):
            web_app.router.add_route(method, MCP_PATH, door.handle)
        requests, reach = Requests(self.gateway), Reach.of(s.CALLBACK_ALLOWED_NETWORKS)
        ApiDoor(requests, deps.keys, reach).routes(web_app)
        deliveries = Deliveries(self.gateway.store, reach, requests.body, clock=self._clock)
        sweep = GatewaySweep(self.gateway, deliveries, clock=self._clock)
        await self._gateway_running.enter_async_context(sweep.running())

    async def _listen(self, web_app: web.Application, app: AsyncApp, probes: Probes) -> None:
        """Serve HTTP on PORT; with SLACK_APP_TOKEN, connect to Slack in Socket Mode too
        (/healthz then tells whether that connection is up)."""
        s = self.settings
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
            probes.socket = self._socket
            await self._socket.connect_async()  # type: ignore[no-untyped-call]

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
            model_http=self._google_ai(),
        )
        timeout = timedelta(seconds=s.APPROVAL_TIMEOUT_SECONDS)
        defaults = policy_defaults(policy_file, channel=s.APPROVER_CHANNEL, timeout=timeout)
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

    def _google_ai(self) -> aiohttp.ClientSession | None:
        """The session Google AI's calls go through, when a model is one of its (closed at
        `stop`); made with the event loop running."""
        s = self.settings
        if all(provider(m) != "googleai" for m in (s.AGENT_MODEL, *s.AGENT_FALLBACK_MODELS)):
            return None
        from agent.gemini import model_session  # its plugin: only when a model uses it

        self._model_http = model_session(s.GEMINI_API_URL)
        return self._model_http

    async def stop(self) -> None:
        """Stop taking work, let in-flight turns finish, close connections.

        The Slack socket closes first: Slack then sends this replica's envelopes to the
        others (or retries them) instead of to a process that is going away."""
        if self._socket is not None:
            await self._socket.close_async()  # type: ignore[no-untyped-call]
        # One grace for all the work under way: the sweep's pass and the turns run meanwhile.
        grace = self.settings.SHUTDOWN_GRACE_SECONDS
        until = asyncio.get_running_loop().time() + grace
        if self._loops is not None:
            await self._loops.stop(grace)
        if self._runner is not None:
            await self._runner.cleanup()
        if self.gateway is not None:
            self.gateway.close()
        await self._gateway_running.aclose()
        if self.deps is not None:
            self.deps.home.close()
            left = max(until - asyncio.get_running_loop().time(), 0.0)
            cut = await self.deps.background.drain(left)
            if cut:
                log.warning(
                    "shutdown cut off %d turns: resumes were handed back for the next "
                    "recovery sweep (any replica's) to finish; a message cut off before its "
                    "answer gets none",
                    cut,
                )
        if self._mcp is not None:
            await self._mcp.stop()  # after the turns: they may call MCP tools
        if self.app is not None and self.app.client.session is not None:
            await self.app.client.session.close()  # after the turns: they post to Slack
        if self._model_http is not None:
            await self._model_http.close()  # after the turns: they ask the model
        await self._engine.dispose()
        await self._health.dispose()
        await self._counters.dispose()


async def serve(settings: Settings, *, host: str = "0.0.0.0") -> None:  # noqa: S104
    """Run until SIGTERM or SIGINT; with DATABASE_URL unset, on the embedded PostgreSQL."""
    with embedded.unless_given(settings.DATABASE_URL) as url:
        service = Service(settings.model_copy(update={"DATABASE_URL": url}), host=host)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            with heap.building(collect=True):  # no collection until it has started
                await service.start()
            heap.serving()
            await stop.wait()
            log.info("shutting down")
        finally:
            await service.stop()
