"""Faults at the service's edges: Slack failing while a card is posted, the bot process killed
between a decision and its resume, forged requests, and fuzzed (but signed) payloads.

Like test_e2e, effects are awaited on the fakes' conditions or polled against a deadline, never
slept for; `settle` waits for the service's own work before a test counts what did not happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
from sqlalchemy import func, select

from bot.background import WIND_DOWN
from bot.listeners.commands import CHANGING
from bot.server import Service
from storage.db import SessionFactory, make_engine, make_session_factory
from storage.domain import ApprovalState, Denied, ExecutionState, TurnState
from storage.models import (
    ApprovalRow,
    AuditRow,
    ConversationRow,
    PolicyRow,
    SeenEventRow,
    TurnRow,
)
from tests import ledger_tools
from tests.bot.conftest import (
    ADMIN,
    APPROVERS,
    DM,
    SECRET,
    SlackClient,
    approval_id_of,
    in_channel,
    new_ts,
    settle,
)
from tests.bot.test_e2e import (
    BOSS,
    REQUESTER,
    TRANSFER,
    ask,
    decided_card,
    reply_in_thread,
    text_of,
    thread_posts,
)
from tests.conftest import poll
from tests.fakes import slack_payloads as sp
from tests.fakes.gemini import FakeGemini, Reply, function_call, text
from tests.fakes.slack_api import BOT_USER_ID, FakeSlack

REPO = Path(__file__).resolve().parents[2]


def approver_posts(fake_slack: FakeSlack) -> list[Any]:
    """Every chat.postMessage attempt to the approver channel, injected failures included."""
    return [c for c in fake_slack.calls_to("chat.postMessage") if in_channel(APPROVERS)(c)]


# -- 1. Slack fails while the card is posted -------------------------------------------------


async def test_a_card_is_posted_once_through_a_500_and_a_429(
    client: SlackClient, fake_slack: FakeSlack, gemini: FakeGemini, team: str, service: Service
) -> None:
    def card_faults(_: dict[str, Any]) -> Reply:
        # Runs when the model is asked, in this process: after the placeholder was posted and
        # before the card is, so the failures hit the card's chat.postMessage and nothing else.
        fake_slack.fail_next("chat.postMessage", status=500)
        fake_slack.fail_next("chat.postMessage", status=429, retry_after=1)
        return function_call("transferMoney", TRANSFER, id="call-1")

    gemini.script(card_faults)
    ts = new_ts()
    started = time.monotonic()
    assert (await client.dm(team, REQUESTER, "send 500 to 12345", ts=ts))[0] == 200
    (card,) = await fake_slack.wait_for(
        "chat.postMessage", predicate=in_channel(APPROVERS), timeout=15
    )
    assert time.monotonic() - started >= 1.0  # the 429's Retry-After was honoured
    await fake_slack.wait_for(
        "chat.update", predicate=lambda c: in_channel(DM)(c) and "approval" in text_of(c)
    )
    attempts = approver_posts(fake_slack)
    assert [c.injected for c in attempts] == [True, True, False]  # 500, 429, posted

    approval_id = approval_id_of(card)
    assert service.deps is not None
    info = await service.deps.workflow.reads.approval(team, approval_id)
    assert info is not None and info.card is not None and info.card.ts is not None
    assert info.card.channel == APPROVERS

    gemini.script(text("Sent 500 to 12345."))
    assert (await client.click(team, BOSS, "approve", card))[0] == 200
    (update,) = await fake_slack.wait_for("chat.update", predicate=decided_card("Approved by"))
    assert update.args["ts"] == info.card.ts  # the one card there is, updated in place
    reply = await reply_in_thread(fake_slack, ts)
    assert text_of(reply) == "Sent 500 to 12345."
    await settle(service)

    assert len(approver_posts(fake_slack)) == 3  # no fourth attempt, no second card
    assert [c for c in approver_posts(fake_slack) if not c.injected] == [card]
    [entry] = ledger_tools.entries()
    assert entry["key"] == approval_id
    assert len(thread_posts(fake_slack, ts)) == 2  # the placeholder (now the note), the reply


# -- 2. Forged, tampered and replayed requests -----------------------------------------------


async def team_rows(sessions: SessionFactory, team: str, event_ids: list[str]) -> dict[str, int]:
    """Rows the team has in every table a Slack request can write to."""
    counts: dict[str, int] = {}
    async with sessions() as db:
        for model in (ConversationRow, ApprovalRow, AuditRow, PolicyRow):
            query = select(func.count()).select_from(model).where(model.team_id == team)
            counts[model.__tablename__] = await db.scalar(query) or 0
        seen = select(func.count()).where(SeenEventRow.event_id.in_(event_ids))
        counts["seen_events"] = await db.scalar(seen) or 0
    return counts


async def post_raw(
    http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str]:
    async with http.post(url, data=body, headers=headers) as response:
        return response.status, await response.text()


async def test_unsigned_tampered_and_replayed_requests_are_refused_and_change_nothing(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
) -> None:
    asked = await ask(client, fake_slack, gemini, team)
    await settle(service)
    event_id = f"Ev{team}forged"
    surfaces: dict[str, sp.Payload] = {
        "event": sp.message_im_event(team, REQUESTER, DM, "send 900", new_ts(), event_id=event_id),
        "block_actions": sp.block_actions(
            team,
            BOSS,
            APPROVERS,
            "1700000000.000100",
            "approve",
            asked.approval_id,
            "trigger-forged",
            fake_slack.response_url("forged"),
            block_id="approval",
        ),
        "view_submission": sp.view_submission(
            team,
            BOSS,
            "deny_reason",
            json.dumps({"approval_id": asked.approval_id, "channel": APPROVERS}),
            {"reason": {"reason": {"type": "plain_text_input", "value": "forged"}}},
        ),
        "slash_command": sp.slash_command(
            team,
            ADMIN,
            "/approvals",
            "allow transferMoney",
            "C0GENERAL",
            fake_slack.response_url("forged"),
            "trigger-forged",
        ),
    }
    before = await team_rows(bot_sessions, team, [event_id])
    slack_calls, model_calls = len(fake_slack.calls), len(gemini.requests)

    stale = int(time.time()) - 5 * 60 - 30
    for name, (body, content_type) in surfaces.items():
        # The body changed after signing, keeping its meaning: JSON and forms both ignore it.
        tampered = body + (b" " if content_type == sp.JSON_CT else b"&")
        attempts = {
            "unsigned": (body, {"Content-Type": content_type}),
            "tampered": (tampered, sp.signed_headers(SECRET, body, content_type=content_type)),
            "replayed": (
                body,
                sp.signed_headers(SECRET, body, timestamp=stale, content_type=content_type),
            ),
        }
        for kind, (sent, headers) in attempts.items():
            status, answer = await post_raw(client.http, client.url, sent, headers)
            assert status == 401, f"{kind} {name}: {status} {answer[:200]}"
    # Bolt parses a body before it checks its signature: bodies it cannot parse, and a
    # timestamp that is not a number, are refused the same way (they used to be 500s).
    unreadable = [
        (b"payload=not-json", sp.FORM_CT),
        (b"[1, 2]", sp.JSON_CT),
        (b'{"authorizations": "x"}', sp.JSON_CT),
        (b"\xff\xfe", sp.FORM_CT),
    ]
    for body, content_type in unreadable:
        for headers in (
            {"Content-Type": content_type},
            sp.signed_headers(SECRET, b"{}", content_type=content_type),
            {"Content-Type": content_type, "X-Slack-Request-Timestamp": "soon"}
            | {"X-Slack-Signature": "v0=" + "0" * 64},
        ):
            status, answer = await post_raw(client.http, client.url, body, headers)
            assert status == 401, f"{body!r} {headers}: {status} {answer[:200]}"

    await settle(service)
    assert len(fake_slack.calls) == slack_calls and len(gemini.requests) == model_calls
    assert await team_rows(bot_sessions, team, [event_id]) == before
    assert service.deps is not None
    info = await service.deps.workflow.reads.approval(team, asked.approval_id)
    assert info is not None and info.state == ApprovalState.PENDING
    assert ledger_tools.entries() == []

    # The same requests, signed as Slack signs them, do act: what was refused was the forgery.
    assert (await client.send(surfaces["slash_command"]))[0] == 200
    [answered] = await fake_slack.wait_for(
        "response_url:forged", predicate=lambda c: "text" in c.args
    )
    answer = str(answered.args["text"])
    assert answer.startswith("Done.") and "runs freely" in answer
    gemini.script(text("Sent."))
    assert (await client.send(surfaces["block_actions"]))[0] == 200
    assert text_of(await reply_in_thread(fake_slack, asked.thread_ts)) == "Sent."
    await settle(service)
    assert len(ledger_tools.entries()) == 1


# -- 3. The bot process is killed between a decision and its resume --------------------------

START_TIMEOUT = 60.0  # a cold `python -m bot` imports Genkit; generous for a loaded machine
RECOVERY_TIMEOUT = 60.0
EXIT_TIMEOUT = 30.0
# The waits these tests prove, set short so they are not sat out: the defaults (a 15 s lease,
# a 5 s sweep, a 25 s grace) are what `python -m bench --only recovery` measures. The lease
# still outlasts any stall of a loaded machine between its renewals (every third of it).
LEASE = 4.0
SWEEP = 1.0
GRACE = 1.0
FAST_RECOVERY = {
    "RESUME_LEASE_SECONDS": str(LEASE),
    "RECOVERY_INTERVAL_SECONDS": str(SWEEP),
    "SHUTDOWN_GRACE_SECONDS": str(GRACE),
}
# From the replacement's /healthz being 200 to the turn's reply in the thread, as the README
# promises on default settings (30 s = lease + sweep + 10; 10 s), on these: after a SIGKILL,
# the dead lease and a sweep; after a SIGTERM whose grace ran out, the start-up sweep at once.
AFTER_KILL = LEASE + SWEEP + 10.0
AFTER_STOP = 10.0
STOP_TIMEOUT = GRACE + WIND_DOWN + 15.0  # the grace, the wind-down, closing
UP = re.compile(rb"Greenlight is up \(HTTP; /healthz and /metrics on :(\d+)\)")


@dataclass
class BotProcess:
    """`python -m bot`, as an operator runs it, against the fakes and the bot-test database."""

    proc: asyncio.subprocess.Process
    log: Path
    port: int | None = None  # the one it chose (PORT=0), from its start-up line

    @property
    def url(self) -> str:
        assert self.port is not None, "wait_healthy first"
        return f"http://127.0.0.1:{self.port}/slack/events"

    def output(self) -> str:
        return f"bot output ({self.log.name}):\n" + self.log.read_text(errors="replace")[-6000:]

    async def wait_healthy(self, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                pytest.fail(f"the bot exited ({self.proc.returncode}) on start\n{self.output()}")
            if self.port is None and (up := UP.search(self.log.read_bytes())):
                self.port = int(up.group(1))
            if self.port is not None:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    health = f"http://127.0.0.1:{self.port}/healthz"
                    timeout = aiohttp.ClientTimeout(total=2)
                    async with http.get(health, timeout=timeout) as response:
                        if response.status == 200:
                            return
            await asyncio.sleep(0.1)  # poll until the deadline
        pytest.fail(f"/healthz was not 200 within {START_TIMEOUT}s\n{self.output()}")

    async def stop(self, sig: signal.Signals = signal.SIGKILL, within: float = EXIT_TIMEOUT) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        return await asyncio.wait_for(self.proc.wait(), within)


@contextlib.asynccontextmanager
async def bot_process(
    name: str,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    database: str | None,
    tmp: Path,
    cwd: Path | str = REPO,  # str: so that **settings (str values) type-checks
    **settings: str,
) -> AsyncIterator[BotProcess]:
    """`settings`: more environment variables (LOG_FORMAT="json", say); `database` None: unset
    (the embedded default, in `cwd`). It listens on a port of its own choosing (PORT=0): one
    picked here could be taken by then, tests running in parallel."""
    env = dict(os.environ)
    env.pop("GENKIT_ENV", None)  # no Genkit reflection server in the bot
    for setting in ("RESUME_LEASE_SECONDS", "RECOVERY_INTERVAL_SECONDS", "TOOL_TIMEOUT_SECONDS"):
        env.pop(setting, None)  # the defaults, unless a test sets them
    env.update(
        SLACK_BOT_TOKEN="xoxb-test",
        SLACK_SIGNING_SECRET=SECRET,
        SLACK_API_URL=fake_slack.base_url,
        GEMINI_API_KEY="k",
        GEMINI_API_URL=gemini.base_url,
        DATABASE_URL=database or "",
        PORT="0",
        AGENT_TOOLS="tests.ledger_tools",
        APPROVER_CHANNEL=APPROVERS,
        GREENLIGHT_TEST_LEDGER=str(ledger_tools.ledger_path()),
        PYTHONPATH=str(REPO),
        **settings,
    )
    log = tmp / f"bot-{name}.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=str(cwd),
        )
    bot = BotProcess(proc, log)
    try:
        yield bot
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def approved_while_answering(
    http: aiohttp.ClientSession,
    bot: BotProcess,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    ts: str,
) -> tuple[str, dict[str, Any]]:
    """A transfer asked for in `ts`, approved; returns once the tool ran and the model is
    answering (slowly: gemini's script says so). (approval id, the tool's output)."""
    dm = sp.message_im_event(team, REQUESTER, DM, "send 500 to 12345", ts)
    assert (await sp.post_signed(http, bot.url, SECRET, *dm))[0] == 200
    (card,) = await fake_slack.wait_for(
        "chat.postMessage", predicate=in_channel(APPROVERS), timeout=30
    )
    approval_id = approval_id_of(card)
    click = sp.block_actions(
        team,
        BOSS,
        APPROVERS,
        "1700000000.000100",
        "approve",
        approval_id,
        "trigger-1",
        fake_slack.response_url("click"),
        block_id="approval",
        message_blocks=card.args.get("blocks"),
    )
    assert (await sp.post_signed(http, bot.url, SECRET, *click))[0] == 200
    # The tool ran and its result went to the model, which is still answering.
    await poll(lambda: len(ledger_tools.entries()) == 1, "the tool's ledger entry")
    await poll(lambda: len(gemini.generate_requests()) == 2, "the model call after")
    return approval_id, {"success": True, "transactionId": f"txn-{approval_id}"}


async def recovered_within(
    limit: float, http: aiohttp.ClientSession, bot: BotProcess, fake_slack: FakeSlack, ts: str
) -> float:
    """Seconds from `bot` being up (/healthz 200) to the turn's reply in the thread."""
    await bot.wait_healthy(http)
    up = time.monotonic()
    reply = await reply_in_thread(fake_slack, ts, timeout=RECOVERY_TIMEOUT)
    took = time.monotonic() - up
    assert text_of(reply) == "Sent 500 to 12345."
    assert took <= limit, f"recovered {took:.1f}s after the new process was up\n{bot.output()}"
    await fake_slack.wait_for("chat.update", predicate=decided_card("Ran."))
    return took


