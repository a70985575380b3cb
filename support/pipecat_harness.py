"""Test harness of the Pipecat plug-in: a counting server, a real-time player, a frame probe,
callers of the demo room (WebRTC through aiortc, with an optionally lossy uplink; Twilio).

Imported as ``support.pipecat_harness`` by the suite, by ``tests/pipecat/bargein_ttfb.py`` and by
``scripts/uplink_loss.py``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fractions
import json
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiortc import MediaStreamTrack
from av import AudioFrame
from pipecat.frames.frames import (
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    StartFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams

from tts_service import protocol as P
from tts_service.client import TTSClient
from tts_service.piper.runtime import PiperSynthesizer
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.server import Server, ServerConfig

# Tests open a few contexts at once on a busy 2-core machine: admit regardless of measured load.
NO_ADMISSION_LIMIT = 1000.0


@dataclass
class CountingServer:
    """A real streamvox server on loopback that counts the WebSocket connections it accepted."""

    server: Server
    ws_url: str
    ws_connections: int = 0

    def cancels_acked(self) -> int:
        """Cancels the server handled (each one sent an ack), from its own metrics."""
        value = self.server.synth.metrics.registry.get_sample_value("streamvox_cancel_ack_seconds_count")
        return int(value or 0)


@contextlib.asynccontextmanager
async def counting_server(engine, *, options: PiperSchedulerOptions | None = None) -> AsyncIterator[CountingServer]:
    options = options or PiperSchedulerOptions(capacity=NO_ADMISSION_LIMIT)
    server = Server(PiperSynthesizer(engine, options=options), ServerConfig())
    counting = CountingServer(server, "")

    async def count(request: web.Request, _response: web.StreamResponse) -> None:
        if request.path == P.WS_PATH:
            counting.ws_connections += 1

    server.app.on_response_prepare.append(count)
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    counting.ws_url = f"ws://{host}:{port}{P.WS_PATH}"
    try:
        yield counting
    finally:
        await runner.cleanup()


def llm_reply(text: str) -> list[Frame]:
    """An LLM turn as Pipecat's LLM services emit it: start, word-sized tokens, end."""
    tokens = re.findall(r"\s*\S+", text)
    return [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in tokens), LLMFullResponseEndFrame()]


@dataclass
class Stamped:
    t: float  # time.monotonic()
    frame: Frame


class Probe(FrameProcessor):
    """Records every downstream frame that passes, with the time it passed."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seen: list[Stamped] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            self.seen.append(Stamped(time.monotonic(), frame))
        await self.push_frame(frame, direction)


@dataclass
class Played:
    """What the real-time player played: each chunk with the time its playback started."""

    chunks: list[tuple[float, float]] = field(default_factory=list)  # (playback start, seconds)
    interrupted_at: list[float] = field(default_factory=list)

    def seconds_played(self, at: float) -> float:
        """Audio played by time ``at`` (a barge-in flushes the rest)."""
        return sum(min(max(0.0, at - start), duration) for start, duration in self.chunks)


class RealtimePlayer(BaseOutputTransport):
    """An output transport that plays audio like a sound device, on the wall clock.

    The device plays chunks back to back from the first one, with a gap whenever the next chunk
    is not there in time (an underrun). The writer keeps at most ``ahead_s`` of audio queued in
    the device, as real audio devices and WebRTC senders do, so an event loop that oversleeps a
    little does not count as a gap. Word frames (PTS) are released by Pipecat's clock as their
    audio plays, and an interruption drops what the device has not played yet.
    """

    def __init__(self, *, sample_rate: int, ahead_s: float = 0.1) -> None:
        super().__init__(TransportParams(audio_out_enabled=True, audio_out_sample_rate=sample_rate))
        self.played = Played()
        self._ahead_s = ahead_s
        self._play_end = 0.0

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, InterruptionFrame):
            self.played.interrupted_at.append(time.monotonic())
        await super().process_frame(frame, direction)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        duration = len(frame.audio) / 2 / frame.sample_rate
        start = max(time.monotonic(), self._play_end)
        self.played.chunks.append((start, duration))
        self._play_end = start + duration
        await asyncio.sleep(max(0.0, self._play_end - self._ahead_s - time.monotonic()))
        return True


# ---------------------------------------------------------------- a fake cloud LLM

REPLIES = [
    "The capital of France is Paris. It is a large and busy city on the river Seine, with many museums, "
    "old bridges and famous gardens. Most people arrive by train at one of its six big stations.",
    "Of course, the train it is.",
]


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def fake_llm(replies: list[str] = REPLIES):
    """An OpenAI-compatible chat endpoint streaming canned replies, one per request, in order."""
    requests: list[dict] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        body["_received_at"] = time.monotonic()  # tests tell an interrupted reply from the next one by it
        requests.append(body)
        reply = replies[min(len(requests), len(replies)) - 1]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, token in enumerate(reply.split(" ")):
            chunk = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "fake",
                "choices": [{"index": 0, "delta": {"content": (" " if i else "") + token}, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(0.01)
        done = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake"}
        done["choices"] = [{"index": 0, "delta": {}, "finish_reason": "stop"}]
        await resp.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.add_routes([web.post("/v1/chat/completions", completions)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1", requests
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def room_server(config) -> AsyncIterator[tuple[str, list]]:
    """The agent's demo room (``pipelines.pipecat_room``) under uvicorn on loopback: (base URL, agents)."""
    import uvicorn

    from pipelines.pipecat_agent import room_app

    agents: list = []
    port = free_port()
    app = room_app(config, on_agent=agents.append)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", agents
    finally:
        for agent in agents:
            await agent.worker.cancel()
        server.should_exit = True
        await asyncio.wait_for(task, 15)


