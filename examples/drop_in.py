"""Streamvox as a drop-in for OpenAI speech: the ``openai`` SDK, only its base URL changed.

Run a server first (``streamvox serve``), then ``python examples/drop_in.py "Hello there."``: the
SDK streams 24 kHz PCM from http://127.0.0.1:8765/v1/audio/speech, as from OpenAI, and this
program writes it to ``drop_in.wav`` as it arrives.

The same server speaks Cartesia's and ElevenLabs' WebSockets; in a framework only the URL changes
(the key is any string unless the server has one, then that key)::

    # Pipecat 1.14
    OpenAITTSService(api_key="-", base_url="http://127.0.0.1:8765/v1", sample_rate=24000)
    CartesiaTTSService(api_key="-", url="ws://127.0.0.1:8765/tts/websocket")
    ElevenLabsTTSService(api_key="-", url="ws://127.0.0.1:8765")
    # LiveKit Agents 1.8.9
    openai.TTS(api_key="-", base_url="http://127.0.0.1:8765/v1")
    cartesia.TTS(api_key="-", base_url="http://127.0.0.1:8765")
    elevenlabs.TTS(api_key="-", base_url="http://127.0.0.1:8765/v1")

Voice names the clients send (``alloy``, a Cartesia or ElevenLabs id) map to streamvox's voices:
OpenAI's names mean the default voice; others through ``streamvox serve --voice-map``.
"""

import asyncio
import sys
import time
import wave

import openai


async def main(text: str) -> None:
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:8765/v1", api_key="-")
    t0 = time.perf_counter()
    with wave.open("drop_in.wav", "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(24000)  # OpenAI's pcm: 24 kHz, 16-bit, mono
        async with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text, response_format="pcm"
        ) as resp:
            first = True
            async for chunk in resp.iter_bytes():
                if first:
                    print(f"first audio after {1000 * (time.perf_counter() - t0):.0f} ms")
                    first = False
                out.writeframes(chunk)
    await client.close()
    print("wrote drop_in.wav")


if __name__ == "__main__":
    asyncio.run(main(" ".join(sys.argv[1:]) or "Hello there, how can I help you today?"))