async def check_resumed_once(
    gemini: FakeGemini, fake_slack: FakeSlack, ts: str, approval_id: str, output: Any
) -> None:
    """Checked once no process is left that could still act."""
    [entry] = ledger_tools.entries()  # the tool never ran again
    assert entry["key"] == approval_id
    responses = gemini.function_responses()
    ref = responses[0]["id"]  # Greenlight's own, not the model's "call-1"
    answered: dict[str, Any] = {"id": ref, "name": "transferMoney"}
    answered["response"] = {"name": "transferMoney", "content": output}
    # The first process's model call and the recovery's both carry the one recorded output.
    assert responses == [answered, answered] and ref != "call-1"
    assert len(gemini.generate_requests()) == 3 and gemini.pending == 0
    assert len(thread_posts(fake_slack, ts)) == 2  # the placeholder, exactly one reply


async def test_a_bot_killed_after_the_tool_ran_resumes_once_in_the_next_process(
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    ledger: Path,
    bot_database: str,
    tmp_path: Path,
) -> None:
    """The dead process's lease (RESUME_LEASE_SECONDS, renewed every third of it) runs out,
    and the next sweep (RECOVERY_INTERVAL_SECONDS) resumes the turn, within AFTER_KILL of the
    new process."""
    gemini.script(
        function_call("transferMoney", TRANSFER, id="call-1"),
        text("Sent (first process).", delay=60),  # still thinking when it is killed
        text("Sent 500 to 12345."),
    )
    engine = make_engine(bot_database)
    sessions = make_session_factory(engine)
    ts = new_ts()
    try:
        async with aiohttp.ClientSession() as http:
            async with bot_process(
                "first", fake_slack, gemini, bot_database, tmp_path, **FAST_RECOVERY
            ) as first:
                await first.wait_healthy(http)
                approval_id, output = await approved_while_answering(
                    http, first, fake_slack, gemini, team, ts
                )
                async with sessions() as db:
                    row = await db.get_one(ApprovalRow, approval_id)
                    assert (row.execution, row.output) == (ExecutionState.FINISHED, output)
                assert await first.stop(signal.SIGKILL) == -signal.SIGKILL
            assert len(thread_posts(fake_slack, ts)) == 1  # just the placeholder: no reply yet

            async with bot_process(
                "second", fake_slack, gemini, bot_database, tmp_path, **FAST_RECOVERY
            ) as second:
                await recovered_within(AFTER_KILL, http, second, fake_slack, ts)
                assert await second.stop(signal.SIGTERM) == 0, second.output()
            log = second.output()

        await check_resumed_once(gemini, fake_slack, ts, approval_id, output)
        async with sessions() as db:
            turn = await db.get_one(TurnRow, row.turn_id)
            assert turn.state == TurnState.DONE and turn.attempts == 2  # killed, then recovered
        assert "recovery sweep resumed 1 turn" in log and "Traceback" not in log, log
    finally:
        await engine.dispose()


