"""The LiveKit worker's LLM: OpenAI-compatible chat completions streamed into LiveKit's chat chunks.

Real: livekit-agents' LLM stream machinery and aiohttp. Fake: the endpoint (a cloud LLM stands
behind it in production), which records what it was sent.
"""

from __future__ import annotations

import pytest

from support.pipecat_harness import fake_llm

REPLY = "Sure, the train leaves at noon."


async def _ask(model) -> str:
    from livekit.agents import llm

    ctx = llm.ChatContext()
    ctx.add_message(role="system", content="Be brief.")
    ctx.add_message(role="user", content="When does the train leave?")
    text = ""
    async with model.chat(chat_ctx=ctx) as stream:
        async for chunk in stream:
            if chunk.delta and chunk.delta.content:
                text += chunk.delta.content
    return text


@pytest.mark.parametrize("temperature", [None, 0.3])
async def test_the_reply_streams_and_the_temperature_is_sent_only_when_set(temperature):
    from pipelines.livekit_agent import OpenAICompatibleLLM

    async with fake_llm([REPLY]) as (url, requests):
        model = OpenAICompatibleLLM(base_url=url, model="fake", temperature=temperature)
        try:
            assert await _ask(model) == REPLY
        finally:
            await model.aclose()
    (body,) = requests
    assert body["stream"] is True and body["model"] == "fake"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body.get("temperature") == temperature  # None: the key is absent, the endpoint decides
    assert ("temperature" in body) == (temperature is not None)
