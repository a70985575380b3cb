"""In-process servers, raw-socket reading, Whisper, WER: the tts_service suite's helpers, which
the scripts use too (``scripts/probe_hardening.py``, ``tts_first_audio.py``, ``stt_latency.py``).

Imported as ``support.tts_helpers`` (the repository root is on ``sys.path`` under
``python -m pytest``; scripts put it there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from support.wer import edit_distance
from tts_service import protocol as P
from tts_service.piper.engine import PiperEngine
from tts_service.piper.runtime import PiperSynthesizer
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.server import Server, ServerConfig

# Test servers admit streams regardless of the measured real-time factor: on a busy 2-core
# machine it can exceed what two concurrent streams need, and tests that open a few contexts
# at once must not be refused for that. Admission itself is tested with explicit limits.
NO_ADMISSION_LIMIT = 1000.0
API_KEY = "s3cret-key"  # of the ``keyed`` server fixture


@dataclass(frozen=True)
class RunningServer:
    server: Server
    ws_url: str
    http_url: str

    @property
    def synth(self) -> PiperSynthesizer:
        return self.server.synth


@contextlib.asynccontextmanager
async def running_server(
    engine: PiperEngine,
    *,
    config: ServerConfig | None = None,
    options: PiperSchedulerOptions | None = None,
) -> AsyncIterator[RunningServer]:
    """A real server on a free loopback port, torn down on exit."""
    options = options or PiperSchedulerOptions(capacity=NO_ADMISSION_LIMIT)
    server = Server(PiperSynthesizer(engine, options=options), config or ServerConfig())
    async with on_loopback(server.app) as (ws_url, http_url):
        yield RunningServer(server, ws_url, http_url)


@contextlib.asynccontextmanager
async def on_loopback(app: web.Application) -> AsyncIterator[tuple[str, str]]:
    """Serve ``app`` on a free loopback port: ``(ws_url, http_url)``; every suite's server uses it."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"ws://{host}:{port}{P.WS_PATH}", f"http://{host}:{port}"
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- raw WebSocket


@dataclass
class Event:
    """One server message as received: JSON (``msg``) or an audio frame (``stream``/``seq``)."""

    msg: dict[str, Any] | None = None
    stream: int | None = None
    seq: int | None = None
    payload: bytes = b""

    @property
    def type(self) -> str:
        return "audio" if self.msg is None else self.msg["type"]


class RawConnection:
    """A protocol-level client that hides nothing: a background reader records every server
    message in arrival order (``log``); ``next``/``expect`` walk that log with a cursor."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, ready: dict[str, Any]) -> None:
        self.ws = ws
        self.ready = ready
        self.log: list[Event] = []
        self.closed = False
        self._cursor = 0
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    stream, seq, payload = P.unpack_frame(msg.data)
                    self.log.append(Event(stream=stream, seq=seq, payload=payload))
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    self.log.append(Event(msg=json.loads(msg.data)))
                self._arrived.set()
        finally:
            self.closed = True
            self._arrived.set()

    async def aclose(self) -> None:
        await self.ws.close()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def send(self, data: str | bytes) -> None:
        if isinstance(data, bytes):
            await self.ws.send_bytes(data)
        else:
            await self.ws.send_str(data)

    async def next(self, timeout: float = 10.0) -> Event:
        """The next message in arrival order."""
        async with asyncio.timeout(timeout):
            while self._cursor >= len(self.log):
                if self.closed:
                    raise AssertionError("the server closed the connection")
                self._arrived.clear()
                await self._arrived.wait()
        self._cursor += 1
        return self.log[self._cursor - 1]

    async def expect(self, mtype: str, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        """Skip messages until one of ``mtype`` whose fields match; return it."""
        async with asyncio.timeout(timeout):
            while True:
                ev = await self.next(timeout)
                if ev.msg is not None and ev.type == mtype and all(ev.msg.get(k) == v for k, v in fields.items()):
                    return ev.msg

    async def ping_pong(self, ping_id: Any = "p") -> None:
        await self.send(P.ping(ping_id))
        await self.expect(P.MsgType.PONG, id=ping_id)

    async def speak(self, context_id: str, text: str, **start: Any) -> tuple[dict, list[Event], list[Event], dict]:
        """Run one context to ``done``: (started, frames, events of the context in order, done)."""
        await self.send(P.start(context_id, text=text, **start))
        await self.send(P.end(context_id))
        started = await self.expect(P.MsgType.STARTED, context_id=context_id)
        frames: list[Event] = []
        events: list[Event] = []
        async with asyncio.timeout(60):
            while True:
                ev = await self.next()
                if ev.msg is None and ev.stream == started["stream"]:
                    frames.append(ev)
                    events.append(ev)
                elif ev.msg is not None and ev.msg.get("context_id") == context_id:
                    assert ev.type in (P.MsgType.WORDS, P.MsgType.DONE), ev.msg
                    events.append(ev)
                    if ev.type == P.MsgType.DONE:
                        return started, frames, events, ev.msg


@contextlib.asynccontextmanager
async def raw_connection(url: str, **kwargs: Any) -> AsyncIterator[RawConnection]:
    async with aiohttp.ClientSession() as session, session.ws_connect(url, max_msg_size=0, **kwargs) as ws:
        first = await ws.receive(timeout=5)
        ready = json.loads(first.data)
        assert ready["type"] == P.MsgType.READY, ready
        conn = RawConnection(ws, ready)
        try:
            yield conn
        finally:
            await conn.aclose()


async def eventually(condition: Callable[[], bool], timeout: float = 5.0, step: float = 0.05) -> None:
    """Wait until ``condition()`` holds (state changed by the server's own tasks)."""
    for _ in range(int(timeout / step)):
        if condition():
            return
        await asyncio.sleep(step)
    assert condition(), f"condition not met within {timeout} s"


def pcm(frames: list[Event] | list[bytes]) -> np.ndarray:
    """float32 samples of pcm_s16le frames."""
    data = b"".join(f if isinstance(f, bytes) else f.payload for f in frames)
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


# ---------------------------------------------------------------- speech recognition


def transcribe(model, audio: np.ndarray, sample_rate: int) -> str:
    """Whisper's transcript of float32 mono audio at any rate."""
    import soxr

    if sample_rate != 16000:
        audio = soxr.resample(audio, sample_rate, 16000)
    segments, _ = model.transcribe(
        np.ascontiguousarray(audio, dtype=np.float32), language="en", beam_size=1, condition_on_previous_text=False
    )
    return " ".join(s.text.strip() for s in segments)


def normalise(text: str) -> list[str]:
    text = text.lower().replace("’", "'")
    return re.sub(r"[^a-z0-9' ]+", " ", text).split()


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: word-level edit distance over the reference length (this normal form keeps
    numbers as written; ``support.wer`` has the callers' one)."""
    ref = normalise(reference)
    return edit_distance(ref, normalise(hypothesis)) / max(1, len(ref))


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if audio.size else 0.0