async def test_a_bot_stopped_while_the_model_answers_hands_the_turn_to_the_next_process(
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    ledger: Path,
    bot_database: str,
    tmp_path: Path,
) -> None:
    """SIGTERM: the resume gets SHUTDOWN_GRACE_SECONDS, then is cut off and let go of
    (LET_GO), so the new process's start-up sweep resumes it at once, within AFTER_STOP of it
    being up."""
    gemini.script(
        function_call("transferMoney", TRANSFER, id="call-1"),
        text("Sent (first process).", delay=GRACE + 60),  # outlasts the grace
        text("Sent 500 to 12345."),
    )
    engine = make_engine(bot_database)
    sessions = make_session_factory(engine)
    ts = new_ts()
    try:
        async with aiohttp.ClientSession() as http:
            async with bot_process(
                "first", fake_slack, gemini, bot_database, tmp_path, **FAST_RECOVERY
            ) as first:
                await first.wait_healthy(http)
                approval_id, output = await approved_while_answering(
                    http, first, fake_slack, gemini, team, ts
                )
                assert await first.stop(signal.SIGTERM, STOP_TIMEOUT) == 0, first.output()
                assert "shutdown cut off 1 turns" in first.output(), first.output()
            async with sessions() as db:
                row = await db.get_one(ApprovalRow, approval_id)
                turn = await db.get_one(TurnRow, row.turn_id)
                assert (turn.state, turn.lease_until) == (TurnState.WAITING, None)  # let go

            async with bot_process(
                "second", fake_slack, gemini, bot_database, tmp_path, **FAST_RECOVERY
            ) as second:
                await recovered_within(AFTER_STOP, http, second, fake_slack, ts)
                assert await second.stop(signal.SIGTERM) == 0, second.output()

        await check_resumed_once(gemini, fake_slack, ts, approval_id, output)
        async with sessions() as db:
            turn = await db.get_one(TurnRow, row.turn_id)
            assert turn.state == TurnState.DONE and turn.attempts == 2
    finally:
        await engine.dispose()


