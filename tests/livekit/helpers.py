"""Stand-ins for what a LiveKit deployment provides, so an ``AgentSession`` runs in-process.

* :class:`CountingServer` - the real streamvox server, counting WebSocket connections.
* :class:`ScriptedLLM` - replies from a list, token by token (the network LLM's stand-in).
* :class:`RecordingAudioOutput` - an ``io.AudioOutput`` sink that "plays" in real time and
  records every frame (tagged with the reply it belongs to) and every ``clear_buffer()``.
* :class:`MicInput` - an ``io.AudioInput`` that streams silence in real time, and speech on cue.
* :class:`TaggingAgent` - tags each reply's frames so the sink can tell replies apart.

Imported as ``tests.livekit.helpers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web
from livekit import rtc
from livekit.agents import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, APIConnectOptions, llm
from livekit.agents.voice import Agent, ModelSettings, io

from support.tts_helpers import on_loopback
from tts_service.piper.runtime import PiperSynthesizer
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.server import Server, ServerConfig

REPLY_TAG = "streamvox.test.reply"


# ---------------------------------------------------------------- the TTS server


class CountingServer(Server):
    """The real server; ``ws_connections`` counts WebSocket connections ever accepted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ws_connections = 0

    async def ws_handler(self, request: web.Request) -> web.WebSocketResponse:
        self.ws_connections += 1
        return await super().ws_handler(request)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A value from the server's Prometheus registry (0 when absent)."""
        return self.synth.metrics.registry.get_sample_value(name, labels or {}) or 0.0

    @property
    def cancels_acked(self) -> int:
        """``cancel`` messages answered (every one is answered with ``cancelled``)."""
        return int(self.sample("streamvox_cancel_ack_seconds_count"))

    @property
    def streams_cancelled(self) -> int:
        return int(self.sample("streamvox_streams_total", {"status": "cancelled"}))


@dataclass(frozen=True)
class RunningServer:
    server: CountingServer
    url: str


@contextlib.asynccontextmanager
async def running_server(engine, *, config: ServerConfig | None = None) -> AsyncIterator[RunningServer]:
    # Admission by measured load is switched off: a busy 2-core test machine must not refuse.
    server = CountingServer(
        PiperSynthesizer(engine, options=PiperSchedulerOptions(capacity=1000.0)), config or ServerConfig()
    )
    async with on_loopback(server.app) as (ws_url, _http_url):
        yield RunningServer(server, ws_url)


# ---------------------------------------------------------------- LLM


class ScriptedLLM(llm.LLM):
    """Answers each chat with the next scripted reply, one word-token every ``token_s``."""

    def __init__(self, replies: list[str], *, token_s: float = 0.01, default: str = "Okay.") -> None:
        super().__init__()
        self._replies = deque(replies)
        self._token_s = token_s
        self._default = default
        self.prompts: list[str] = []  # the last user message of each chat

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: Any = NOT_GIVEN,
        tool_choice: Any = NOT_GIVEN,
        extra_kwargs: Any = NOT_GIVEN,
    ) -> llm.LLMStream:
        users = [m for m in chat_ctx.messages() if m.role == "user"]
        self.prompts.append((users[-1].text_content or "") if users else "")
        reply = self._replies.popleft() if self._replies else self._default
        return _ScriptedStream(
            self, reply, self._token_s, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options
        )


class _ScriptedStream(llm.LLMStream):
    def __init__(self, owner: ScriptedLLM, reply: str, token_s: float, **kwargs: Any) -> None:
        super().__init__(owner, **kwargs)
        self._reply = reply
        self._token_s = token_s

    async def _run(self) -> None:
        for token in re.findall(r"\S+\s*", self._reply):
            await asyncio.sleep(self._token_s)
            self._event_ch.send_nowait(
                llm.ChatChunk(id="scripted", delta=llm.ChoiceDelta(role="assistant", content=token))
            )


# ---------------------------------------------------------------- agent


