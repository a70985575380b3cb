"""LiveKit's own OpenAI, Cartesia and ElevenLabs plug-ins (``livekit-plugins-*`` 1.8.9), pointed
at a local streamvox by base URL only, in an in-process ``AgentSession`` with an interruption.

Each plug-in runs with its defaults (OpenAI: ``gpt-4o-mini-tts`` over SSE, mp3; Cartesia: raw
pcm_s16le at 24 kHz; ElevenLabs: ``mp3_22050_32``). Asserted: every reply is heard, the sink gets
no frame of the interrupted reply after its ``clear_buffer()``, and the interrupted stream was
cancelled on the server where the plug-in tells it (see ``TOLD``).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.livekit.helpers import RecordingAudioOutput, ScriptedLLM, TaggingAgent, check_replies, run_turns
from tests.tts_service.compat_helpers import Counted, counted_server

SHORT = "Sure, I can help with that."
LONG = (
    "Let me explain this in some detail, because there is a lot to say. The first thing you should "
    "know is that the process has several steps. The second thing is that each step takes a while."
)


# Whether the server hears of the interruption. OpenAI's plug-in drops the HTTP request and
# Cartesia's closes its socket: the stream is cancelled. ElevenLabs' closes a context as soon as
# its input has ended (flush, then close_context: "speak to the end"), and the scripted LLM's
# reply has ended before the interruption, so nothing more is sent: the server finishes the reply
# on the one connection and the plug-in drops that audio (as it does against ElevenLabs).
TOLD = {"openai": True, "cartesia": True, "elevenlabs": False}
# Where the server is told, it must still be rendering when the interruption comes (0.6 s heard).
# The session sends a non-streaming plug-in one request per sentence, so that is a sentence's
# render: LONG's first sentence (~4 s of audio) is rendered unpaced in under 0.2 s and can be wholly
# written before the interruption, leaving nothing to cancel. One long sentence takes seconds.
ONE_SENTENCE = (
    "Let me explain this in some detail, because there is a lot to say, and the first thing you "
    "should know is that the process has several steps, each of which takes a while, so we will go "
    "through them one by one, slowly and carefully, with an example for each of them, until every "
    "part of it is clear to you and you can do all of it on your own without any help from me"
)
INTERRUPTED = {"openai": ONE_SENTENCE, "cartesia": LONG, "elevenlabs": LONG}


def _plugin(name: str, srv: Counted):
    if name == "openai":
        from livekit.plugins import openai

        return openai.TTS(base_url=srv.http_url + "/v1", api_key="unused")
    if name == "cartesia":
        from livekit.plugins import cartesia

        return cartesia.TTS(base_url=srv.http_url, api_key="unused")
    from livekit.plugins import elevenlabs

    return elevenlabs.TTS(base_url=srv.http_url + "/v1", api_key="unused")


@pytest.mark.parametrize("name", ["openai", "cartesia", "elevenlabs"])
async def test_plugin_speaks_through_streamvox_and_an_interruption_stops_it(engine, name: str) -> None:
    from livekit.agents import AgentSession
    from livekit.agents.utils import http_context

    plan = [False, True, False]  # True: interrupted with session.interrupt()
    # the plug-ins' HTTP sessions come from a worker's job context; in-process, from http_context
    async with counted_server(engine) as srv, http_context.open():
        tts = _plugin(name, srv)
        llm = ScriptedLLM([INTERRUPTED[name] if interrupted else SHORT for interrupted in plan])
        sink = RecordingAudioOutput()
        session = AgentSession(llm=llm, tts=tts, vad=None, turn_handling={"turn_detection": None})
        session.output.audio = sink
        try:
            await session.start(agent=TaggingAgent())
            await run_turns(session, sink, plan)
            for _ in range(100 if TOLD[name] else 0):  # the cancel reaches the server in the background
                if srv.streams_cancelled:
                    break
                await asyncio.sleep(0.05)
            cancelled = srv.streams_cancelled
        finally:
            await session.aclose()
            await tts.aclose()

        check_replies(sink, plan, what=name)
        if TOLD[name]:
            assert cancelled >= 1, f"{name}: the interrupted stream kept running on the server"
        else:
            assert cancelled == 0
            assert [n for path, n in srv.requests.items() if path.endswith("/multi-stream-input")] == [1]
        print(f"\n{name}: requests {srv.requests}")