# -- 4. Fuzzed payloads, correctly signed ----------------------------------------------------
#
# Each test mutates a realistic payload: fields the bot reads are deleted or replaced by wrong
# types, nested garbage, huge or unusual strings. Signed, they pass Bolt's check and reach the
# listeners. Whatever comes in: never a 5xx, never a traceback in the answer, the service stays
# healthy, and input that fails validation changes nothing. The one pending approval of the
# fixture may be approved only by BOSS, whom no example is, so no click or submission may
# decide it; the model only ever answers with text, so no message may ask for an approval.

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples every run: a failure here is reproducible
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
Path_ = tuple[str | int, ...]


class Missing:
    """A mutation that deletes the field."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING = Missing()
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
garbage = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3)
    ),
    max_leaves=8,
)
huge = st.builds(
    lambda piece, n: piece * n,
    st.sampled_from(["x", "é", "😀", "<!channel> ", "\u202e", "\\", '"', "\n"]),
    st.integers(3_000, 20_000),  # the largest stay under aiohttp's 1 MiB once escaped
)


def field(*plausible: Any) -> st.SearchStrategy[Any]:
    """What a fuzzed field becomes: deleted, a plausible value, garbage, huge, any text."""
    options: list[st.SearchStrategy[Any]] = [st.just(MISSING), garbage, huge, st.text(max_size=40)]
    if plausible:
        options.insert(1, st.sampled_from(plausible))
    return st.one_of(options)


def mutations(fields: dict[Path_, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[Path_, Any]]:
    """One to three fields changed: enough to combine faults, few enough to reach listeners."""
    paths = st.lists(st.sampled_from(sorted(fields, key=repr)), min_size=1, max_size=3, unique=True)
    return paths.flatmap(lambda chosen: st.fixed_dictionaries({p: fields[p] for p in chosen}))


def mutate(data: dict[str, Any], changes: dict[Path_, Any]) -> dict[str, Any]:
    """Apply changes outermost first; a path through a field already made garbage is skipped."""
    for path, value in sorted(changes.items(), key=lambda kv: len(kv[0])):
        target: Any = data
        for key in path[:-1]:
            target = _child(target, key)
        last = path[-1]
        if isinstance(target, dict) and isinstance(last, str):
            if isinstance(value, Missing):
                target.pop(last, None)
            else:
                target[last] = value
        elif isinstance(target, list) and isinstance(last, int) and last < len(target):
            if isinstance(value, Missing):
                del target[last]
            else:
                target[last] = value
    return data


def _child(node: Any, key: str | int) -> Any:
    if isinstance(node, dict) and isinstance(key, str):
        return node.get(key)
    if isinstance(node, list) and isinstance(key, int) and key < len(node):
        return node[key]
    return None


def signed(body: bytes, content_type: str) -> dict[str, str]:
    """Slack's headers for any bytes (slack_sdk's signer only takes UTF-8)."""
    timestamp = str(int(time.time()))
    base = b"v0:" + timestamp.encode() + b":" + body
    signature = "v0=" + hmac.new(SECRET.encode(), base, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": signature,
        "Content-Type": content_type,
    }


@dataclass
class Snapshot:
    approvals: int
    audit_events: int
    tool_policies: int
    cards: int
    pending: ApprovalState | None


@dataclass
class Fuzz:
    """A running service with one pending approval that only BOSS may decide."""

    client: SlackClient
    service: Service
    sessions: SessionFactory
    slack: FakeSlack
    gemini: FakeGemini
    team: str
    approval_id: str
    thread_ts: str
    statuses: Counter[int] = dataclass_field(default_factory=Counter)

    async def snapshot(self) -> Snapshot:
        async with self.sessions() as db:
            approvals, audit_events, tool_policies = [
                await db.scalar(select(func.count()).select_from(model)) or 0
                for model in (ApprovalRow, AuditRow, PolicyRow)
            ]
            query = select(ApprovalRow.status).where(ApprovalRow.id == self.approval_id)
            status = await db.scalar(query)
        cards = len([c for c in approver_posts(self.slack) if not c.injected])
        return Snapshot(approvals, audit_events, tool_policies, cards, status)

    async def conversations(self) -> int:
        async with self.sessions() as db:
            return await db.scalar(select(func.count()).select_from(ConversationRow)) or 0

    async def send(self, body: bytes, content_type: str, *, may_change: bool = False) -> str:
        """Post signed; check the answer, the service's health and (unless allowed) no change."""
        before = await self.snapshot()
        status, answer = await post_raw(
            self.client.http, self.client.url, body, signed(body, content_type)
        )
        self.statuses[status] += 1
        assert status < 500, f"{status} for {body[:300]!r}: {answer[:300]}"
        assert "Traceback" not in answer, answer
        await settle(self.service)
        if not may_change:
            assert await self.snapshot() == before, body[:500]
        assert await self.client.get("/healthz") == (200, {"ok": True})
        return answer


