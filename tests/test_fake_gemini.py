"""The real genkit-google-genai plugin against FakeGemini.

These prove the double speaks the wire format the plugin really uses (SSE streaming, function
call ids, error bodies, model listing), and pin two plugin behaviours the bot must work around.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from genkit import FinishReason
from genkit.exp import AgentError, AgentFinishReason, Genkit, InMemorySessionStore
from genkit_google_genai import GoogleAI
from genkit_middleware import ToolApproval
from pydantic import BaseModel

from agent.gemini import gemini_plugin
from tests.fakes.gemini import FakeGemini, call, calls, error, function_call, text

MODEL = "googleai/gemini-flash-latest"


class Query(BaseModel):
    q: str


class Bot:
    """A Genkit app with one tool that records its runs."""

    def __init__(self, plugin: GoogleAI, *, gated: bool = False) -> None:
        self.ai = Genkit(plugins=[plugin])
        self.runs: list[str] = []

        @self.ai.tool()
        async def lookup(query: Query) -> str:
            """Look something up."""
            self.runs.append(query.q)
            return f"found {query.q}"

        self.agent = self.ai.define_agent(
            name="bot",
            model=MODEL,
            tools=[lookup],
            use=[ToolApproval(allowed_tools=[])] if gated else None,
            store=InMemorySessionStore(),
        )


@pytest.fixture
async def gemini() -> AsyncIterator[FakeGemini]:
    async with FakeGemini() as fake:
        yield fake


def stock(gemini: FakeGemini) -> GoogleAI:
    return GoogleAI(api_key="test-key", base_url=gemini.base_url)


@pytest.mark.asyncio
async def test_streamed_text_reaches_send(gemini: FakeGemini) -> None:
    bot = Bot(stock(gemini))
    gemini.script(text("Hel", "lo"))

    reply = await bot.agent.chat().send("hi")

    assert reply.text == "Hello"
    post = gemini.generate_requests()[-1]
    assert post.path == "/v1beta/models/gemini-flash-latest:streamGenerateContent"
    assert post.query == {"alt": "sse"}
    assert post.api_key == "test-key"
    assert post.json is not None and post.json["contents"][-1]["parts"] == [{"text": "hi"}]
    assert len(gemini.listing_requests()) == 2  # the stock plugin pages through the listing


@pytest.mark.asyncio
async def test_stream_chunks_arrive_separately(gemini: FakeGemini) -> None:
    bot = Bot(stock(gemini))
    gemini.script(text("Hel", "lo"))

    turn = bot.agent.chat().send_stream("hi")
    pieces = [chunk.text async for chunk in turn.stream if chunk.text]

    assert pieces == ["Hel", "lo"]
    assert (await turn.response).text == "Hello"


@pytest.mark.asyncio
async def test_interrupted_call_resumes_with_same_id(gemini: FakeGemini) -> None:
    bot = Bot(stock(gemini), gated=True)
    gemini.script(function_call("lookup", {"q": "x"}, id="call-7"), text("done"))
    chat = bot.agent.chat()

    out = await chat.send("look x up")
    assert out.finish_reason == AgentFinishReason.INTERRUPTED
    assert [(i.name, i.ref, i.input) for i in out.interrupts] == [("lookup", "call-7", {"q": "x"})]
    assert bot.runs == []

    approved = [i.restart(resumed_metadata={"tool_approved": True}) for i in out.interrupts]
    reply = await chat.resume(restart=approved)

    assert reply.text == "done"
    assert bot.runs == ["x"]
    assert gemini.function_responses() == [
        {"id": "call-7", "name": "lookup", "response": {"name": "lookup", "content": "found x"}}
    ]
    history = gemini.generate_requests()[-1].json
    assert history is not None
    assert history["contents"][-2]["parts"][0]["functionCall"]["id"] == "call-7"


@pytest.mark.asyncio
async def test_error_reply_raises_and_next_call_works(gemini: FakeGemini) -> None:
    bot = Bot(stock(gemini))
    gemini.script(error(503, "overloaded"), text("ok"))
    chat = bot.agent.chat()

    with pytest.raises(AgentError) as failed:
        await chat.send("hi")
    assert (failed.value.status, failed.value.message) == ("UNAVAILABLE", "overloaded")

    assert (await chat.send("again")).text == "ok"


@pytest.mark.asyncio
async def test_stock_plugin_caches_a_failed_listing(gemini: FakeGemini) -> None:
    """Pins the hazard: if this starts failing, Genkit retries init and the fix may go."""
    bot = Bot(stock(gemini))
    gemini.fail_listing(times=1)
    gemini.script(text("never sent"))

    for _ in range(2):  # the fake has recovered before the second call, in the same loop
        with pytest.raises(AgentError, match="model listing is failing"):
            await bot.agent.chat().send("hi")

    assert len(gemini.listing_requests()) == 1
    assert gemini.generate_requests() == []


@pytest.mark.asyncio
async def test_no_listing_plugin_recovers_in_the_same_loop(gemini: FakeGemini) -> None:
    bot = Bot(gemini_plugin("test-key", gemini.base_url))
    gemini.fail_listing(times=1000)  # the listing never works again
    gemini.script(error(503, "down"), text("back"))

    with pytest.raises(AgentError, match="down"):
        await bot.agent.chat().send("hi")
    assert (await bot.agent.chat().send("hi")).text == "back"

    assert gemini.listing_requests() == []


@pytest.mark.asyncio
async def test_same_name_calls_without_ids(gemini: FakeGemini) -> None:
    """Pins Genkit's (name, ref) matching: without ids, two calls to one tool collide."""
    free = Bot(stock(gemini))
    two = calls([call("lookup", {"q": "a"}), call("lookup", {"q": "b"})])
    gemini.script(two, text("done"))
    assert (await free.agent.chat().send("both")).text == "done"
    assert free.runs == ["a", "b"]  # run directly, results go back in order, without ids
    assert [r.get("id") for r in gemini.function_responses()] == [None, None]

    gated = Bot(stock(gemini), gated=True)
    gemini.script(two, text("answered"))
    chat = gated.agent.chat()
    out = await chat.send("both")
    assert [i.ref for i in out.interrupts] == [None, None]
    with pytest.raises(AgentError, match="modified inputs"):
        await chat.resume(
            restart=[i.restart(resumed_metadata={"tool_approved": True}) for i in out.interrupts]
        )
    assert gated.runs == []

    await chat.resume(respond=[i.respond(f"answer {i.input['q']}") for i in out.interrupts])
    sent = [r["response"]["content"] for r in gemini.function_responses()[2:]]
    assert sent == ["answer a", "answer a"]  # the second call got the first one's answer