# ---------------------------------------------------------------- a WebRTC caller (aiortc)

RATE = 16000  # what the aiortc caller's microphone sends
SAMPLES = 320  # 20 ms


async def first_time(recorded: list, pred, timeout: float, what) -> float:
    """The time of the first ``(t, item)`` in ``recorded`` (a list that grows while we wait) with
    ``pred(t, item)``; AssertionError after ``timeout`` s, naming ``what`` (a text, or a function
    that says it then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for t, item in recorded:
            if pred(t, item):
                return t
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


async def speech(url: str, text: str, *, sample_rate: int = RATE, encoding: str | None = None) -> bytes:
    """A caller's words, rendered whole by the streamvox server at ``url`` (the bundled voice)."""
    async with TTSClient(url) as client:
        ctx = await client.open(text=text, sample_rate=sample_rate, encoding=encoding, pace=False)
        await ctx.end()
        return await ctx.collect()


class Microphone(MediaStreamTrack):
    """A microphone that plays queued 16 kHz PCM in real time, silence otherwise."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pending = b""
        self._start: float | None = None
        self._pts = 0
        self.speech_ended_at = 0.0

    def say(self, pcm: bytes) -> None:
        self._pending += pcm

    async def recv(self) -> AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        self._pts += SAMPLES
        await asyncio.sleep(max(0.0, self._start + self._pts / RATE - time.monotonic()))
        chunk, self._pending = self._pending[: 2 * SAMPLES], self._pending[2 * SAMPLES :]
        if chunk and not self._pending:
            self.speech_ended_at = time.monotonic()
        frame = AudioFrame(format="s16", layout="mono", samples=SAMPLES)
        frame.planes[0].update(chunk.ljust(2 * SAMPLES, b"\0"))
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


class LossyUplink:
    """Drops every ``every``-th RTP packet the client sends (RTCP passes)."""

    def __init__(self, every: int) -> None:
        self.every, self.sent, self.dropped = every, 0, 0

    def install(self, pc) -> None:
        """On an ``RTCPeerConnection`` after ``setLocalDescription`` (its transport exists then)."""
        if not self.every:
            return
        transport = pc.getSenders()[0].transport
        send = transport._send_rtp

        async def lossy(data: bytes) -> None:
            if not 192 <= data[1] <= 223:  # RTP, not RTCP
                self.sent += 1
                if self.sent % self.every == self.every // 2:
                    self.dropped += 1
                    return
            await send(data)

        transport._send_rtp = lossy


VOICED = 0.01  # RMS of a voiced 20 ms frame of what a caller hears
QUIET_S = 0.3  # this long with no voiced frame: quiet (longer than the dips between words)


def silenced_at(heard: list[tuple[float, float]], since: float) -> float:
    """The last voiced 20 ms before the first ``QUIET_S`` of quiet (``since`` when none was voiced)."""
    last_voiced = since
    for t, rms in heard:
        if t - last_voiced >= QUIET_S:
            return last_voiced
        if rms > VOICED:
            last_voiced = t
    return last_voiced


def voiced_runs(heard: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start, end) of each stretch of voiced audio, split at ``QUIET_S`` of quiet."""
    runs: list[tuple[float, float]] = []
    for t, rms in heard:
        if rms <= VOICED:
            continue
        if runs and t - runs[-1][1] < QUIET_S:
            runs[-1] = (runs[-1][0], t)
        else:
            runs.append((t, t))
    return runs