@pytest.fixture
async def fuzz(
    request: pytest.FixtureRequest,
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    bot_sessions: SessionFactory,
) -> AsyncIterator[Fuzz]:
    _, body = await client.command(team, ADMIN, "approvers transferMoney <@UBOSS>")
    assert body.startswith("Done.")
    asked = await ask(client, fake_slack, gemini, team)
    await settle(service)
    gemini.script(*[text("ok")] * 500)  # any message a fuzzed event gets through is answered
    fuzz = Fuzz(
        client, service, bot_sessions, fake_slack, gemini, team, asked.approval_id, asked.thread_ts
    )
    yield fuzz
    total = sum(fuzz.statuses.values())
    if request.node.name != "test_fuzzed_raw_bodies" and total >= FUZZ.max_examples:
        # Guard against fuzzing that only ever knocks on the door (404s, 400s): a third of
        # the examples at least must have been read by a listener.
        assert fuzz.statuses[200] * 3 >= total, f"few examples reached a listener: {fuzz.statuses}"


# Identifiers a fuzzed field may take, besides garbage: real ones, near misses, oversized ones.
TEAMS = ("", "T0000TEAM", "T" + "X" * 40, "T\x00", "t0000team")
USERS = ("", REQUESTER, "UOTHER", ADMIN, BOT_USER_ID, "U" + "9" * 40, "U\x00", "UBOSS ")  # not BOSS
CHANNELS = ("", DM, "C0GENERAL", "D" + "1" * 40, "D\x00")  # not APPROVERS: may be talked in
TS = ("", "1600000000.999999", "not-a-ts", "1" * 40, "1600000000.000001\x00")