class TaggingAgent(Agent):
    """Tags every frame of reply *n* with ``userdata[REPLY_TAG] = n`` (one tts_node call per reply)."""

    def __init__(self) -> None:
        super().__init__(instructions="You are a test agent.")
        self.replies = 0

    async def tts_node(self, text: AsyncIterable[str], model_settings: ModelSettings) -> AsyncIterator[rtc.AudioFrame]:
        reply = self.replies
        self.replies += 1
        async for frame in Agent.default.tts_node(self, text, model_settings):
            frame.userdata[REPLY_TAG] = reply
            yield frame


# ---------------------------------------------------------------- audio output


@dataclass(frozen=True)
class Captured:
    at: float  # time.monotonic()
    reply: int | None
    duration: float


class RecordingAudioOutput(io.AudioOutput):
    """Plays in (simulated) real time and records frames and clears.

    ``pause=False``: a sink that cannot pause makes VAD barge-in interrupt at once, instead of
    pausing for the false-interruption timeout first (what a room output does).
    """

    def __init__(self) -> None:
        super().__init__(label="test-sink", capabilities=io.AudioOutputCapabilities(pause=False), sample_rate=None)
        self.frames: list[Captured] = []
        self.clears: list[tuple[float, int | None]] = []  # (time, last reply captured before it)
        self._started_at: float | None = None
        self._pushed = 0.0
        self._interrupted = asyncio.Event()
        self._playout: asyncio.Task | None = None
        self._last_reply: int | None = None
        self._audio_changed = asyncio.Event()

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if self._started_at is None:
            self._started_at = time.monotonic()
            self.on_playback_started(created_at=time.time())
        self._pushed += frame.duration
        self._last_reply = frame.userdata.get(REPLY_TAG)
        self.frames.append(Captured(time.monotonic(), self._last_reply, frame.duration))
        self._audio_changed.set()

    def flush(self) -> None:
        super().flush()
        if self._started_at is None or (self._playout is not None and not self._playout.done()):
            return
        self._playout = asyncio.create_task(self._play_out())

    def clear_buffer(self) -> None:
        self.clears.append((time.monotonic(), self._last_reply))
        if self._started_at is not None:
            self._interrupted.set()

    async def _play_out(self) -> None:
        assert self._started_at is not None
        remaining = self._started_at + self._pushed - time.monotonic()
        try:
            await asyncio.wait_for(self._interrupted.wait(), max(0.0, remaining))
            interrupted = True
        except TimeoutError:
            interrupted = False
        played = min(self._pushed, time.monotonic() - self._started_at)
        self._started_at, self._pushed = None, 0.0
        self._interrupted.clear()
        self.on_playback_finished(playback_position=played, interrupted=interrupted)

    def audio_of(self, reply: int) -> float:
        return sum(f.duration for f in self.frames if f.reply == reply)

    async def wait_for_audio(self, reply: int, seconds: float, timeout: float = 20.0) -> None:
        """Until ``seconds`` of reply ``reply`` were captured."""
        async with asyncio.timeout(timeout):
            while self.audio_of(reply) < seconds:
                self._audio_changed.clear()
                await self._audio_changed.wait()


# ---------------------------------------------------------------- audio input


class MicInput(io.AudioInput):
    """A microphone in real time: 20 ms frames of silence, or of speech queued with ``say``."""

    def __init__(self, sample_rate: int = 16000) -> None:
        super().__init__(label="test-mic")
        self.sample_rate = sample_rate
        self._hop = sample_rate // 50
        self._queued = np.zeros(0, dtype=np.int16)
        self._next: float | None = None
        self.speech_started_at: float | None = None

    def say(self, pcm: np.ndarray) -> None:
        self._queued = np.concatenate([self._queued, pcm.astype(np.int16)])
        self.speech_started_at = None

    @property
    def speaking(self) -> bool:
        return self._queued.size > 0

    async def __anext__(self) -> rtc.AudioFrame:
        loop = asyncio.get_running_loop()
        if self._next is None:
            self._next = loop.time()
        self._next += self._hop / self.sample_rate
        await asyncio.sleep(max(0.0, self._next - loop.time()))
        chunk, self._queued = self._queued[: self._hop], self._queued[self._hop :]
        if chunk.size and self.speech_started_at is None:
            self.speech_started_at = time.monotonic()
        if chunk.size < self._hop:
            chunk = np.concatenate([chunk, np.zeros(self._hop - chunk.size, dtype=np.int16)])
        return rtc.AudioFrame(chunk.tobytes(), self.sample_rate, 1, self._hop)


