"""Stream LLM-style tokens into streamvox and save the audio; cancel a second reply mid-way.

Run a server first (``streamvox serve``: this program connects to ws://127.0.0.1:8765/v1/stream),
then ``python examples/stream_tokens.py``. It prints the first-audio time and the word timings,
writes the first reply to ``reply.wav`` (16 kHz) in the current folder, then cancels the second
reply and prints the acknowledgement.
"""

import asyncio
import time
import wave

from tts_service.client import AudioFrame, TTSClient, WordTimings

REPLY = "Sure! The weather in Paris today is sunny, with a high of twenty one degrees. Anything else?"


async def main() -> None:
    async with TTSClient("ws://127.0.0.1:8765/v1/stream") as client:
        ctx = await client.open(sample_rate=16000)
        t0 = time.perf_counter()

        async def feed() -> None:
            for token in REPLY.split(" "):  # pretend these come from an LLM
                await ctx.send_text(token + " ")
                await asyncio.sleep(0.02)
            await ctx.end()

        feeder = asyncio.create_task(feed())
        pcm = bytearray()
        async for item in ctx:
            if isinstance(item, AudioFrame):
                if not pcm:
                    print(f"first audio after {1000 * (time.perf_counter() - t0):.0f} ms")
                pcm += item.pcm
            elif isinstance(item, WordTimings):
                print("words:", ", ".join(f"{w.word}@{w.start:.2f}s" for w in item.words))
        await feeder
        with wave.open("reply.wav", "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16000)
            wav.writeframes(bytes(pcm))

        # Barge-in: the caller talks over the second reply; cancel returns on the server's ack.
        ctx = await client.open(text="This answer is going to be interrupted very soon. " * 3)
        await ctx.end()
        await asyncio.sleep(0.5)
        result = await ctx.cancel()
        print(
            f"cancel acked={result.acked} in {1000 * result.latency_s:.1f} ms; "
            f"{result.frames_dropped_server} frames never sent"
        )
        print(f"one connection for both replies: {client.connections == 1}")


if __name__ == "__main__":
    asyncio.run(main())