EVENT_FIELDS: dict[Path_, st.SearchStrategy[Any]] = {
    ("type",): field("event_callback", "url_verification", "block_actions"),
    ("team_id",): field(*TEAMS),
    ("event_id",): field("", "Ev0", "Ev" + "0" * 80),
    ("authorizations",): field([]),
    ("event",): field({}),
    ("event", "type"): field("message", "app_mention", "reaction_added"),
    ("event", "user"): field(*USERS),
    ("event", "text"): field("", "hi", f"<@{BOT_USER_ID}> hi", "<!channel>"),
    ("event", "channel"): field(*CHANNELS),
    ("event", "channel_type"): field("im", "channel", "group"),
    ("event", "ts"): field(*TS),
    ("event", "thread_ts"): field(*TS),
    ("event", "subtype"): field("message_changed", "bot_message", ""),
    ("event", "bot_id"): field("B0000BOT", ""),
    ("event", "blocks"): field([]),
}


@FUZZ
@given(changes=mutations(EVENT_FIELDS), mention=st.booleans())
@example(changes={("event", "ts"): "1" * 40}, mention=False)
@example(changes={("event", "channel"): "D\x00"}, mention=False)
@example(changes={("team_id",): "T\x00", ("authorizations",): []}, mention=True)
async def test_fuzzed_events(fuzz: Fuzz, changes: dict[Path_, Any], mention: bool) -> None:
    build = sp.app_mention_event if mention else sp.message_im_event
    channel = "C0GENERAL" if mention else DM
    base = build(fuzz.team, REQUESTER, channel, f"<@{BOT_USER_ID}> hello", new_ts())
    body = mutate(json.loads(base.body), changes)
    event = body.get("event")
    unusable = not isinstance(event, dict) or not isinstance(event.get("user"), str)
    calls, asked, conversations = len(fuzz.slack.calls), len(fuzz.gemini.requests), None
    if unusable:
        conversations = await fuzz.conversations()
    await fuzz.send(json.dumps(body).encode(), sp.JSON_CT)
    if unusable:  # no user, no turn: nothing posted, nothing asked, nothing recorded
        assert len(fuzz.slack.calls) == calls and len(fuzz.gemini.requests) == asked
        assert await fuzz.conversations() == conversations