@dataclass
class WebRTCCall:
    """A connected aiortc caller: its microphone, what it heard ((time, RMS) per 20 ms), its uplink."""

    pc: Any
    mic: Microphone
    uplink: LossyUplink
    heard: list[tuple[float, float]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def webrtc_call(
    http, base: str, *, loss_every: int = 0, before_offer=None, echo_mode: str | None = None
) -> AsyncIterator[WebRTCCall]:
    """Call the demo room at ``base`` as a browser would (``/start``, then the SDP offer) over aiortc.

    ``loss_every``: the uplink drops every N-th RTP packet. ``before_offer()`` runs after the
    caller's own receiver exists and before the agent makes its one (module-level aiortc settings).
    ``echo_mode``: what the page says in ``/start`` ("browser-aec" on loudspeakers, "raw-mic" with
    headphones); None says nothing, as a client other than the page.
    """
    import numpy as np
    from aiortc import RTCPeerConnection, RTCSessionDescription

    start = {} if echo_mode is None else {"body": {"echo_mode": echo_mode}}
    async with http.post(f"{base}/start", json=start) as resp:
        session = (await resp.json())["sessionId"]
    call = WebRTCCall(RTCPeerConnection(), Microphone(), LossyUplink(loss_every))
    call.pc.addTrack(call.mic)
    readers: list[asyncio.Task] = []

    @call.pc.on("track")
    def on_track(track) -> None:
        async def read() -> None:
            while True:
                frame = await track.recv()
                pcm = frame.to_ndarray().astype(np.float32) / 32768.0
                call.heard.append((time.monotonic(), float(np.sqrt(np.mean(pcm**2)))))

        readers.append(asyncio.create_task(read()))

    try:
        await call.pc.setLocalDescription(await call.pc.createOffer())
        call.uplink.install(call.pc)
        if before_offer is not None:
            before_offer()
        offer = {"sdp": call.pc.localDescription.sdp, "type": call.pc.localDescription.type}
        async with http.post(f"{base}/sessions/{session}/api/offer", json=offer) as resp:
            answer = await resp.json()
        await call.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        yield call
    finally:
        for task in readers:
            task.cancel()
        await call.pc.close()


# ---------------------------------------------------------------- a Twilio media-stream caller

TWILIO_CHUNK = 160  # 20 ms of 8 kHz mu-law, what Twilio sends
MULAW_SILENCE = b"\xff" * TWILIO_CHUNK


def _ulaw_to_linear(payload: bytes) -> bytes:
    import audioop  # deprecated in 3.13; this suite runs on 3.11

    return audioop.ulaw2lin(payload, 2)


def voiced(event: dict, threshold: float = 0.01) -> bool:
    """A Twilio ``media`` event whose audio is louder than ``threshold`` RMS (full scale 1.0): the agent
    speaking, not the line's silence."""
    import audioop

    if event["event"] != "media":
        return False
    return audioop.rms(_ulaw_to_linear(base64.b64decode(event["media"]["payload"])), 2) / 32768.0 > threshold


def _mulaw_mix(chunk: bytes, echo) -> bytes:
    """A mu-law chunk with ``echo`` (float32, full scale 1.0, same length) added, clipped as a phone would."""
    import audioop

    import numpy as np

    mixed = np.frombuffer(audioop.ulaw2lin(chunk, 2), np.int16).astype(np.float32) / 32768.0 + echo
    return audioop.lin2ulaw((np.clip(mixed, -1.0, 1.0) * 32767).astype(np.int16).tobytes(), 2)


class TwilioCaller:
    """Speaks Twilio's media-stream protocol to the agent's ``/ws``: 20 ms mu-law packets in real
    time (silence between utterances, as a phone line does) and a log of everything received."""

    def __init__(self, ws, *, echo=None) -> None:
        self.ws = ws
        self.stream_sid = f"MZ{uuid.uuid4().hex}"
        self.events: list[tuple[float, dict]] = []
        self.outgoing: asyncio.Queue[bytes] = asyncio.Queue()
        self.speech_end = 0.0
        # a speakerphone (``support.echo_path.EchoPath`` at 8 kHz): what the agent sends plays into
        # the room and comes back in the uplink, mixed with whatever the caller says
        self.echo = echo
        self.talking: list[tuple[float, float]] = []  # (start, end) of each utterance the caller sent
        self._t0: float | None = None  # when the first uplink packet was due: sample 0 of the line
        self._pending = b""  # the rest of the utterance being sent

    async def hello(self) -> None:
        start = {
            "streamSid": self.stream_sid,
            "accountSid": "AC0",
            "callSid": f"CA{uuid.uuid4().hex}",
            "tracks": ["inbound"],
            "customParameters": {},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        }
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await self.ws.send(
            json.dumps({"event": "start", "sequenceNumber": "1", "start": start, "streamSid": self.stream_sid})
        )

    async def send_audio(self) -> None:
        """One 20 ms packet per 20 ms of the line's clock. When this event loop (shared with the
        agent under test) fell behind, the packets owed go at once, as a phone's buffered uplink
        would: sent one per loop turn, they had lagged the clock by up to 2 s under load, and the
        uplink then carried the bot's echo 2 s late, a phone no caller has."""
        next_at, seq = time.monotonic(), 2
        self._t0 = next_at
        while True:
            while next_at <= time.monotonic():
                media = {
                    "track": "inbound",
                    "chunk": str(seq),
                    "timestamp": str(seq * 20),
                    "payload": base64.b64encode(self._next_chunk()).decode(),
                }
                packet = {"event": "media", "sequenceNumber": str(seq), "media": media, "streamSid": self.stream_sid}
                await self.ws.send(json.dumps(packet))
                seq += 1
                next_at += 0.02
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def _next_chunk(self) -> bytes:
        """The next 20 ms of the uplink: the caller's queued speech or silence, plus the echo."""
        if not self._pending and not self.outgoing.empty():
            self._pending = self.outgoing.get_nowait()
        pending = self._pending
        chunk, self._pending = (pending[:TWILIO_CHUNK], pending[TWILIO_CHUNK:]) if pending else (MULAW_SILENCE, b"")
        if chunk is not MULAW_SILENCE:
            now = time.monotonic()
            if not self.talking or self.talking[-1][1] < now - 0.05:
                self.talking.append((now, now))
            self.talking[-1] = (self.talking[-1][0], now + 0.02)
            if not self._pending:
                self.speech_end = now
        chunk = chunk.ljust(TWILIO_CHUNK, b"\xff")
        if self.echo is not None:
            chunk = _mulaw_mix(chunk, self.echo.pull(TWILIO_CHUNK))
        return chunk

    async def receive(self) -> None:
        async for raw in self.ws:
            event = json.loads(raw)
            self.events.append((time.monotonic(), event))
            if self.echo is None:
                continue
            if event["event"] == "media":  # plays as soon as it arrives (after what is queued), on the
                # phone's own clock: the wall clock, not the count of packets sent so far (the sender
                # shares this event loop and may be behind)
                now = self.events[-1][0]
                at = round((now - self._t0) * 8000) if self._t0 is not None else None
                self.echo.push(_ulaw_to_linear(base64.b64decode(event["media"]["payload"])), at_sample=at)
            elif event["event"] == "clear":  # Twilio empties its playout buffer
                self.echo.clear()

    def media_after(self, t0: float) -> bytes:
        return b"".join(
            base64.b64decode(ev["media"]["payload"]) for t, ev in self.events if ev["event"] == "media" and t >= t0
        )


@contextlib.asynccontextmanager
async def twilio_call(base: str, *, echo=None) -> AsyncIterator[TwilioCaller]:
    """A Twilio caller on the room at ``base`` (its ``/ws``), sending and receiving until the block ends."""
    import websockets

    async with websockets.connect(base.replace("http://", "ws://") + "/ws") as ws:
        caller = TwilioCaller(ws, echo=echo)
        await caller.hello()
        tasks = [asyncio.create_task(caller.send_audio()), asyncio.create_task(caller.receive())]
        try:
            yield caller
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