# ---------------------------------------------------------------- a session's turns


async def run_turns(session: Any, sink: RecordingAudioOutput, plan: list[bool], *, heard_s: float = 0.6) -> None:
    """One user turn per entry of ``plan`` (``question N``); True: ``session.interrupt()`` once
    that reply has played ``heard_s`` seconds."""
    for turn, interrupt in enumerate(plan):
        run = session.run(user_input=f"question {turn}")
        if interrupt:
            await sink.wait_for_audio(turn, heard_s)
            await asyncio.wait_for(session.interrupt(), 5.0)
        await asyncio.wait_for(run, 20.0)


def check_replies(sink: RecordingAudioOutput, plan: list[bool], *, heard_s: float = 0.6, what: str = "") -> None:
    """Each reply heard (an interrupted one from ``heard_s`` up to its cut), and no frame of an
    interrupted reply reached the sink after its ``clear_buffer()``."""
    for turn, interrupt in enumerate(plan):
        heard = sink.audio_of(turn)
        if not interrupt:
            assert heard > 1.0, (what, turn, heard)
            continue
        assert heard_s <= heard < 6.0, (what, turn, heard)
        cleared_at = min(t for t, reply in sink.clears if reply == turn)
        late = [f for f in sink.frames if f.reply == turn and f.at > cleared_at]
        assert not late, f"{what} reply {turn}: {len(late)} frames after clear_buffer()"


# ---------------------------------------------------------------- a loudspeaker in a room