ACTION_FIELDS: dict[Path_, st.SearchStrategy[Any]] = {
    ("type",): field("block_actions", "view_submission", "interactive_message"),
    ("user",): field({}),
    ("user", "id"): field(*USERS),
    ("user", "team_id"): field(*TEAMS),
    ("team",): field({}, None),
    ("team", "id"): field(*TEAMS),
    ("channel",): field({}, None),
    ("channel", "id"): field(APPROVERS, *CHANNELS),
    ("trigger_id",): field("trigger-1"),
    ("container",): field({}),
    ("message",): field({}),
    ("actions",): field([], [{}]),
    ("actions", 0): field({"action_id": "approve"}, {"value": "x"}),
    ("actions", 0, "action_id"): field("approve", "deny", "approve "),
    ("actions", 0, "value"): field("0" * 36, "../../etc/passwd", "' OR 1=1 --", "A" * 2000),
    ("actions", 0, "block_id"): field("approval"),
}


@FUZZ
@given(changes=mutations(ACTION_FIELDS), action=st.sampled_from(["approve", "deny"]))
@example(changes={("team", "id"): "T\x00"}, action="deny")
@example(changes={("user", "id"): "U" + "9" * 40}, action="approve")
async def test_fuzzed_button_clicks(fuzz: Fuzz, changes: dict[Path_, Any], action: str) -> None:
    base = sp.block_actions(
        fuzz.team,
        "UOTHER",
        APPROVERS,
        "1700000000.000100",
        action,
        fuzz.approval_id,
        "trigger-1",
        fuzz.slack.response_url("fuzz"),
        block_id="approval",
    )
    payload = mutate(json.loads(_form_payload(base)), changes)
    await fuzz.send(urlencode({"payload": json.dumps(payload)}).encode(), sp.FORM_CT)


def _form_payload(payload: sp.Payload) -> str:
    return parse_qs(payload.body.decode())["payload"][0]


APPROVAL = "<the pending approval's id>"  # put in by the test: examples are made up front
OURS = json.dumps({"approval_id": APPROVAL, "channel": APPROVERS})
metadata = field(
    OURS,
    json.dumps({"approval_id": APPROVAL}),
    json.dumps({"approval_id": APPROVAL, "channel": ["C1"]}),
    json.dumps({"approval_id": 7}),
    json.dumps([APPROVAL]),
    OURS[:-1],
    "null",
    "{}",
) | garbage.map(json.dumps)


VIEW_FIELDS: dict[Path_, st.SearchStrategy[Any]] = {
    ("type",): field("view_submission", "view_closed", "block_actions"),
    ("user",): field({}),
    ("user", "id"): field(*USERS),
    ("user", "team_id"): field(*TEAMS),
    ("team",): field({}, None),
    ("team", "id"): field(*TEAMS),
    ("view",): field({}),
    ("view", "callback_id"): field("deny_reason", "deny_reason2"),
    ("view", "state"): field({}, {"values": []}),
    ("view", "state", "values"): field({}, {"reason": []}),
    ("view", "state", "values", "reason"): field({}, {"reason": "x"}),
    ("view", "state", "values", "reason", "reason"): field({}, {"value": None}),
    ("view", "state", "values", "reason", "reason", "value"): field("", " ", "no"),
}


@FUZZ
@given(changes=mutations(VIEW_FIELDS), meta=metadata)
@example(changes={("team", "id"): "T\x00"}, meta=OURS)
@example(changes={("user", "id"): "U" + "9" * 40}, meta=OURS)
async def test_fuzzed_modal_submissions(fuzz: Fuzz, changes: dict[Path_, Any], meta: Any) -> None:
    if isinstance(meta, str):
        meta = meta.replace(APPROVAL, fuzz.approval_id)
    base = sp.view_submission(
        fuzz.team,
        "UOTHER",
        "deny_reason",
        json.dumps({"approval_id": fuzz.approval_id, "channel": APPROVERS}),
        {"reason": {"reason": {"type": "plain_text_input", "value": "no"}}},
    )
    payload = mutate(
        json.loads(_form_payload(base)), {**changes, ("view", "private_metadata"): meta}
    )
    await fuzz.send(urlencode({"payload": json.dumps(payload)}).encode(), sp.FORM_CT)


WORDS = (
    "allow",
    "require",
    "route",
    "approvers",
    "timeout",
    "list",
    "pending",
    "audit",
    "help",
    "ALLOW",
    "transferMoney",
    "getBalance",
    "launchRockets",
    "<#C0APPROVE|approvals>",
    "C0APPROVE",
    "<#D123>",
    "<@UBOSS|boss>",
    "<@UBOSS",
    "<!subteam^S1|team>",
    "<!channel>",
    "channel",
    "4h",
    "0m",
    "31d",
    "99999999999999999999d",
    "-5h",
    "1e9s",
)
command_text = st.one_of(
    st.lists(st.sampled_from(WORDS) | st.text(max_size=12), max_size=6).map(" ".join),
    st.text(max_size=200),
    huge,
)


def form_field(*plausible: str) -> st.SearchStrategy[Any]:
    """Forms carry only strings: a field is missing, plausible, any text or huge."""
    return st.one_of(st.just(MISSING), st.sampled_from(plausible), st.text(max_size=40), huge)


