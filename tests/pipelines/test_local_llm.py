"""The offline OpenAI-compatible endpoint, on the real SmolLM2 weights."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest
from aiohttp import web

from pipelines.local_llm import LLMLoadError, LocalLLM, build_app

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def llm() -> LocalLLM:
    model = LocalLLM()
    model.load(progress=print)  # first run de-quantises the GGUF (~1 min), later runs read the cache
    return model


@pytest.fixture(scope="module")
async def base_url(llm: LocalLLM):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runner = web.AppRunner(build_app(llm))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/v1"
    await runner.cleanup()


QUESTION = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]


async def test_streaming_completion_is_openai_shaped(base_url: str) -> None:
    pieces: list[str] = []
    async with aiohttp.ClientSession() as s:
        body = {"model": "x", "messages": QUESTION, "stream": True, "max_tokens": 24}
        async with s.post(f"{base_url}/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            done = False
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line:
                    continue
                assert line.startswith("data: ")
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                assert chunk["object"] == "chat.completion.chunk"
                pieces.append(chunk["choices"][0]["delta"].get("content", ""))
    assert done
    text = "".join(pieces)
    assert "Paris" in text, text


async def test_plain_completion_and_models(base_url: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base_url}/chat/completions", json={"messages": QUESTION, "max_tokens": 16}) as resp:
            data = await resp.json()
        assert data["choices"][0]["message"]["role"] == "assistant"
        assert data["choices"][0]["message"]["content"].strip()
        async with s.get(f"{base_url}/models") as resp:
            assert (await resp.json())["data"][0]["id"]


@pytest.mark.parametrize(
    "body",
    ["not json", json.dumps({"messages": []}), json.dumps({"messages": [{"content": "no role"}]})],
)
async def test_bad_requests_get_400_with_reason(base_url: str, body: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base_url}/chat/completions", data=body) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"]


async def test_a_client_that_leaves_stops_generation(base_url: str, llm: LocalLLM) -> None:
    long_ask = [{"role": "user", "content": "Write a very long story about the sea."}]
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            f"{base_url}/chat/completions", json={"messages": long_ask, "stream": True, "max_tokens": 2000}
        )
        await resp.content.readline()  # the role chunk: generation has started
        resp.close()
    t0 = time.monotonic()
    # The worker holds its lock while generating; it must be released soon after the client left.
    while llm._lock.locked() and time.monotonic() - t0 < 60:
        await asyncio.sleep(0.1)
    assert not llm._lock.locked()


def test_missing_model_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(LLMLoadError, match="does not exist"):
        LocalLLM(tmp_path / "nope.gguf").load(progress=lambda *_: None)
