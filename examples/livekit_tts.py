"""Use streamvox as the TTS of a LiveKit Agents (1.8.9) app.

In an agent, the whole change is the ``tts=`` argument::

    from agent.livekit import StreamvoxTTS

    session = AgentSession(vad=..., stt=..., llm=..., tts=StreamvoxTTS(url="ws://127.0.0.1:8765/v1/stream"))

(``python -m pipelines.livekit_agent dev`` is a complete worker built that way.) This program
drives the plug-in directly, the way the session does: it streams a reply token by token into
``out/livekit_tts.wav``, then starts a second reply and interrupts it, which cancels it on the
server (acknowledged) while the connection stays open for the next turn.

Run::

    .venv/bin/streamvox serve &
    .venv/bin/python examples/livekit_tts.py
"""

import asyncio
import os
import wave

from livekit import rtc
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

from agent.livekit import CancelReport, StreamvoxTTS

REPLY = "Sure! Your booking is moved to Tuesday afternoon. Is there anything else I can do for you?"


async def main() -> None:
    tts = StreamvoxTTS(url=os.environ.get("TTS_URL", "ws://127.0.0.1:8765/v1/stream"))
    tts.on("metrics_collected", lambda m: print(f"TTFB {m.ttfb * 1000:.0f} ms, reused: {m.connection_reused}"))
    tts.on("stream_cancelled", print_cancel)
    tts.prewarm()  # connect now, not on the first turn

    # A reply, token by token, as an LLM would produce it.
    stream = tts.stream()
    for token in REPLY.split(" "):
        stream.push_text(token + " ")
    stream.end_input()
    frames, words = [], []
    async for audio in stream:
        frames.append(audio.frame)
        words += audio.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
    await stream.aclose()
    os.makedirs("out", exist_ok=True)
    with wave.open("out/livekit_tts.wav", "wb") as wav:
        whole = rtc.combine_audio_frames(frames)
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(whole.sample_rate)
        wav.writeframes(bytes(whole.data))
    print(f"wrote out/livekit_tts.wav: {whole.duration:.2f} s; first words {[(w, w.start_time) for w in words[:3]]}")

    # The caller talks over the next reply: the session closes the stream.
    stream = tts.stream()
    stream.push_text("Let me read you the whole list of our opening hours, day by day, starting on Monday.")
    stream.end_input()
    async for _ in stream:
        break  # the first frame played, then the barge-in
    await stream.aclose()  # returns at once; the cancel's ack is awaited in the background
    await tts.aclose()  # waits for that ack, then closes the connection


def print_cancel(report: CancelReport) -> None:
    state = "acknowledged" if report.acked else "NOT acknowledged"
    print(f"cancel {state} in {report.latency_s * 1000:.1f} ms; {report.frames_dropped_server} frames never sent")


if __name__ == "__main__":
    asyncio.run(main())