COMMAND_FIELDS: dict[Path_, st.SearchStrategy[Any]] = {
    ("team_id",): form_field(*TEAMS),
    ("user_id",): form_field(*USERS),
    ("command",): form_field("/approvals", "/other", "approvals"),
    ("channel_id",): form_field(*CHANNELS),
    ("response_url",): form_field("http://127.0.0.1:1/nowhere", "not a url"),
    ("trigger_id",): form_field(""),
    ("text",): st.just(MISSING) | command_text,
}


@FUZZ
@given(changes=mutations(COMMAND_FIELDS))
@example(changes={("user_id",): ADMIN, ("text",): "timeout transferMoney 99999999999999999999d"})
@example(changes={("user_id",): ADMIN, ("team_id",): "T" + "X" * 40, ("text",): "allow getBalance"})
@example(changes={("team_id",): "T\x00", ("text",): "list"})
@example(changes={("user_id",): "U\x00", ("text",): "allow getBalance"})
async def test_fuzzed_slash_commands(fuzz: Fuzz, changes: dict[Path_, Any]) -> None:
    base = sp.slash_command(
        fuzz.team,
        REQUESTER,
        "/approvals",
        "list",
        "C0GENERAL",
        fuzz.slack.response_url("fuzz"),
        "trigger-1",
    )
    form = mutate(dict(parse_qsl(base.body.decode())), changes)
    words = str(form.get("text", "")).split()
    # Only an admin's changing subcommand may change anything; anyone else's must not.
    admin_change = form.get("user_id") == ADMIN and bool(words) and words[0].lower() in CHANGING
    await fuzz.send(urlencode(form).encode(), sp.FORM_CT, may_change=admin_change)


raw_bodies = st.one_of(
    st.dictionaries(st.text(max_size=20), st.text(max_size=50) | huge, max_size=6).map(
        lambda d: (urlencode(d).encode(), sp.FORM_CT)
    ),
    st.dictionaries(
        st.sampled_from(["payload", "command", "type", "team_id", "user_id", "text"]),
        st.text(max_size=50) | garbage.map(json.dumps),
        max_size=4,
    ).map(lambda d: (urlencode(d).encode(), sp.FORM_CT)),
    garbage.map(lambda g: (json.dumps(g).encode(), sp.JSON_CT)),
    st.binary(max_size=200).map(lambda b: (b, sp.FORM_CT)),
    st.binary(max_size=200).map(lambda b: (b, sp.JSON_CT)),
    st.text(max_size=200).map(lambda t: (t.encode(), "text/plain")),
)


@FUZZ
@given(raw=raw_bodies)
async def test_fuzzed_raw_bodies(fuzz: Fuzz, raw: tuple[bytes, str]) -> None:
    await fuzz.send(*raw)


@settings(FUZZ, max_examples=10)
@given(reason=st.text() | huge)
@example(reason="\x00 not\x00 today \x00")
@example(reason=" " * 600)
@example(reason="<!channel> <@U123> " * 200)
async def test_fuzzed_deny_reasons_are_recorded_clipped_and_escaped(
    client: SlackClient,
    fake_slack: FakeSlack,
    gemini: FakeGemini,
    team: str,
    service: Service,
    reason: str,
) -> None:
    """The one free text an approver types: whatever it is, the denial is recorded."""
    assert service.deps is not None
    cards = len(approver_posts(fake_slack))
    gemini.script(function_call("transferMoney", TRANSFER, id="call-1"))
    ts = new_ts()
    await client.dm(team, REQUESTER, "send 500 to 12345", ts=ts)
    card = (await fake_slack.wait_for("chat.postMessage", cards + 1, 10, in_channel(APPROVERS)))[-1]
    views = len(fake_slack.calls_to("views.open"))
    assert (await client.click(team, BOSS, "deny", card))[0] == 200
    opened = (await fake_slack.wait_for("views.open", views + 1))[-1]

    gemini.script(text("Not sent."))
    values = {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}
    assert await client.submit(team, BOSS, opened.args["view"], values) == (200, "")
    reply = await reply_in_thread(fake_slack, ts)
    assert text_of(reply) == "Not sent."
    await settle(service)

    expected = reason.replace("\x00", "").strip()[:500] or None
    info = await service.deps.workflow.reads.approval(team, approval_id_of(card))
    assert info is not None and isinstance(info.decision, Denied)
    assert info.decision.reason == expected
    error = "denied by UBOSS" + (f": {expected}" if expected else "")
    assert gemini.function_responses()[-1]["response"]["content"] == {"ok": False, "error": error}
    assert info.card is not None
    shown = json.dumps(fake_slack.messages[str(info.card.ts)]["blocks"])
    assert "<!channel>" not in shown and "<@U123>" not in shown
    assert ledger_tools.entries() == []
