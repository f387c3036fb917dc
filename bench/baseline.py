"""The baseline the issue names: a bare Bolt + Genkit bot with no database work.

A plain `AsyncApp` and a Genkit agent with Genkit's own `InMemorySessionStore` and the stock
`ToolApproval` middleware from genkit-middleware; pending interrupts live in a dict. It does
the same visible flow as Greenlight (placeholder in the thread, a card in the approver
channel, a note to the requester; on Approve the card is updated, the turn resumed and the
reply posted in the thread) with none of the durability: no event de-duplication, no policy,
no audit trail, nothing survives a restart. It exists only to be measured against.

    python -m bench.baseline   # reads the same environment variables as `python -m bot`
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import signal
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from genkit import Tool
from genkit.exp import AgentFinishReason, AgentInterrupt, Genkit, InMemorySessionStore
from genkit_google_genai import GoogleAI
from genkit_middleware import ToolApproval
from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger("bench.baseline")

SYSTEM = "You are an operations assistant in Slack. Use the tools to do what is asked."


@dataclass
class Pending:
    """One interrupted tool call waiting for a click."""

    snapshot_id: str
    interrupt: AgentInterrupt[Any, Any]
    channel: str
    thread_ts: str
    requester: str


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name) or default
    if value is None:
        raise SystemExit(f"{name} is not set")
    return value


def build() -> AsyncApp:
    model = _env("AGENT_MODEL", "googleai/gemini-flash-latest")
    approvers = _env("APPROVER_CHANNEL")
    ai = Genkit(
        plugins=[
            GoogleAI(api_key=_env("GEMINI_API_KEY"), base_url=os.environ.get("GEMINI_API_URL"))
        ]
    )
    tools: list[Tool] = []
    for name in _env("AGENT_TOOLS", "agent.example_tools").split(","):
        tools.extend(importlib.import_module(name.strip()).register(ai))
    agent = ai.define_agent(
        name="baseline",
        model=model,
        system=SYSTEM,
        tools=tools,
        use=[ToolApproval()],
        store=InMemorySessionStore(),
    )
    pending: dict[str, Pending] = {}
    api_url = os.environ.get("SLACK_API_URL") or "https://slack.com/api/"
    client = AsyncWebClient(
        token=_env("SLACK_BOT_TOKEN"),
        base_url=api_url if api_url.endswith("/") else api_url + "/",
        # Kept-alive connections, as Greenlight's client has: the comparison is about the
        # database work, not about slack_sdk opening a connection per call by default.
        session=aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)),
    )
    app = AsyncApp(client=client, signing_secret=_env("SLACK_SIGNING_SECRET"))

    @app.event("message")
    async def on_message(body: dict[str, Any], client: AsyncWebClient) -> None:
        event = body.get("event") or {}
        if event.get("subtype") or event.get("bot_id") or event.get("channel_type") != "im":
            return
        channel, ts, user = event["channel"], event["ts"], event["user"]
        thread_ts = event.get("thread_ts") or ts
        placeholder = await client.chat_postMessage(
            channel=channel, thread_ts=thread_ts, text="_Thinking…_"
        )
        out = await agent.chat().send(str(event.get("text") or ""))
        if out.finish_reason != AgentFinishReason.INTERRUPTED:
            await client.chat_update(channel=channel, ts=placeholder["ts"], text=out.text)
            return
        for intr in out.interrupts:
            approval_id = str(uuid.uuid4())
            item = Pending(out.snapshot_id or "", intr, channel, thread_ts, user)
            pending[approval_id] = item
            await client.chat_postMessage(
                channel=approvers,
                text=f"Approval needed: {intr.name}",
                blocks=_card(intr, approval_id),
            )
        await client.chat_update(
            channel=channel, ts=placeholder["ts"], text=f"Waiting for approval in <#{approvers}>."
        )

    async def decide(ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient, ok: bool) -> None:
        await ack()
        user, action = body["user"]["id"], body["actions"][0]
        item = pending.pop(action["value"], None)  # one process: pop is the whole race
        if item is None:
            await client.chat_postEphemeral(
                channel=body["channel"]["id"], user=user, text="Already decided."
            )
            return
        verb = "Approved" if ok else "Denied"
        card_ts = body["container"]["message_ts"]  # the clicked message is the card
        await client.chat_update(
            channel=approvers, ts=card_ts, text=f"{verb} by <@{user}>", blocks=[]
        )
        chat = agent.chat(snapshot_id=item.snapshot_id)
        if ok:
            meta = {"toolApproved": True, "approval_id": action["value"]}
            out = await chat.resume(restart=[item.interrupt.restart(resumed_metadata=meta)])
        else:
            out = await chat.resume(respond=[item.interrupt.respond({"error": "denied"})])
        await client.chat_postMessage(channel=item.channel, thread_ts=item.thread_ts, text=out.text)

    @app.action("approve")
    async def on_approve(ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient) -> None:
        await decide(ack, body, client, True)

    @app.action("deny")
    async def on_deny(ack: AsyncAck, body: dict[str, Any], client: AsyncWebClient) -> None:
        await decide(ack, body, client, False)

    return app


def _card(intr: AgentInterrupt[Any, Any], approval_id: str) -> list[dict[str, Any]]:
    detail = json.dumps(intr.input, default=str)[:2900]
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{intr.name}*\n```{detail}```"}},
        {
            "type": "actions",
            "block_id": "approval",
            "elements": [
                {
                    "type": "button",
                    "action_id": "approve",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "value": approval_id,
                },
                {
                    "type": "button",
                    "action_id": "deny",
                    "text": {"type": "plain_text", "text": "Deny"},
                    "value": approval_id,
                },
            ],
        },
    ]


async def serve() -> None:
    app = build()
    runner = web.AppRunner(app.web_app(path="/slack/events"), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(os.environ.get("PORT") or 0)).start()
    log.info("Baseline is up (HTTP :%s)", runner.addresses[0][1])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if samples := os.environ.get("BENCH_PYINSTRUMENT"):  # the same profile as Greenlight's
        from pathlib import Path

        from bench.profile import Sampler

        loop.add_signal_handler(signal.SIGWINCH, Sampler(Path(samples)).toggle)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        if app.client.session is not None:
            await app.client.session.close()


def main() -> int:
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