class Loudspeaker(io.AudioOutput):
    """A room output's stand-in that plays sample by sample in real time, and can pause (as a room
    output does): :meth:`take_played` hands over exactly what it played since the last call, with
    the time each piece started playing, so an :class:`EchoMic` can put it back in the caller's
    microphone where a loudspeaker would.

    Records ``pauses``, ``resumes`` and ``clears`` (monotonic times) and each segment's
    ``finished`` (position s, interrupted).
    """

    def __init__(self, sample_rate: int = 24000) -> None:
        super().__init__(
            label="loudspeaker", capabilities=io.AudioOutputCapabilities(pause=True), sample_rate=sample_rate
        )
        self.rate = sample_rate
        self.pauses: list[float] = []
        self.resumes: list[float] = []
        self.clears: list[float] = []
        self.finished: list[tuple[float, bool]] = []
        self.played_s = 0.0  # every finished segment's audio heard, in all
        self._buf = np.zeros(0, np.int16)  # this segment's audio
        self._pos = 0  # samples of it played before ``_run_from``
        self._taken = 0  # samples of it handed to take_played()
        self._run_from: float | None = None  # playing since (None: paused or idle)
        self._runs: list[tuple[float, int]] = []  # (monotonic time, sample index) each run of it began at
        self._started = self._paused = self._flushed = self._interrupted = False
        self._unclaimed: list[tuple[float, np.ndarray]] = []  # played by a finished segment, not taken yet
        self._changed = asyncio.Event()
        self._playout: asyncio.Task | None = None

    def _position(self) -> int:
        run = 0 if self._run_from is None else int((time.monotonic() - self._run_from) * self.rate)
        return min(len(self._buf), self._pos + run)

    @property
    def position_s(self) -> float:
        """Seconds heard so far, this segment included."""
        return self.played_s + (self._position() / self.rate if self._started else 0.0)

    def _pieces(self, a: int, b: int) -> list[tuple[float, np.ndarray]]:
        """Samples [a, b) of this segment, split by run, each with the time its first sample played."""
        out = []
        for k, (t, start) in enumerate(self._runs):
            end = self._runs[k + 1][1] if k + 1 < len(self._runs) else b
            lo, hi = max(a, start), min(b, end)
            if hi > lo:
                out.append((t + (lo - start) / self.rate, self._buf[lo:hi]))
        return out

    def take_played(self) -> list[tuple[float, np.ndarray]]:
        """(monotonic time it started playing, int16 samples) of what played since the last call."""
        out, self._unclaimed = self._unclaimed, []
        if self._started:
            now = self._position()
            out += self._pieces(self._taken, now)
            self._taken = max(self._taken, now)
        return out

    @property
    def speaking(self) -> bool:
        return self._started and not self._paused

    def _begin_run(self) -> None:
        self._run_from = time.monotonic()
        self._runs.append((self._run_from, self._pos))

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        assert frame.sample_rate == self.rate and frame.num_channels == 1, (frame.sample_rate, frame.num_channels)
        if not self._started:
            self._started, self._flushed = True, False
            self._buf, self._pos, self._taken, self._runs, self._run_from = np.zeros(0, np.int16), 0, 0, [], None
            if not self._paused:
                self._begin_run()
            self.on_playback_started(created_at=time.time())
        elif self._run_from is not None and self._position() >= len(self._buf):
            # it ran dry (the TTS fell behind): silence was played meanwhile, and this plays from now
            self._pos = len(self._buf)
            self._begin_run()
        self._buf = np.concatenate([self._buf, np.frombuffer(frame.data, np.int16)])
        self._changed.set()

    def flush(self) -> None:
        super().flush()
        if self._started and (self._playout is None or self._playout.done()):
            self._flushed = True
            self._playout = asyncio.create_task(self._play_out())

    def pause(self) -> None:
        super().pause()
        if not self._paused:
            self._pos, self._run_from, self._paused = self._position(), None, True
            self.pauses.append(time.monotonic())
            self._changed.set()

    def resume(self) -> None:
        super().resume()
        if self._paused:
            self._paused = False
            if self._started:
                self._begin_run()
            self.resumes.append(time.monotonic())
            self._changed.set()

    def clear_buffer(self) -> None:
        self.clears.append(time.monotonic())
        if self._started:
            self._interrupted = True
            if not self._flushed:  # a clear before the flush ends the segment too
                self.flush()
            self._changed.set()

    async def _play_out(self) -> None:
        while not self._interrupted and self._position() < len(self._buf):
            self._changed.clear()
            left = None if self._paused else (len(self._buf) - self._position()) / self.rate
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
        played = self._position()
        self._unclaimed += self._pieces(self._taken, played)
        self._taken = played
        interrupted = self._interrupted
        self.finished.append((played / self.rate, interrupted))
        self.played_s += played / self.rate
        self._started = self._interrupted = False
        self._run_from = None
        self.on_playback_finished(playback_position=played / self.rate, interrupted=interrupted)


class EchoMic(MicInput):
    """:class:`MicInput` plus the loudspeaker's sound through ``echo`` (a ``support.echo_path.EchoPath``
    at the mic's rate): what a caller on speakers sends, with the caller's own speech on cue.

    What the loudspeaker played goes on the microphone's own sample timeline by the time it played,
    so a busy event loop that delivers mic frames late and in bursts (as a network does) does not
    move the echo within them: the echo's delay stays the path's.
    """

    def __init__(self, speaker: Loudspeaker, echo: Any, sample_rate: int = 24000) -> None:
        super().__init__(sample_rate)
        self.speaker, self.echo = speaker, echo
        self._t0: float | None = None  # monotonic time of the mic's sample 0

    async def __anext__(self) -> rtc.AudioFrame:
        frame = await super().__anext__()
        if self._t0 is None:
            assert self._next is not None
            self._t0 = self._next - self._hop / self.sample_rate  # loop.time() is time.monotonic()
        for t, pcm in self.speaker.take_played():
            self.echo.push(pcm, at_sample=round((t - self._t0) * self.sample_rate))
        mixed = np.frombuffer(frame.data, np.int16).astype(np.float32) / 32768.0 + self.echo.pull(self._hop)
        pcm = (np.clip(mixed, -1.0, 1.0) * 32767).astype(np.int16)
        return rtc.AudioFrame(pcm.tobytes(), self.sample_rate, 1, self._hop)
