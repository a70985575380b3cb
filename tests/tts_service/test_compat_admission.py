"""The compatible endpoints share ``/v1/stream``'s admission: a full server refuses each of them
in its API's own terms, and the refusal leaves the WebSocket connections usable."""

from __future__ import annotations

import json

import aiohttp
import openai

from support.tts_helpers import NO_ADMISSION_LIMIT, running_server
from tts_service.client import TTSClient
from tts_service.piper.scheduler import PiperSchedulerOptions

LONG = "Let me walk you through the three options we have for your trip next week, one by one. " * 4


async def _next(ws) -> dict:
    return json.loads((await ws.receive()).data)


async def test_a_full_server_refuses_every_api_in_its_own_shape(engine) -> None:
    options = PiperSchedulerOptions(max_streams=1, capacity=NO_ADMISSION_LIMIT)
    async with running_server(engine, options=options) as srv, TTSClient(srv.ws_url) as client:
        busy = await client.open(pace=True)  # the one stream the server admits, on /v1/stream
        await busy.send_text(LONG)
        ws_base = srv.http_url.replace("http://", "ws://")

        sdk = openai.AsyncOpenAI(base_url=srv.http_url + "/v1", api_key="-", max_retries=0)
        try:
            await sdk.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", response_format="pcm")
            raise AssertionError("a full server spoke")
        except openai.InternalServerError as exc:
            assert exc.status_code == 503 and exc.body["code"] == "overloaded"
            assert int(exc.response.headers["Retry-After"]) >= 1
        await sdk.close()

        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(ws_base + "/tts/websocket") as cartesia:
                await cartesia.send_json({"context_id": "c", "transcript": "Hi.", "continue": False})
                error = await _next(cartesia)
                assert (error["type"], error["context_id"], error["status_code"]) == ("error", "c", 429)
                url = ws_base + "/v1/text-to-speech/any/multi-stream-input?output_format=pcm_16000"
                async with http.ws_connect(url) as eleven:
                    await eleven.send_json({"text": "Hi.", "context_id": "e", "flush": True})
                    assert (await _next(eleven))["error"] == "overloaded"
                    assert await _next(eleven) == {"isFinal": True, "contextId": "e"}

                    assert (await busy.cancel()).acked  # room again: the same connections speak
                    await cartesia.send_json({"context_id": "c2", "transcript": "Hi.", "continue": False})
                    kinds = [(await _next(cartesia))["type"]]
                    while kinds[-1] not in ("done", "error"):
                        kinds.append((await _next(cartesia))["type"])
                    assert "chunk" in kinds and kinds[-1] == "done", kinds
                    await eleven.send_json({"text": "Hi.", "context_id": "e2", "flush": True})
                    reply = await _next(eleven)
                    assert reply.get("contextId") == "e2" and reply.get("audio"), reply