@pytest.mark.asyncio
async def test_generate_content_and_dynamic_reply(gemini: FakeGemini) -> None:
    ai = Genkit(plugins=[gemini_plugin("test-key", gemini.base_url)])
    gemini.script(
        text("a", "b"), lambda body: text("echo " + body["contents"][-1]["parts"][0]["text"])
    )

    assert (await ai.generate(model=MODEL, prompt="x")).text == "ab"
    assert (await ai.generate(model=MODEL, prompt="ping")).text == "echo ping"
    assert gemini.generate_requests()[0].path.endswith(":generateContent")


@pytest.mark.asyncio
async def test_fake_fails_loudly() -> None:
    with pytest.raises(AssertionError, match="script ran out"):
        async with FakeGemini() as fake:
            ai = Genkit(plugins=[gemini_plugin("test-key", fake.base_url)])
            # ai.generate does not raise on a model error, and a 500 reads "internal error"
            reply = await ai.generate(model=MODEL, prompt="unscripted")
            assert (reply.finish_reason, reply.finish_message) == (
                FinishReason.FAILED,
                "internal error",
            )

    async with FakeGemini() as fake, aiohttp.ClientSession() as http:
        async with http.get(f"{fake.base_url}/v1beta/models") as keyless:
            assert keyless.status == 401
        assert fake.requests[0].api_key is None
